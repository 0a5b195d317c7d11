"""Strikes: what the fleet rules count. One per failed job (its ranks' reports joined into
one, reports.job_outcomes), its cause re-diagnosed by the one engine (denpex.diagnosis) with
the agents' host events on its hosts joined in, and one per agent error on hardware that no
failed job's cause accounts for.

Pure: never reads the store or the clock; the caller's FleetView holds everything.
"""

from __future__ import annotations

import bisect
import re
import signal as signal_module
from dataclasses import dataclass
from functools import lru_cache

from denpex.control.fleet.config import FleetConfig
from denpex.control.fleet.model import EvidenceRecord, FleetView, GpuRef, JobOutcome
from denpex.control.fleet.reports import job_outcomes
from denpex.core.events import Event, Evidence, severity_rank
from denpex.diagnosis import DiagnosisInput, diagnose
from denpex.diagnosis.config import load_rules

_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$")
_CACHE_LIMIT = 50_000
# re-diagnosis is deterministic: the same job and the same joined events give the same
# answer, so a correlation loop that runs every few seconds diagnoses each job once
_rediagnosed: dict[tuple, tuple] = {}


@lru_cache(maxsize=4096)
def normal_pci(pci: str | None) -> str | None:
    """One spelling per PCI address: NVML's '00000000:3B:00.0' and the kernel's
    '0000:3b:00' are both '0000:3b:00' (function dropped: a GPU is one device)."""
    if not pci:
        return None
    found = _PCI.match(pci.strip())
    if not found:
        return pci.strip().lower()
    domain, bus, device = found.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{device.lower()}"


@dataclass(slots=True)
class Strike:
    """One thing that went wrong on one host (and maybe one GPU)."""

    ts_ns: int
    host: str | None
    gpu: GpuRef | None
    category: str
    severity: str
    evidence: tuple[str, ...]
    job: JobOutcome | None  # None: an agent's error while no failed job explains it
    rule: str  # the per-job engine's rule, or "agent"
    hardware: bool  # an infrastructure category of the per-job rules (GPU, fabric, host)
    confidence: float = 0.0  # the engine's confidence in the job's cause (0: an agent's)

    @property
    def workload(self) -> str | None:
        if self.job is None:
            return None
        return self.job.name or self.job.job

    @property
    def tenant(self) -> str | None:
        return self.job.tenant if self.job is not None else None


class GpuDirectory:
    """Resolves a (host, PCI address) to the GPU's serial from what jobs and agents said."""

    def __init__(self, view: FleetView) -> None:
        self._view = view
        self._serial: dict[tuple[str, str], str] | None = None

    def _build(self) -> dict[tuple[str, str], str]:
        # one job per host names all its GPUs; the agents' own events may add the rest
        serial: dict[tuple[str, str], str] = {}
        seen: set[str] = set()
        for job in reversed(self._view.jobs):  # the newest placement wins (boards move)
            fresh = [h for h in job.hosts if h not in seen]
            if not fresh:
                continue
            seen.update(fresh)
            for gpu in job.gpus:
                key = normal_pci(gpu.pci)
                if gpu.host in fresh and key and gpu.serial:
                    serial.setdefault((gpu.host, key), gpu.serial)
        for event in self._view.host_events:
            key = normal_pci(event.gpu_pci)
            if event.host and key and event.gpu_serial:
                serial.setdefault((event.host, key), event.gpu_serial)
        return serial

    def resolve(self, host: str, pci: str | None, serial: str | None = None) -> GpuRef:
        key = normal_pci(pci)
        if not serial and key:
            if self._serial is None:
                self._serial = self._build()
            serial = self._serial.get((host, key))
        return GpuRef(host=host, pci=key, serial=serial)


def _world_size(job: JobOutcome) -> int | None:
    """The job's world size when its reports name every rank from 0 up (the one-rank-per-
    wrapper case: the rank that printed nothing is still known from its own report)."""
    ranks = set(job.ranks)
    return len(ranks) if job.reports > 1 and ranks == set(range(len(ranks))) else None


def as_evidence(
    record: EvidenceRecord, seq: int, job: JobOutcome | None, world_size: int | None = None
) -> Evidence:
    """The engine's Evidence for a stored record; joined into `job` (an agent's host event),
    it says whether it is about the job or only about its host (`attrs["attribution"]`)."""
    attrs: dict[str, object] = {"world_size": world_size} if world_size else {}
    if job is not None:  # an agent's event joined into a job (contract: attribution)
        mine = record.job == job.job or (
            record.gpu_pci is not None
            and any(
                g.host == record.host and normal_pci(g.pci) == normal_pci(record.gpu_pci)
                for g in job.gpus
            )
        )
        attrs["attribution"] = "job" if mine else "host"
    event = Event(
        body=record.body or record.category,
        ts_ns=record.ts_ns,
        host=record.host,
        source=record.source,
        rank=record.rank,
        job=record.job,
        tenant=record.tenant,
        attrs=attrs,
        seq=seq,
    )
    return Evidence(
        id=record.id,
        event=event,
        signature=record.signature or record.category,
        category=record.category,
        severity=record.severity,
        summary=record.body,
    )


class HostEventIndex:
    """The agents' host events by host, in time order, for joins over a time range."""

    def __init__(self, events: list[EvidenceRecord]) -> None:
        by_host: dict[str, list[EvidenceRecord]] = {}
        for event in events:
            if event.host and event.ts_ns is not None:
                by_host.setdefault(event.host, []).append(event)
        self._events = {
            h: sorted(v, key=lambda e: (e.ts_ns or 0, e.id)) for h, v in by_host.items()
        }
        self._times = {h: [e.ts_ns or 0 for e in v] for h, v in self._events.items()}

    def between(self, host: str, start_ns: int, end_ns: int) -> list[EvidenceRecord]:
        times = self._times.get(host)
        if not times:
            return []
        lo = bisect.bisect_left(times, start_ns)
        hi = bisect.bisect_right(times, end_ns)
        return self._events[host][lo:hi]


def _joined_events(job: JobOutcome, index: HostEventIndex, cfg: FleetConfig) -> list:
    join = cfg["join"]
    start = (job.started_ns or job.ended_ns) - int(float(join["before_start_s"]) * 1e9)
    end = job.ended_ns + int(float(join["after_end_s"]) * 1e9)
    events = [e for host in job.hosts for e in index.between(host, start, end)]
    events = [e for e in events if severity_rank(e.severity) >= 1]
    events.sort(key=lambda e: (-severity_rank(e.severity), e.ts_ns, e.id))
    return events[: int(join["max_events"])]


def rediagnose(
    job: JobOutcome, events: list[EvidenceRecord]
) -> tuple[str, str | None, int | None, tuple[str, ...], str, float]:
    """The one engine's root cause of `job` with `events` (agents' host evidence) joined
    into its reports' timeline: (category, host, rank, evidence ids, rule, confidence). A
    rank the cause names without a host is on the host its own report came from."""
    key = (
        job.tenant,
        job.job,
        job.ended_ns,
        tuple((r.id, r.category) for r in job.timeline),  # a job's reports arrive apart
        tuple(e.id for e in events),
    )
    found = _rediagnosed.get(key)
    if found is not None:
        return found
    world = _world_size(job)
    own_ids = {r.id for r in job.timeline}
    items = [as_evidence(r, i, None, world) for i, r in enumerate(job.timeline, 1)]
    offset = len(items)
    items += [
        as_evidence(r, offset + i, job, world)
        for i, r in enumerate(events, 1)
        if r.id not in own_ids
    ]
    diagnosis = diagnose(
        DiagnosisInput(items, exit_code=job.exit_code, exit_signal=_signal_number(job))
    )
    root = diagnosis.root_cause
    host = root.host or (job.ranks.get(root.rank) if root.rank is not None else None)
    found = (
        root.category,
        host,
        root.rank,
        tuple(root.evidence),
        root.rule,
        float(root.confidence),
    )
    if len(_rediagnosed) >= _CACHE_LIMIT:
        _rediagnosed.clear()
    _rediagnosed[key] = found
    return found


def _signal_number(job: JobOutcome) -> int | None:
    if not job.exit_signal:
        return None
    try:
        return int(signal_module.Signals[job.exit_signal])
    except KeyError:
        return None


def _gpu_of(
    job: JobOutcome | None,
    host: str | None,
    rank: int | None,
    category: str,
    records: list[EvidenceRecord],
    gpus: GpuDirectory,
) -> GpuRef | None:
    """The GPU a cause names: a PCI address or serial in its evidence, else the job's own
    root GPU, else (for a GPU category) the GPU of the blamed rank."""
    for record in records:
        if record.host and (record.gpu_pci or record.gpu_serial):
            return gpus.resolve(record.host, record.gpu_pci, record.gpu_serial)
    if job is None or host is None:
        return None
    if job.root_gpu is not None and job.root_gpu.host == host:
        return gpus.resolve(host, job.root_gpu.pci, job.root_gpu.serial)
    if category.startswith("gpu.") and rank is not None:
        for gpu in job.gpus:
            if gpu.rank == rank and gpu.host == host:
                return gpus.resolve(host, gpu.pci, gpu.serial)
    return None


def build_strikes(view: FleetView, now_ns: int, cfg: FleetConfig) -> list[Strike]:
    """Every strike in the view's lookback, in time order."""
    infra = load_rules().is_infrastructure
    since = now_ns - cfg.lookback_ns
    gpus = GpuDirectory(view)
    index = HostEventIndex(view.host_events)
    by_id = {e.id: e for e in view.host_events}
    strikes: list[Strike] = []
    explained: set[str] = set()  # host events some job's cause already cites
    for job in job_outcomes(view.jobs):
        if not job.failed or not (since <= job.ended_ns <= now_ns):
            continue
        joined = _joined_events(job, index, cfg)
        category, host, rank = job.category, job.root_host, job.root_rank
        ids, rule, confidence = job.evidence, job.rule, job.confidence
        if joined or job.reports > 1:  # host events, or ranks no one report saw together
            category, host, rank, ids, rule, confidence = rediagnose(job, joined)
            ids = tuple(dict.fromkeys((*ids, *job.evidence)))
        host = host or job.root_host or (job.hosts[0] if len(job.hosts) == 1 else None)
        records = [by_id[i] for i in ids if i in by_id]
        explained.update(r.id for r in records)
        when = max((r.ts_ns for r in records if r.ts_ns is not None), default=job.ended_ns)
        strikes.append(
            Strike(
                ts_ns=min(when, job.ended_ns),
                host=host,
                gpu=_gpu_of(job, host, rank, category, records, gpus),
                category=category,
                severity="error",
                evidence=ids,
                job=job,
                rule=rule,
                hardware=infra(category),
                confidence=confidence,
            )
        )
    for event in view.host_events:
        if event.id in explained or event.ts_ns is None or not (since <= event.ts_ns <= now_ns):
            continue
        if event.host is None or severity_rank(event.severity) < 2 or not infra(event.category):
            continue
        strikes.append(
            Strike(
                ts_ns=event.ts_ns,
                host=event.host,
                gpu=_gpu_of(None, event.host, None, event.category, [event], gpus),
                category=event.category,
                severity=event.severity,
                evidence=(event.id,),
                job=None,
                rule="agent",
                hardware=True,
            )
        )
    strikes.sort(key=lambda s: (s.ts_ns, s.evidence))
    return strikes


def warnings_in(view: FleetView, now_ns: int, cfg: FleetConfig) -> list[EvidenceRecord]:
    """The agents' warnings (not failures) that can corroborate a suspicion, in time order."""
    since = now_ns - cfg.lookback_ns
    found = [
        e
        for e in view.host_events
        if e.host
        and e.ts_ns is not None
        and since <= e.ts_ns <= now_ns
        and severity_rank(e.severity) == 1
        and cfg.is_corroborating(e.category)
    ]
    found.sort(key=lambda e: (e.ts_ns, e.id))
    return found
