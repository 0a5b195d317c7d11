"""The correlation pass the leader runs: reports not yet correlated → incident candidates →
incidents, written behind the epoch fence.

Until the fleet rules (denpex.control.fleet) are wired in, one rule applies: a failed job
report opens one incident for its own root cause (`job_root_cause`), linking the report's
evidence, its job and its hosts. Pure candidate building (`report_candidates`) is kept apart
from the pass that reads and writes, so rules can be tested without a store.
"""

from __future__ import annotations

from typing import Any

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


def correlate_tenant(store: TenantStore, now_ns: int) -> int:
    """One pass over a tenant's pending reports; returns incidents opened or grown."""
    touched = 0
    while True:
        pending = store.pending_reports(BATCH)
        if not pending:
            return touched
        candidates = [c for report in pending for c in report_candidates(report)]
        touched += len(store.record_incidents(candidates, [r["id"] for r in pending], now_ns))
        if len(pending) < BATCH:
            return touched
