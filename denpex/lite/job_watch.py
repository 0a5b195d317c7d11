"""Everything `denpex run` watches beside its job's output, ticked from the analyzer process.

The job's process tree and ranks (job_processes), the kernel log and memory cgroup
(hostwatch, through the collectors' readers), the ranks' main threads (hang_watch). At the
end it marks every host record "job" or "host" and names a straggler after a collective
timeout. Bounded work per tick (a few /proc reads per process); it never touches the job.
"""

from __future__ import annotations

import time

from denpex.core.events import Evidence
from denpex.core.roots import Roots
from denpex.lite.hang_watch import HangWatch
from denpex.lite.hostwatch import HOST_SOURCES, RunHostWatch, attribution
from denpex.lite.job_processes import JobProcesses
from denpex.lite.scanner import Scanner

TREE_POLL_S = 0.5  # how often the process tree is walked for new processes


class JobWatch:
    def __init__(
        self,
        scanner: Scanner,
        host_watch: RunHostWatch | None,
        child_pid: int | None,
        roots: Roots | None = None,
    ) -> None:
        self.scanner = scanner
        self.host_watch = host_watch
        self.roots = roots or (host_watch.roots if host_watch else Roots())
        self.processes: JobProcesses | None = None
        if child_pid:
            self.processes = JobProcesses(self.roots, child_pid, scanner.note_process)
        self.hangs = HangWatch(self.roots, host=scanner.default_host)
        self._sample_every = float(self.hangs.settings["sample_interval_s"])
        self._last_tree = self._last_sample = 0.0
        self._seen_evidence = 0
        self.first_failure: float | None = None  # monotonic time the first failure was read
        self.ticks = 0
        self.tick_seconds = 0.0

    def tick(self) -> None:
        started = time.perf_counter()
        now = time.monotonic()
        procs = self.processes
        if procs is not None and now - self._last_tree >= TREE_POLL_S:
            self._last_tree = now
            procs.poll()
        if procs is not None and now - self._last_sample >= self._sample_every:
            self._last_sample = now
            self.hangs.sample(procs.rank_processes())
        self.read_host()
        self._watch_failures(now)
        self.ticks += 1
        self.tick_seconds += time.perf_counter() - started

    def read_host(self, *, final: bool = False) -> None:
        watch = self.host_watch
        if watch is None:
            return
        records = watch.kernel_records()
        if records:
            state = self.scanner.stream("kmsg", host=self.scanner.default_host, source="kmsg")
            for record in records:
                if record.pid is not None and self.processes is not None:
                    self.processes.knows(record.pid)  # a process not seen yet is looked up now
                self.scanner.add_parsed(state, record)
        watch.poll_cgroup(force=final)

    def _watch_failures(self, now: float) -> None:
        """The first failure in the output: the moment the ranks' states are judged; the
        stacks of ranks blocked then are taken while they still live."""
        if self.first_failure is not None:
            return
        evidence = self.scanner.evidence
        fresh = evidence[self._seen_evidence :]
        self._seen_evidence = len(evidence)
        if any(e.is_failure and e.event.source != "kmsg" for e in fresh):
            self.first_failure = now
            if self.hangs.blocked_at(now):
                self.hangs.take_stacks(now)

    def finish(self, numbered_from: int) -> tuple[list[Evidence], list[str], dict[str, int]]:
        """(evidence to add, notes, stats) once the job ended; marks the attribution of every
        host record among the scanner's evidence and the new evidence."""
        self.read_host(final=True)
        watch = self.host_watch
        found: list[Evidence] = []
        notes: list[str] = []
        if watch is not None:
            found.extend(watch.cgroup_evidence)
            watch.close()
            if watch.lost_records:
                notes.append(
                    f"{watch.lost_records} kernel-log record(s) were overwritten before denpex "
                    "read them"
                )
        found.extend(self.hangs.findings(self.scanner.evidence, self.first_failure))
        if self.hangs.stack_note and any(e.category == "train.hang" for e in found):
            notes.append(self.hangs.stack_note)
        for offset, item in enumerate(found, start=1):
            item.id = f"e{numbered_from + offset}"
        procs = self.processes
        if procs is not None:
            memcg = watch.memcg if watch is not None else None
            for item in [*self.scanner.evidence, *found]:
                event = item.event
                if event.source in HOST_SOURCES:
                    event.attrs["attribution"] = attribution(event, procs, memcg)
                    if event.rank is None and event.pid is not None:
                        event.rank = procs.rank_of(event.pid)
        stats = {
            "job_processes": len(procs.processes) if procs is not None else 0,
            "rank_samples": self.hangs.samples,
            "rank_sample_us": int(self.hangs.sample_seconds * 1e6),
            "watch_ticks": self.ticks,
            "watch_us": int(self.tick_seconds * 1e6),
        }
        return found, notes, stats
