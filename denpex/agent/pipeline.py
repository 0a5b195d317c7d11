"""The agent's pipeline: collector output → attributed events → evidence → ring and sinks.

Lines (kernel log, journal) are matched against the same signature catalog as `denpex scan`;
detector evidence from collectors passes through; metric events update the current values
that `/metrics` and OTLP export. Evidence bound for the disk spool goes through the handoff,
which acknowledges each poll to its collector once it is durable. Never blocks a collector:
sinks take batches and return.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from denpex.agent.handoff import Ack, Handoff
from denpex.agent.jobs import JobTable
from denpex.catalog import Catalog
from denpex.core.events import METRIC_RESERVED, Event, Evidence
from denpex.core.wire import Registration

EvidenceSink = Callable[[list[Evidence]], None]
MetricSink = Callable[[list[Event]], None]
MetricKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class MetricValue:
    source: str
    type: str
    value: float
    ts_ns: int | None
    updated_ns: int


@dataclass(slots=True)
class RingEntry:
    arrival_ns: int
    evidence: Evidence


@dataclass(slots=True)
class PipelineStats:
    lines: int = 0
    evidence_by_category: dict[tuple[str, str], int] = field(default_factory=dict)
    sink_errors: int = 0


def metric_key(event: Event) -> MetricKey:
    labels = {k: str(v) for k, v in event.attrs.items() if k not in METRIC_RESERVED}
    for name in ("job", "rank", "pid"):
        value = getattr(event, name)
        if value is not None and name not in labels:
            labels[name] = str(value)
    return event.body, tuple(sorted(labels.items()))


class Pipeline:
    """Thread-safe: collectors' threads call `ingest`; the API and exporters read."""

    def __init__(
        self,
        catalog: Catalog,
        jobs: JobTable,
        *,
        host: str,
        ring_size: int = 10_000,
        metric_ttl_s: float = 300.0,
        evidence_sinks: Iterable[EvidenceSink] = (),
        metric_sinks: Iterable[MetricSink] = (),
        handoff: Handoff | None = None,
    ) -> None:
        self.catalog = catalog
        self.jobs = jobs
        self.host = host
        self.evidence_sinks = list(evidence_sinks)  # best effort: a failure is counted
        self.metric_sinks = list(metric_sinks)
        self.handoff = handoff or Handoff()  # the durable sink (the spool), and the acks
        self.stats = PipelineStats()
        self._ring: deque[RingEntry] = deque(maxlen=ring_size)
        self._metrics: dict[MetricKey, MetricValue] = {}
        # a series not refreshed for this long is gone (a process exited, a flow closed):
        # forgetting it keeps the agent's memory flat over weeks
        self.metric_ttl_ns = int(metric_ttl_s * 1e9)
        self._next_expiry_ns = 0
        self._lock = threading.Lock()
        # ids unique across restarts of this agent: pid and start time, then a counter
        self._id_prefix = f"{host}:{os.getpid()}:{time.time_ns():x}"
        self._counter = itertools.count(1)

    def ingest(
        self, observations: Iterable[Event | Evidence], ack: Ack | None = None
    ) -> list[Evidence]:
        """Attribute, match and record one collector poll; returns the new evidence. `ack`
        (the collector's commit of its position) runs once that evidence is durable."""
        lines: list[Event] = []
        metrics: list[Event] = []
        found: list[Evidence] = []
        for item in observations:
            if isinstance(item, Evidence):
                self._attribute(item.event, item.captures)
                found.append(item)
                continue
            self._attribute(item)
            if item.kind == "metric":
                metrics.append(item)
            elif item.kind == "line":
                lines.append(item)
        found.extend(self._match(lines))
        for evidence in found:
            if not evidence.id:
                evidence.id = str(evidence.event.attrs.get("event_id") or self._next_id())
        self._record(found, metrics)
        self.handoff.submit(found, ack)
        return found

    def _next_id(self) -> str:
        return f"{self._id_prefix}:{next(self._counter)}"

    def _attribute(self, event: Event, captures: dict[str, str] | None = None) -> None:
        event.host = event.host or self.host
        if event.job is not None:
            return
        pid = event.pid  # a kernel line's subject, set by its reader (attribute_kernel_line)
        if pid is None and captures and captures.get("pid", "").isdigit():
            pid = int(captures["pid"])  # a signature that captured the subject's pid
        registration = self.jobs.lookup(pid, event.attrs.get("cgroup"))
        if registration is not None:
            _apply(event, registration, pid)

    def _match(self, lines: list[Event]) -> list[Evidence]:
        if not lines:
            return []
        bodies = [line.body.encode("utf-8", "surrogateescape") for line in lines]
        self.stats.lines += len(lines)
        found = []
        for match in self.catalog.match_lines(bodies):
            event = lines[match.line_index]
            signature = match.signature
            if not signature.accepts_source(event.source):
                continue
            captures = signature.captures(bodies[match.line_index])
            if event.job is None:
                self._attribute(event, captures)
            found.append(signature.evidence(event, captures))
        return found

    def _record(self, found: list[Evidence], metrics: list[Event]) -> None:
        now = time.time_ns()
        with self._lock:
            for evidence in found:
                self._ring.append(RingEntry(now, evidence))
                key = (evidence.category, evidence.severity)
                self.stats.evidence_by_category[key] = (
                    self.stats.evidence_by_category.get(key, 0) + 1
                )
            for event in metrics:
                value = event.attrs.get("value")
                if not isinstance(value, int | float):
                    continue
                self._metrics[metric_key(event)] = MetricValue(
                    event.source,
                    str(event.attrs.get("type", "gauge")),
                    float(value),
                    event.ts_ns,
                    now,
                )
            if now >= self._next_expiry_ns:
                cutoff = now - self.metric_ttl_ns
                self._metrics = {k: v for k, v in self._metrics.items() if v.updated_ns >= cutoff}
                self._next_expiry_ns = now + self.metric_ttl_ns // 10
        for sink, batch in [(s, found) for s in self.evidence_sinks] + [
            (s, metrics) for s in self.metric_sinks
        ]:
            if not batch:
                continue
            try:
                sink(batch)  # type: ignore[arg-type]
            except Exception:  # a failing exporter must not stop collection
                self.stats.sink_errors += 1

    def evidence_since(
        self, since_ns: int = 0, *, pid: int | None = None, job: str | None = None
    ) -> list[Evidence]:
        """Evidence that arrived at or after `since_ns` (arrival time), optionally only for
        one job, or for a pid and its descendants (their registration, or the pid itself)."""
        with self._lock:
            entries = [e.evidence for e in self._ring if e.arrival_ns >= since_ns]
        if job is not None:
            entries = [e for e in entries if e.event.job == job]
        if pid is not None:
            owner = self.jobs.lookup(pid)
            entries = [
                e
                for e in entries
                if e.event.pid == pid or (owner is not None and e.event.job == owner.job)
            ]
        return entries

    def metric_values(self) -> dict[MetricKey, MetricValue]:
        with self._lock:
            return dict(self._metrics)

    def forget_metrics(self, source: str) -> None:
        """Drop the values of one source (its collector was stopped or reconfigured)."""
        with self._lock:
            self._metrics = {k: v for k, v in self._metrics.items() if v.source != source}


def _apply(event: Event, registration: Registration, pid: int | None) -> None:
    event.job = registration.job
    if event.rank is None:
        event.rank = registration.rank
    event.tenant = event.tenant or registration.tenant
    if event.pid is None:
        event.pid = pid
