"""Pressure stall information: system-wide /proc/pressure and each watched job's v2 cgroup.

Reads a few small files per poll and never blocks; warns on sustained stalls but never
reports an error on its own (pressure is a symptom, the cause is elsewhere). cgroup v1 has
no per-cgroup PSI: such jobs get system-wide values only, said once in a state event.

Detector categories: memory "full" pressure means every runnable task of the scope waited
on reclaim or swap-in; sustained, it is the thrashing that precedes an OOM kill, so it is
reported as a `host.oom_killed` *warning* (never a root cause by itself, but it lets the
diagnosis tie a later OOM kill, or a slowdown without one, to memory). CPU and I/O
pressure starve a rank's threads and make that rank slow: `train.straggler`, warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from denpex.core.collector import CollectContext, Observation, poll_finding
from denpex.core.events import Event, metric
from denpex.core.roots import read_text
from denpex.core.wire import Registration
from denpex.host.base import HostCollector
from denpex.host.procfs import attribute, job_cgroup

RESOURCES = ("cpu", "memory", "io")
WINDOWS = ("avg10", "avg60", "avg300")

# resource -> (line kind the detector watches, threshold option, detector id)
DETECTORS = {
    "memory": ("full", "memory_full_avg10", "host.oom_killed.memory_pressure"),
    "cpu": ("some", "cpu_some_avg10", "train.straggler.cpu_pressure"),
    "io": ("full", "io_full_avg10", "train.straggler.io_pressure"),
}


@dataclass(frozen=True, slots=True)
class PsiLine:
    avg10: float  # ratios 0..1 (the file gives percent)
    avg60: float
    avg300: float
    total_s: float  # cumulative stall time


def parse_psi(text: str) -> dict[str, PsiLine]:
    """A pressure file (`some avg10=1.50 avg60=0.20 avg300=0.05 total=123456`, and a `full`
    line) → {"some": …, "full": …}; totals are microseconds in the file, seconds here."""
    result: dict[str, PsiLine] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        values = dict(item.partition("=")[::2] for item in rest.split())
        try:
            result[kind] = PsiLine(
                avg10=float(values["avg10"]) / 100.0,
                avg60=float(values["avg60"]) / 100.0,
                avg300=float(values["avg300"]) / 100.0,
                total_s=int(values["total"]) / 1e6,
            )
        except (KeyError, ValueError):
            continue
    return result


def _help() -> dict[str, str]:
    help_text = {}
    for kind in ("some", "full"):
        who = "some tasks" if kind == "some" else "all non-idle tasks"
        for window in WINDOWS:
            help_text[f"psi_{kind}_{window}_ratio"] = (
                f"Share of the last {window[3:]} s in which {who} stalled on the resource "
                "(labels resource, scope host|cgroup)"
            )
        help_text[f"psi_{kind}_stall_seconds_total"] = (
            f"Cumulative time {who} stalled on the resource"
        )
    return help_text


class PsiCollector(HostCollector):
    name = "psi"
    stability = "stable"
    default_interval_s = 10.0
    default_budget_s = 1.0
    metrics_help = _help()

    def available(self) -> tuple[bool, str]:
        if not self.roots.proc("pressure").is_dir():
            return False, (
                f"{self.roots.proc('pressure')} is missing: the kernel needs CONFIG_PSI=y "
                "(and psi=1 on the command line where it defaults off)"
            )
        per_job = "per-job PSI from cgroup v2"
        if not self._unified_root_exists():
            per_job = "no per-job PSI (cgroup v1 has no pressure files)"
        return True, f"reads {self.roots.proc('pressure')}; {per_job}"

    def _unified_root_exists(self) -> bool:
        return (self.roots.cgroup("cgroup.controllers")).exists() or (
            self.roots.cgroup("unified", "cgroup.controllers")
        ).exists()

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        for resource in RESOURCES:
            text = read_text(ctx.roots.proc("pressure", resource))
            if text:
                out += self._observe(ctx, "host", resource, parse_psi(text), None)
        for job in ctx.jobs:
            out += self._collect_job(ctx, job)
        return out

    def _collect_job(self, ctx: CollectContext, job: Registration) -> list[Observation]:
        path = job_cgroup(ctx.roots, job, "")
        folder = None
        for base in (ctx.roots.cgroup(), ctx.roots.cgroup("unified")):
            if path and (base / "cgroup.controllers").exists():
                folder = base / path.lstrip("/")
                break
        out: list[Observation] = []
        texts = {r: read_text(folder / f"{r}.pressure") for r in RESOURCES} if folder else {}
        if not any(texts.values()):
            if self.edges.first(("no_psi", job.pid, path)):
                event = Event(
                    body=f"no per-cgroup PSI for job {job.job or job.pid}: its cgroup has no "
                    "pressure files (cgroup v1 or PSI off); system-wide values only",
                    ts_ns=ctx.now_ns,
                    host=ctx.host,
                    source="psi",
                    kind="state",
                    pid=job.pid,
                    attrs={"cgroup": path or ""},
                )
                out.append(attribute(event, job))
            return out
        for resource, text in texts.items():
            if text:
                out += self._observe(ctx, path or "", resource, parse_psi(text), job)
        return out

    def _observe(
        self,
        ctx: CollectContext,
        scope: str,
        resource: str,
        lines: dict[str, PsiLine],
        job: Registration | None,
    ) -> list[Observation]:
        labels = {"resource": resource, "scope": "host" if job is None else "cgroup"}
        if job is not None:
            labels.update(cgroup=scope, job=job.job or "")
        out: list[Observation] = []
        for kind, line in lines.items():
            for window in WINDOWS:
                out.append(
                    self._metric(
                        ctx, f"psi_{kind}_{window}_ratio", getattr(line, window), labels, job
                    )
                )
            out.append(
                self._metric(
                    ctx, f"psi_{kind}_stall_seconds_total", line.total_s, labels, job, counter=True
                )
            )
        kind, option, detector_id = DETECTORS[resource]
        watched = lines.get(kind)
        threshold = float(self.options.get(option, 1.0))
        # reported once, re-armed once it falls below the threshold
        if not self.edges.rising(
            (scope, resource), watched is not None and watched.avg10 >= threshold
        ):
            return out
        assert watched is not None
        where = "host" if job is None else f"cgroup {scope}"
        evidence = poll_finding(
            ctx,
            "psi",
            detector_id,
            pid=job.pid if job else None,
            attrs={"resource": resource, **({"cgroup": scope} if job else {})},
            captures={
                "resource": resource,
                "scope": where,
                "kind": kind,
                "avg10": f"{watched.avg10:.4f}",
                "threshold": f"{threshold:.4f}",
            },
            values={"avg10_ratio": watched.avg10, "threshold_ratio": threshold},
        )
        attribute(evidence.event, job)
        out.append(evidence)
        return out

    def _metric(
        self,
        ctx: CollectContext,
        name: str,
        value: float,
        labels: dict[str, str],
        job: Registration | None,
        counter: bool = False,
    ) -> Event:
        event = metric(
            name,
            value,
            source="psi",
            counter=counter,
            labels=labels,
            host=ctx.host,
            ts_ns=ctx.now_ns,
            pid=job.pid if job else None,
        )
        return attribute(event, job)
