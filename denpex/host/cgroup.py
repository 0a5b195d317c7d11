"""Memory, CPU-throttling and pids accounting of the watched jobs' cgroups (v1 and v2).

Reads a handful of small files per job per poll; never writes to a cgroup and never raises
when a job or its cgroup vanishes. OOM kills are found from the kernel's per-cgroup counter
(`oom_kill`), compared with the previous poll: the first poll of a cgroup is the baseline.

"Near the limit" uses the working set (usage minus inactive file cache, as the kubelet does):
page cache counts against the limit but is reclaimed before any OOM kill, so raw usage
near the limit is normal for a job that reads its data set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation, poll_finding
from denpex.core.events import metric
from denpex.core.roots import Roots, read_text
from denpex.core.wire import Registration
from denpex.host.base import HostCollector
from denpex.host.procfs import (
    attribute,
    job_cgroup,
    parse_int_fields,
    parse_limit_value,
)

HELP = {
    "cgroup_memory_usage_bytes": "Memory charged to the job's cgroup, page cache included",
    "cgroup_memory_working_set_bytes": "Usage minus inactive file cache (what an OOM kill sees)",
    "cgroup_memory_limit_bytes": "The cgroup's memory limit (absent when unlimited)",
    "cgroup_memory_peak_bytes": "Highest memory usage recorded for the cgroup",
    "cgroup_memory_under_oom": "1 while the v1 cgroup is in an OOM condition",
    "cgroup_oom_kills_total": "Processes the OOM killer killed in the cgroup",
    "cgroup_oom_events_total": "Times the cgroup hit its limit and the OOM killer was invoked",
    "cgroup_memory_limit_hits_total": "Times usage hit the limit (v1 failcnt, v2 events max)",
    "cgroup_memory_high_events_total": "Times usage went over memory.high (v2)",
    "cgroup_cpu_throttled_periods_total": "CFS periods in which the cgroup was throttled",
    "cgroup_cpu_throttled_seconds_total": "Time the cgroup's tasks were throttled by its quota",
    "cgroup_pids": "Processes and threads in the cgroup",
    "cgroup_pids_limit": "The cgroup's pids.max (absent when unlimited)",
}


@dataclass(slots=True)
class CgroupSample:
    """One poll of one cgroup, whatever the layout; None where the file is absent."""

    usage: int | None = None
    limit: int | None = None
    peak: int | None = None
    inactive_file: int = 0
    oom_kill: int | None = None
    oom: int | None = None
    under_oom: int | None = None
    limit_hits: int | None = None
    high: int | None = None
    throttled_periods: int | None = None
    throttled_s: float | None = None
    pids: int | None = None
    pids_limit: int | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def working_set(self) -> int | None:
        return None if self.usage is None else max(0, self.usage - self.inactive_file)


def _int(text: str | None) -> int | None:
    return int(text.strip()) if text and text.strip().isdigit() else None


def sample_v2(folder: Path) -> CgroupSample:
    """A v2 cgroup folder: memory.*, cpu.stat, pids.*."""
    s = CgroupSample()
    s.usage = _int(read_text(folder / "memory.current"))
    s.limit = parse_limit_value(read_text(folder / "memory.max"))
    s.peak = _int(read_text(folder / "memory.peak"))
    s.inactive_file = parse_int_fields(read_text(folder / "memory.stat") or "").get(
        "inactive_file", 0
    )
    events = parse_int_fields(read_text(folder / "memory.events") or "")
    s.oom_kill, s.oom = events.get("oom_kill"), events.get("oom")
    s.limit_hits, s.high = events.get("max"), events.get("high")
    cpu = parse_int_fields(read_text(folder / "cpu.stat") or "")
    s.throttled_periods = cpu.get("nr_throttled")
    if "throttled_usec" in cpu:
        s.throttled_s = cpu["throttled_usec"] / 1e6
    s.pids = _int(read_text(folder / "pids.current"))
    s.pids_limit = parse_limit_value(read_text(folder / "pids.max"))
    return s


def sample_v1(memory: Path | None, cpu: Path | None, pids: Path | None) -> CgroupSample:
    """v1 controller folders of one job (any may be None)."""
    s = CgroupSample()
    if memory is not None:
        s.usage = _int(read_text(memory / "memory.usage_in_bytes"))
        s.limit = parse_limit_value(read_text(memory / "memory.limit_in_bytes"))
        s.peak = _int(read_text(memory / "memory.max_usage_in_bytes"))
        stat = parse_int_fields(read_text(memory / "memory.stat") or "")
        s.inactive_file = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        oom = parse_int_fields(read_text(memory / "memory.oom_control") or "")
        s.oom_kill, s.under_oom = oom.get("oom_kill"), oom.get("under_oom")
        s.limit_hits = _int(read_text(memory / "memory.failcnt"))
    if cpu is not None:
        stat = parse_int_fields(read_text(cpu / "cpu.stat") or "")
        s.throttled_periods = stat.get("nr_throttled")
        if "throttled_time" in stat:
            s.throttled_s = stat["throttled_time"] / 1e9
    if pids is not None:
        s.pids = _int(read_text(pids / "pids.current"))
        s.pids_limit = parse_limit_value(read_text(pids / "pids.max"))
    return s


def memory_near_limit(sample: CgroupSample, ratio: float) -> bool:
    ws = sample.working_set
    return ws is not None and sample.limit is not None and ws >= ratio * sample.limit


def pids_near_limit(sample: CgroupSample, ratio: float) -> bool:
    return (
        sample.pids is not None
        and sample.pids_limit is not None
        and sample.pids >= ratio * sample.pids_limit
    )


class CgroupCollector(HostCollector):
    name = "cgroup"
    stability = "stable"
    default_interval_s = 10.0
    default_budget_s = 1.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._oom_kills: dict[str, int] = {}  # cgroup folder → oom_kill at the previous poll

    def available(self) -> tuple[bool, str]:
        base = self.roots.cgroup()
        if (base / "cgroup.controllers").exists():
            return True, f"cgroup v2 at {base}"
        if (base / "memory").is_dir():
            return True, f"cgroup v1 controllers under {base}"
        return False, f"no cgroup v2 or v1 memory controller mounted at {base}"

    def locate(self, job: Registration) -> tuple[str, CgroupSample] | None:
        """The job's cgroup path (label) and a sample of it; None when none is found."""
        roots = self.roots
        if (roots.cgroup("cgroup.controllers")).exists():
            path = job_cgroup(roots, job, "")
            folder = roots.cgroup(path) if path else None
            if folder is None or not folder.is_dir():
                return None
            return path or "/", sample_v2(folder)

        def v1(controller: str, *folders: str) -> tuple[str | None, Path | None]:
            path = job_cgroup(roots, job, controller)
            for name in folders:
                folder = roots.cgroup(name, path) if path else None
                if folder is not None and folder.is_dir():
                    return path, folder
            return path, None

        mem_path, memory = v1("memory", "memory")
        _, cpu = v1("cpu", "cpu", "cpu,cpuacct", "cpuacct,cpu")
        _, pids = v1("pids", "pids")
        if memory is None and cpu is None and pids is None:
            return None
        return mem_path or "/", sample_v1(memory, cpu, pids)

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        for job in ctx.jobs:
            found = self.locate(job)
            if found is not None:
                out += self._observe(ctx, job, *found)
        return out

    def _observe(
        self, ctx: CollectContext, job: Registration, path: str, s: CgroupSample
    ) -> list[Observation]:
        labels = {"job": job.job or "", "cgroup": path}
        values: list[tuple[str, float | None, bool]] = [
            ("cgroup_memory_usage_bytes", s.usage, False),
            ("cgroup_memory_working_set_bytes", s.working_set, False),
            ("cgroup_memory_limit_bytes", s.limit, False),
            ("cgroup_memory_peak_bytes", s.peak, False),
            ("cgroup_memory_under_oom", s.under_oom, False),
            ("cgroup_oom_kills_total", s.oom_kill, True),
            ("cgroup_oom_events_total", s.oom, True),
            ("cgroup_memory_limit_hits_total", s.limit_hits, True),
            ("cgroup_memory_high_events_total", s.high, True),
            ("cgroup_cpu_throttled_periods_total", s.throttled_periods, True),
            ("cgroup_cpu_throttled_seconds_total", s.throttled_s, True),
            ("cgroup_pids", s.pids, False),
            ("cgroup_pids_limit", s.pids_limit, False),
        ]
        out: list[Observation] = []
        for name, value, counter in values:
            if value is not None:
                event = metric(
                    name,
                    value,
                    source="cgroup",
                    counter=counter,
                    labels=labels,
                    host=ctx.host,
                    ts_ns=ctx.now_ns,
                    pid=job.pid,
                )
                out.append(attribute(event, job))
        out += self._oom_kill_detector(ctx, job, path, s)
        ratio = float(self.options.get("memory_usage_ratio", 0.95))
        if self.edges.rising((path, "memory"), memory_near_limit(s, ratio)):
            pct = (s.working_set or 0) / (s.limit or 1)
            captures = {
                "working_set_bytes": str(s.working_set),
                "limit_bytes": str(s.limit),
                "ratio": f"{pct:.3f}",
            }
            out.append(
                self._evidence(
                    ctx, job, path, "host.oom_killed.memory_near_limit", captures, {"pct": pct}
                )
            )
        ratio = float(self.options.get("pids_ratio", 0.9))
        if self.edges.rising((path, "pids"), pids_near_limit(s, ratio)):
            captures = {"pids": str(s.pids), "pids_max": str(s.pids_limit)}
            out.append(
                self._evidence(ctx, job, path, "host.fd_exhausted.pids_near_limit", captures)
            )
        return out

    def _oom_kill_detector(
        self, ctx: CollectContext, job: Registration, path: str, s: CgroupSample
    ) -> list[Observation]:
        if s.oom_kill is None:
            return []
        before = self._oom_kills.get(path)
        self._oom_kills[path] = s.oom_kill
        if before is None or s.oom_kill <= before:
            return []
        count = s.oom_kill - before
        captures = {
            "count": str(count),
            "oom_kill_total": str(s.oom_kill),
            "limit_bytes": str(s.limit) if s.limit is not None else "",
        }
        return [self._evidence(ctx, job, path, "host.oom_killed.cgroup_oom_kill", captures)]

    def _evidence(
        self,
        ctx: CollectContext,
        job: Registration,
        path: str,
        detector_id: str,
        captures: dict[str, str],
        values: dict[str, Any] | None = None,
    ) -> Observation:
        evidence = poll_finding(
            ctx,
            "cgroup",
            detector_id,
            pid=job.pid,
            attrs={"cgroup": path},
            captures={"cgroup": path, **captures},
            values=values,
        )
        attribute(evidence.event, job)
        return evidence
