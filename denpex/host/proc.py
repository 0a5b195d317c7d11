"""The process trees of the watched jobs: size, threads, states and open files per job.

Walks each registered pid's descendants through `Roots` every poll; a process that exits
mid-walk is skipped, never an error. Never signals, traces or otherwise touches a process.

A process in D state (uninterruptible sleep) for two consecutive polls is reported as
`host.kernel_fault`: it is the early form of the kernel's "task blocked for more than 120
seconds" hung-task report, which the taxonomy files there. The wait channel (`wchan`) is
captured because it names where the task is stuck (an NFS or Lustre wait points at
storage, an `nv*` symbol at the GPU driver); the category does not guess between them.
Zombies hold pid slots until their parent reaps them, so many of them use up `pids.max`:
`host.fd_exhausted` ("resource limits"), the parent's fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import metric
from denpex.core.roots import Roots, read_text
from denpex.core.wire import Registration
from denpex.host.base import HostCollector
from denpex.host.procfs import (
    attribute,
    parse_kb,
    parse_open_files_limit,
    read_status,
    resolve_job_pids,
)

__all__ = ["ProcCollector", "ProcessSample", "resolve_job_pids", "sample_process"]

HELP = {
    "proc_processes": "Processes in the job's tree",
    "proc_rss_bytes": "Resident memory of the job's processes, summed",
    "proc_threads": "Threads of the job's processes, summed",
    "proc_dstate_processes": "Job processes in uninterruptible sleep (D state)",
    "proc_zombie_processes": "Job processes that exited and were not reaped (Z state)",
    "proc_open_fds": "Open file descriptors of the job's processes, summed",
    "proc_open_fds_limit_ratio": "Highest open-fds / soft RLIMIT_NOFILE over the job's processes",
}


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    name: str
    state: str  # one letter: R S D Z T I …
    threads: int
    rss_bytes: int
    open_fds: int | None  # None when /proc/<pid>/fd is not readable
    fd_limit: int | None  # soft "Max open files"; None when unlimited or unknown


def sample_process(roots: Roots, pid: int) -> ProcessSample | None:
    """One process, or None when it has gone."""
    status = read_status(roots, pid)
    if status is None:
        return None
    try:
        open_fds: int | None = len(os.listdir(roots.proc(pid, "fd")))
    except OSError:
        open_fds = None
    threads = status.get("Threads", "0")
    return ProcessSample(
        pid=pid,
        name=status.get("Name", ""),
        state=status.get("State", "?")[:1],
        threads=int(threads) if threads.isdigit() else 0,
        rss_bytes=parse_kb(status.get("VmRSS")) or 0,
        open_fds=open_fds,
        fd_limit=parse_open_files_limit(read_text(roots.proc(pid, "limits")) or ""),
    )


def fd_ratio(sample: ProcessSample) -> float | None:
    if sample.open_fds is None or not sample.fd_limit:
        return None
    return sample.open_fds / sample.fd_limit


class ProcCollector(HostCollector):
    name = "proc"
    stability = "stable"
    default_interval_s = 15.0
    default_budget_s = 2.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._dstate_before: set[int] = set()

    def available(self) -> tuple[bool, str]:
        if not self.roots.proc("self", "status").exists():
            return False, f"{self.roots.proc()} is not a mounted procfs"
        return True, f"process trees of registered jobs under {self.roots.proc()}"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        dstate_now: set[int] = set()
        seen: set[int] = set()
        for job in ctx.jobs:
            samples = [
                s
                for pid in resolve_job_pids(ctx.roots, pid=job.pid)
                if (s := sample_process(ctx.roots, pid)) is not None
            ]
            seen.update(s.pid for s in samples)
            out += self._observe(ctx, job, samples, dstate_now)
        self._dstate_before = dstate_now
        # forget per-process latches of processes that are gone
        self.edges.retain(lambda key: key[1] == "zombies" or key[0] in seen)
        return out

    def _observe(
        self,
        ctx: CollectContext,
        job: Registration,
        samples: list[ProcessSample],
        dstate_now: set[int],
    ) -> list[Observation]:
        labels = {"job": job.job or str(job.pid)}
        ratios = [r for s in samples if (r := fd_ratio(s)) is not None]
        zombies = [s for s in samples if s.state == "Z"]
        values: dict[str, float] = {
            "proc_processes": len(samples),
            "proc_rss_bytes": sum(s.rss_bytes for s in samples),
            "proc_threads": sum(s.threads for s in samples),
            "proc_dstate_processes": sum(s.state == "D" for s in samples),
            "proc_zombie_processes": len(zombies),
            "proc_open_fds": sum(s.open_fds or 0 for s in samples),
        }
        if ratios:
            values["proc_open_fds_limit_ratio"] = max(ratios)
        out: list[Observation] = []
        for name, value in values.items():
            event = metric(
                name,
                value,
                source="proc",
                labels=labels,
                host=ctx.host,
                ts_ns=ctx.now_ns,
                pid=job.pid,
            )
            out.append(attribute(event, job))
        for s in samples:
            if s.state != "D":
                self.edges.clear((s.pid, "dstate"))
                continue
            dstate_now.add(s.pid)
            if s.pid in self._dstate_before and self.edges.first((s.pid, "dstate")):
                wchan = (read_text(ctx.roots.proc(s.pid, "wchan")) or "").strip() or "?"
                captures = {"pid": str(s.pid), "name": s.name, "wchan": wchan}
                out.append(
                    self._evidence(ctx, job, s.pid, "host.kernel_fault.process_dstate", captures)
                )
        limit = int(self.options.get("zombie_max", 10))
        if self.edges.rising((labels["job"], "zombies"), len(zombies) > limit):
            captures = {"count": str(len(zombies)), "threshold": str(limit)}
            out.append(self._evidence(ctx, job, job.pid, "host.fd_exhausted.zombies", captures))
        ratio = float(self.options.get("fd_ratio", 0.9))
        for s in samples:
            r = fd_ratio(s)
            if self.edges.rising((s.pid, "fds"), r is not None and r >= ratio):
                captures = {
                    "pid": str(s.pid),
                    "name": s.name,
                    "open_fds": str(s.open_fds),
                    "limit": str(s.fd_limit),
                }
                out.append(
                    self._evidence(
                        ctx, job, s.pid, "host.fd_exhausted.open_files_near_limit", captures
                    )
                )
        return out

    def _evidence(
        self,
        ctx: CollectContext,
        job: Registration,
        pid: int,
        detector_id: str,
        captures: dict[str, str],
    ) -> Observation:
        job_name = job.job or str(job.pid)
        evidence = self.finding(
            ctx, detector_id, pid=pid, captures=captures, values={"job": job_name}
        )
        attribute(evidence.event, job)
        return evidence
