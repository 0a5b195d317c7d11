"""The control plane side of the fleet replay (bench_fleet.py): an in-process stand-in for
the server's ingest and correlation loop that decodes exactly what the server receives (OTLP
protobuf log requests, report JSON) into the fleet's records, and runs correlate + merge.

It keeps only what a FleetView needs; idempotent by event and report id, like the ingest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from denpex.agent.otlp import SEVERITY, parse
from denpex.control.fleet import FleetConfig, correlate, load_fleet_rules, merge
from denpex.control.fleet.model import (
    EvidenceRecord,
    FleetView,
    HostState,
    Incident,
    JobOutcome,
    MergeResult,
    Placement,
)
from denpex.control.fleet.reports import outcome_from_report
from denpex.core import jsonio

_SEVERITY_OF = {number: name for name, (number, _text) in SEVERITY.items()}
TENANT = "research"


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def records_from_otlp(
    body: bytes, content_type: str = "application/x-protobuf"
) -> list[EvidenceRecord]:
    """Evidence records of one OTLP/HTTP logs request (the agent's evidence, DESIGN §8)."""
    request = parse(body, ExportLogsServiceRequest(), content_type)
    out = []
    for resource_logs in request.resource_logs:  # type: ignore[attr-defined]
        resource = {kv.key: _value(kv.value) for kv in resource_logs.resource.attributes}
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                attrs = {kv.key: _value(kv.value) for kv in record.attributes}
                if "denpex.event_id" not in attrs:
                    continue  # a plain event, not evidence
                out.append(
                    EvidenceRecord(
                        id=str(attrs["denpex.event_id"]),
                        ts_ns=record.time_unix_nano or None,
                        host=resource.get("host.name"),
                        category=str(attrs.get("denpex.category") or "unknown"),
                        severity=_SEVERITY_OF.get(record.severity_number, "info"),
                        source=str(attrs.get("denpex.source") or "agent"),
                        signature=str(attrs.get("denpex.signature") or ""),
                        rank=attrs.get("denpex.rank"),
                        gpu_pci=attrs.get("denpex.capture.pci") or attrs.get("pci"),
                        gpu_serial=attrs.get("gpu_serial"),
                        job=resource.get("denpex.job"),
                        tenant=resource.get("denpex.tenant"),
                        body=_value(record.body) or "",
                    )
                )
    return out


@dataclass
class InProcessControlPlane:
    """Ingest + the leader's correlation pass, in one process, over plain lists."""

    topology: dict[str, Placement]
    config: FleetConfig = field(default_factory=load_fleet_rules)
    jobs: dict[str, JobOutcome] = field(default_factory=dict)
    events: dict[str, EvidenceRecord] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)
    ingested: int = 0
    duplicates: int = 0
    _next_id: int = 1

    def ingest(self, kind: str, body: bytes) -> None:
        if kind == "logs":
            for record in records_from_otlp(body):
                if record.id in self.events:
                    self.duplicates += 1
                    continue
                self.events[record.id] = record
                self.ingested += 1
            return
        report = jsonio.loads(body)
        if report["id"] in self.jobs:
            self.duplicates += 1
            return
        self.jobs[report["id"]] = outcome_from_report(report, tenant=TENANT)
        self.ingested += 1

    def _prune(self, now_ns: int) -> None:
        since = now_ns - self.config.lookback_ns
        self.jobs = {k: j for k, j in self.jobs.items() if j.ended_ns >= since}
        self.events = {k: e for k, e in self.events.items() if (e.ts_ns or now_ns) >= since}

    def correlate(
        self, now_ns: int, hosts: dict[str, HostState], on_change: Callable[[Incident, str], None]
    ) -> MergeResult:
        self._prune(now_ns)
        view = FleetView(
            jobs=sorted(self.jobs.values(), key=lambda j: (j.ended_ns, j.job)),
            host_events=sorted(self.events.values(), key=lambda e: (e.ts_ns or 0, e.id)),
            topology=self.topology,
            hosts=hosts,
        )
        candidates = correlate(view, now_ns, self.config)
        open_now = [i for i in self.incidents.values() if i.state != "resolved"]
        result = merge(open_now, candidates)
        for incident in result.opened:
            stored = replace(incident, id=f"inc-{self._next_id}")
            self._next_id += 1
            self.incidents[stored.id] = stored  # type: ignore[index]
            on_change(stored, "opened")
        for update in result.updated:
            self.incidents[update.incident.id] = update.incident  # type: ignore[index]
            on_change(update.incident, "updated")
        for resolution in result.resolved:
            done = replace(resolution.incident, state="resolved")
            self.incidents[done.id] = done  # type: ignore[index]
            on_change(done, "resolved")
        return result
