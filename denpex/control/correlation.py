"""The correlation pass the leader runs per tenant, written behind the epoch fence:

- per job: a failed report opens one incident for its own root cause (`job_root_cause`,
  component kind `job`), linking the report's evidence, its job and its hosts;
- over the fleet: the rules above the single job (denpex.control.fleet: fleet_wide,
  shared_component, hardware_in_job, repeat_offender, recovered) over the tenant's recent
  history (fleet_pass.FleetWindow), their incidents opened, grown and resolved by merge().

Pure candidate building (`report_candidates`) is kept apart from the pass that reads and
writes, so rules can be tested without a store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from denpex.control.fleet_pass import FleetWindow
from denpex.control.fleet_store import FleetStore
from denpex.control.ingest import report_evidence_ids
from denpex.control.store import TenantStore

RULE_JOB_ROOT_CAUSE = "job_root_cause"
BATCH = 200


def report_candidates(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Incident candidates of one stored report (as TenantStore.report returns it)."""
    if report["status"] != "failed":
        return []
    diagnosis = report["diagnosis"]
    root = diagnosis.get("root_cause") or {}
    evidence = report_evidence_ids(report["id"], list(root.get("evidence") or []))
    for item in diagnosis.get("contributing") or []:
        evidence += report_evidence_ids(report["id"], list(item.get("evidence") or []))
    job = report["job"] or report["id"]
    host = root.get("host")
    title = root.get("title") or root.get("explanation") or root.get("category") or "failure"
    where = f" on {host}" if host else ""
    return [
        {
            "dedupe_key": f"{RULE_JOB_ROOT_CAUSE}:{report['id']}",
            "rule": RULE_JOB_ROOT_CAUSE,
            "category": report["category"],
            "component_kind": "job",
            "component_id": job,
            "title": f"job {job}: {report['category']}{where}",
            "explanation": str(diagnosis.get("summary") or title),
            "confidence": float(report["confidence"]),
            "first_ns": report["ended_ns"],
            "last_ns": report["ended_ns"],
            "links": {
                "evidence": sorted(set(evidence)),
                "job": [job],
                "host": sorted(set(report["hosts"]) | ({host} if host else set())),
                "report": [report["id"]],
            },
        }
    ]


@dataclass(slots=True)
class PassResult:
    """What one tenant's pass wrote: per-job incidents opened or grown, and the fleet
    incidents opened, grown and resolved (ids)."""

    job_incidents: int = 0
    fleet: dict[str, list[int]] = field(
        default_factory=lambda: {"opened": [], "updated": [], "resolved": []}
    )

    @property
    def written(self) -> int:
        return self.job_incidents + sum(len(ids) for ids in self.fleet.values())


def correlate_tenant(
    store: TenantStore, now_ns: int, window: FleetWindow | None = None
) -> PassResult:
    """One pass over a tenant: its pending reports (per-job incidents, and into `window`),
    then, with a window, the fleet rules over it."""
    out = PassResult()
    fleet = FleetStore(store)
    if window is not None:
        window.refresh(fleet, now_ns)
    while True:
        pending = store.pending_reports(BATCH)
        if not pending:
            break
        if window is not None:
            window.add_reports(pending)
        candidates = [c for report in pending for c in report_candidates(report)]
        out.job_incidents += len(
            store.record_incidents(candidates, [r["id"] for r in pending], now_ns)
        )
        fleet.adopt_late_jobs(c["component_id"] for c in candidates)
        if len(pending) < BATCH:
            break
    if window is not None:
        out.fleet = window.run(fleet, now_ns)
    return out
