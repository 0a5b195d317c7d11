"""Host evidence `denpex run` gathers for its own job without any agent (DESIGN §4).

The kernel-log records that appear during the run and the OOM kills of the memory cgroup
the job inherits from denpex, read through the node agent's own readers (`host/kmsg.py`,
`host/cgroup.py`) and `Roots`, so both see the same records and count lost ones the same way
(by sequence number). Every record is marked "job" or "host" (`attribution`) from what the
wrapper knows of its job. Never blocks: the kernel log is read non-blocking, a cgroup poll
is a handful of small files.
"""

from __future__ import annotations

import os
import re
import time

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.cgroup import CgroupCollector
from denpex.host.kmsg import KmsgCollector
from denpex.lite.job_processes import JobProcesses
from denpex.lite.prefixes import ParsedLine

CGROUP_POLL_S = 1.0  # how often the cgroup counters are read while the job runs
HOST_SOURCES = ("kmsg", "cgroup")  # the sources whose records carry an attribution
# the OOM killer's report opens with "<comm> invoked oom-killer: …", which names no pid; the
# record after it, "CPU: 1 [UID: 0 ]PID: 4242 Comm: python …", names the allocating task
_OOM_HEADER = b" invoked oom-killer: "
_TASK_LINE = re.compile(rb"^CPU: \d{1,5} (?:UID: \d{1,10} )?PID: (\d{1,10}) Comm: ")


def kmsg_unavailable(roots: Roots) -> str | None:
    """Why the kernel log cannot be read here (the collector's own words), or None."""
    ok, why = KmsgCollector(roots).available()
    return None if ok else f"kernel log not readable: {why}"


def memory_cgroup_of(roots: Roots, pid: int) -> str | None:
    """The memory cgroup path of a process as the cgroup collector locates it, or None."""
    found = CgroupCollector(roots).locate(Registration(pid=pid))
    return found[0] if found is not None else None


class RunHostWatch:
    """The host evidence of one `denpex run`, set up before the job starts so that nothing
    it triggers is missed: the kernel log read from this point on, and the OOM-kill count of
    the memory cgroup the job will inherit from denpex."""

    def __init__(self, roots: Roots | None = None, *, host: str = "") -> None:
        self.started_ns = time.time_ns()  # before the job: where the agent's evidence starts
        self.roots = roots or Roots()
        self.host = host
        self.notes: list[str] = []
        self.kmsg: KmsgCollector | None = None
        self._oom_header: ParsedLine | None = None
        reason = kmsg_unavailable(self.roots)
        if reason is None:
            self.kmsg = KmsgCollector(self.roots)
            self.kmsg.collect(self._context())  # opens at the end of the ring: records from now on
            if self.kmsg.fd is None:
                reason, self.kmsg = "kernel log not readable (open failed)", None
        if reason is not None:
            self.notes.append(reason)
        self._job = Registration(pid=os.getpid())
        self.cgroup: CgroupCollector | None = CgroupCollector(self.roots)
        located = self.cgroup.locate(self._job)
        self.memcg: str | None = located[0] if located is not None else None
        if located is None:
            self.notes.append("no memory cgroup found: OOM kills of the job cannot be counted")
            self.cgroup = None
        self.cgroup_evidence: list[Evidence] = []
        self._last_cgroup_poll = 0.0
        self.poll_cgroup()  # the baseline: kills before the run are not the job's

    def _context(self, jobs: tuple[Registration, ...] = ()) -> CollectContext:
        return CollectContext(self.roots, self.host, jobs)

    @property
    def lost_records(self) -> int:
        """Kernel-log records the ring overwrote before they were read (by sequence number)."""
        return self.kmsg.tracker.lost if self.kmsg is not None else 0

    def kernel_records(self) -> list[ParsedLine]:
        """The kernel-log records available now, as lines for the scanner (non-blocking)."""
        if self.kmsg is None:
            return []
        lines: list[ParsedLine] = []
        for event in self.kmsg.collect(self._context()):
            if not isinstance(event, Event) or event.kind != "line":
                continue  # the collector's metrics and lost-record notes
            attrs = {k: v for k, v in event.attrs.items() if k != "event_id"}
            lines.append(
                ParsedLine(
                    body=event.body.encode("utf-8", "replace"),
                    ts_ns=event.ts_ns,
                    pid=event.pid,
                    source="kmsg",
                    attrs=attrs,
                )
            )
            self._allocator_pid(lines[-1])
        return lines

    def _allocator_pid(self, line: ParsedLine) -> None:
        """Give an OOM report's first record the pid the record after it names."""
        if _OOM_HEADER in line.body and line.pid is None:
            self._oom_header = line
            return
        header = self._oom_header
        if header is not None:
            found = _TASK_LINE.match(line.body)
            if found:
                header.pid = int(found.group(1))
            self._oom_header = None

    def poll_cgroup(self, *, force: bool = False) -> None:
        """Read the job's cgroup counters (at most every CGROUP_POLL_S unless forced); an OOM
        kill since the previous read becomes evidence, stamped with the time it was seen."""
        now = time.monotonic()
        if self.cgroup is None or (not force and now - self._last_cgroup_poll < CGROUP_POLL_S):
            return
        self._last_cgroup_poll = now
        for item in self.cgroup.collect(self._context((self._job,))):
            if isinstance(item, Evidence):
                self.cgroup_evidence.append(item)

    def close(self) -> None:
        if self.kmsg is not None:
            self.kmsg.close()


def attribution(event: Event, job: JobProcesses, memcg: str | None) -> str:
    """ "job" when a host record is provably about this job — its subject pid is one of the
    job's processes (alive or remembered), its memory cgroup is the job's own (not the root),
    or it names a GPU the job holds — else "host" (contract: host evidence is context)."""
    if event.source == "cgroup":
        # the counters of the job's own cgroup; the root cgroup is everybody's
        return "job" if memcg not in (None, "/") else "host"
    if event.pid is not None and job.knows(event.pid):
        return "job"
    record_memcg = event.attrs.get("cgroup")
    if isinstance(record_memcg, str) and memcg is not None and memcg != "/":
        inside = f"{memcg.rstrip('/')}/"
        if record_memcg == memcg or record_memcg.startswith(inside):
            return "job"
    pci = job.gpu_named_in(event.body)
    if pci is not None and pci in job.gpus_held():
        return "job"
    return "host"
