"""The fleet rules' pass over the store, run by the leader per tenant: a window of the
tenant's recent history held in memory (reports as JobOutcomes, agent evidence as
EvidenceRecords, host state from the agents' metrics), refreshed from the store, then
correlate() + merge() (denpex.control.fleet) and their result written behind the fence.

It writes only through FleetStore.apply (fenced) and never reads the clock (callers pass
`now_ns`). A window belongs to one leader epoch: a new leader starts from the store.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from denpex.control.fleet import FleetConfig, correlate, merge
from denpex.control.fleet.fabric_placement import fabric_placements
from denpex.control.fleet.model import EvidenceRecord, FleetView, HostState, JobOutcome, Placement
from denpex.control.fleet.reports import outcome_from_report
from denpex.control.fleet.topology import merge_topology
from denpex.control.fleet_store import FleetStore

log = logging.getLogger("denpex.server")


def evidence_record(row: Mapping[str, Any], tenant: str) -> EvidenceRecord:
    """An evidence row (store.evidence_dict) as the fleet rules read it."""
    captures = row.get("captures") or {}
    attrs = row.get("attrs") or {}
    pci, serial = captures.get("pci") or attrs.get("pci"), attrs.get("gpu_serial")
    return EvidenceRecord(
        id=row["id"],
        ts_ns=row["ts_ns"] or None,
        host=row.get("host"),
        category=str(row.get("category") or "unknown"),
        severity=str(row.get("severity") or "info"),
        source=str(row.get("source") or "agent"),
        signature=str(row.get("signature") or ""),
        rank=row.get("rank"),
        gpu_pci=str(pci) if pci else None,
        gpu_serial=str(serial) if serial else None,
        job=row.get("job"),
        tenant=tenant,
        body=str(row.get("body") or ""),
    )


@dataclass
class FleetWindow:
    """One tenant's recent history as the leader holds it between passes."""

    tenant: str
    config: FleetConfig
    topology: Mapping[str, Placement] = field(default_factory=dict)  # the site file's
    jobs: dict[str, JobOutcome] = field(default_factory=dict)  # report id → outcome
    events: dict[str, EvidenceRecord] = field(default_factory=dict)  # agents' evidence
    hosts: dict[str, HostState] = field(default_factory=dict)
    reloaded_ns: int | None = None
    last_pass_ns: int | None = None
    dirty: bool = True  # something arrived since the last pass
    placements: dict[str, Placement] = field(default_factory=dict)  # the site's and agents'
    conflicts: list[str] = field(default_factory=list)  # where the sources disagree
    _agent_placements: tuple[dict[str, Placement], dict[str, Placement]] | None = None
    _newest_event_ns: int = 0

    def add_reports(self, reports: Iterable[Mapping[str, Any]]) -> None:
        """Reports (full, as the store returns them) into the window; their timelines are
        theirs, not agent evidence."""
        added = []
        for report in reports:
            if report["id"] not in self.jobs:
                self.jobs[report["id"]] = outcome_from_report(report, tenant=self.tenant)
                added.append(report["id"] + "/")
                self.dirty = True
        if added and self.events:
            prefixes = tuple(added)
            for key in [k for k in self.events if k.startswith(prefixes)]:
                del self.events[key]

    def _is_timeline(self, evidence_id: str) -> bool:
        cut = evidence_id.find("/")
        while cut > 0:
            if evidence_id[:cut] in self.jobs:
                return True
            cut = evidence_id.find("/", cut + 1)
        return False

    def _add_evidence(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            if row["id"] in self.events or self._is_timeline(row["id"]):
                continue
            record = evidence_record(row, self.tenant)
            self.events[record.id] = record
            self._newest_event_ns = max(self._newest_event_ns, record.ts_ns or 0)
            self.dirty = True

    def refresh(self, store: FleetStore, now_ns: int) -> None:
        """Read what is new from the store: the whole lookback when the window is cold; the
        agents' evidence of the whole lookback again when due a reload (late deliveries),
        else only since the newest it holds (less `late_s`). New reports come through
        add_reports (the pass's pending ones), so they are read once."""
        window = self.config["window"]
        since = now_ns - self.config.lookback_ns
        reload_ns = int(float(window["reload_s"]) * 1e9)
        if self.reloaded_ns is None:
            self.add_reports(store.reports_since(since))
        if self.reloaded_ns is None or now_ns - self.reloaded_ns >= reload_ns:
            held, was_dirty = set(self.events), self.dirty
            self.events.clear()
            self._newest_event_ns = 0
            self._add_evidence(store.evidence_since(since))
            self.dirty = was_dirty or not set(self.events) <= held  # late ones arrived
            self.reloaded_ns = now_ns
        else:
            late_ns = int(float(window["late_s"]) * 1e9)
            self._add_evidence(store.evidence_since(max(since, self._newest_event_ns - late_ns)))
        self.jobs = {k: j for k, j in self.jobs.items() if j.ended_ns >= since}
        self.events = {k: e for k, e in self.events.items() if (e.ts_ns or now_ns) >= since}
        hosts = host_states(store, self.config)
        if hosts != self.hosts:
            self.hosts = hosts
            self.dirty = True
        reported = agent_placements(store, self.config)
        if reported != self._agent_placements:
            self._agent_placements = reported
            self.placements, conflicts = merge_topology(self.topology, *reported)
            for line in sorted(set(conflicts) - set(self.conflicts)):
                log.warning("topology of tenant %s: %s", self.tenant, line)
            self.conflicts = conflicts
            self.dirty = True

    def due(self, now_ns: int) -> bool:
        idle_ns = int(float(self.config["window"]["idle_pass_s"]) * 1e9)
        return self.dirty or self.last_pass_ns is None or now_ns - self.last_pass_ns >= idle_ns

    def view(self) -> FleetView:
        return FleetView(
            jobs=sorted(self.jobs.values(), key=lambda j: (j.ended_ns, j.job)),
            host_events=sorted(self.events.values(), key=lambda e: (e.ts_ns or 0, e.id)),
            topology=self.placements if self._agent_placements is not None else self.topology,
            hosts=self.hosts,
        )

    def run(self, store: FleetStore, now_ns: int) -> dict[str, list[int]]:
        """One pass when due: correlate the window, merge with the open incidents, write.
        Returns the incident ids opened, grown and resolved."""
        if not self.due(now_ns):
            return {"opened": [], "updated": [], "resolved": []}
        candidates = correlate(self.view(), now_ns, self.config)
        result = merge(store.open_incidents(), candidates, store.open_incidents(resolved=True))
        done = store.apply(result, now_ns)
        self.dirty, self.last_pass_ns = False, now_ns
        return done


def agent_placements(
    store: FleetStore, config: FleetConfig
) -> tuple[dict[str, Placement], dict[str, Placement]]:
    """Where each host's agent places it: UFM's leaf switch, and what the agent found itself
    (rails from the NCCL topology, peer switches from ibnetdiscover / LLDP), newest each."""
    cfg = config["host_state"]
    names = {
        "labels": cfg["labels_metric"],
        "placement": cfg["placement_metric"],
        "rail": cfg["rail_metric"],
        "port": cfg["port_metric"],
    }
    return fabric_placements(store.host_metrics(tuple(names.values())), names)


def host_states(store: FleetStore, config: FleetConfig) -> dict[str, HostState]:
    """Each host's labels (its newest labels series) and last passing diagnostics."""
    names = config["host_state"]
    labels: dict[str, dict[str, str]] = {}
    passed: dict[str, int] = {}
    for host, name, point_labels, _ts_ns, value in store.host_metrics(
        (names["labels_metric"], names["diagnostics_metric"])
    ):
        if name == names["labels_metric"]:
            labels[host] = {str(k): str(v) for k, v in point_labels.items() if k != "host"}
        elif value > 0:
            passed[host] = max(passed.get(host, 0), int(value * 1e9))
    return {
        host: HostState(host, diagnostics_passed_ns=passed.get(host), labels=labels.get(host, {}))
        for host in sorted(set(labels) | set(passed))
    }
