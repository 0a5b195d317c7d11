"""What the Actions and Audit pages show: the tenant's remediation plans grouped by what they
need (approval first, then running, done, failed, and the ones the tier only records), each
step with the state its step records give it; and the tenant's recent audit records with the
verdict of verifying the whole chain (the check `denpex audit verify --db` makes).

Pure reads through a RemediationStore bound to the caller's tenant and the audit log; it
must never show a step state the records do not hold, nor another tenant's audit record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from denpex.control import audit_log
from denpex.control.db import Database
from denpex.control.remediation_store import RemediationStore
from denpex.remediation import executor as ex
from denpex.remediation.machine import State, info

MAX_PLANS = 200  # plans one Actions page lists
MAX_AUDIT = 100  # audit records one Audit page lists

# (group key, heading, statuses), in the order the page shows them
GROUPS = (
    ("pending", "Waiting for approval", (ex.WAITING, ex.HELD)),
    ("running", "Running", (ex.ACTIVE,)),
    ("done", "Done", (ex.DONE,)),
    ("failed", "Failed or rejected", (ex.FAILED, ex.REJECTED)),
    ("proposed", "Proposed only (the tier runs nothing)", (ex.RECOMMENDED, ex.OBSERVED)),
)
DECIDABLE = (ex.WAITING, ex.HELD)  # a named human may approve the step these wait at
NEVER_RAN = (ex.RECOMMENDED, ex.OBSERVED)  # plans the tier only records: no step records


@dataclass(slots=True)
class StepView:
    state: str
    status: str  # done | failed | skipped | running | interrupted | waiting | held | next |
    #              not run | pending
    detail: str
    ts_ns: int | None
    explain: str


@dataclass(slots=True)
class PlanView:
    plan: dict[str, Any]
    steps: list[StepView]
    may_approve: bool  # the plan waits for a human (the page still asks the policy set)
    may_reject: bool


def step_views(plan: dict[str, Any]) -> list[StepView]:
    """Each step of the plan with what its records say happened (none: pending)."""
    records = plan.get("steps") or []
    current, status = plan["state"], plan["status"]
    out = []
    for state in plan["plan"].get("steps") or []:
        mine = [r for r in records if r["state"] == state]
        finished = [r for r in mine if r["phase"] == "finished"]
        started = [r for r in mine if r["phase"] == "started"]
        detail, ts = "", None
        if finished:
            last = finished[-1]
            result = last.get("result") or {}
            detail = str(result.get("detail") or result.get("error") or "")
            ts = int(last["ts_ns"])
            event = last.get("event") or ""
            shown = {"ok": "done", "skip": "skipped", "lemon": "done"}.get(event, "failed")
            if event == "lemon":
                detail = detail or "a repeat offender: it goes to RMA"
            elif shown == "failed":
                detail = f"{event}: {detail}" if detail else event
        elif started:
            ts = int(started[-1]["ts_ns"])
            shown = "running" if status == ex.ACTIVE else "interrupted"
        elif state == current and status in (ex.WAITING, ex.HELD):
            shown, detail = status, plan.get("note") or ""
        elif state == current and status == ex.ACTIVE:
            shown = "next"
        elif status in (ex.REJECTED, ex.FAILED, ex.RECOMMENDED, ex.OBSERVED):
            shown = "not run"
        else:
            shown = "pending"
        explain = info(State(state)).explain if state in State.__members__.values() else ""
        out.append(StepView(state, shown, detail, ts, explain))
    return out


def plan_groups(rs: RemediationStore) -> list[tuple[str, str, list[PlanView]]]:
    """(key, heading, plans) for every group, each newest first; empty groups included."""
    listed = rs.plans(limit=MAX_PLANS)
    by_status: dict[str, list[PlanView]] = {}
    for summary in listed:
        plan = rs.plan(summary["id"])  # with its step records
        view = PlanView(
            plan,
            step_views(plan),
            may_approve=plan["status"] in DECIDABLE,
            may_reject=plan["status"] not in (ex.DONE, ex.FAILED, ex.REJECTED),
        )
        by_status.setdefault(plan["status"], []).append(view)
    return [
        (key, heading, [v for status in statuses for v in by_status.get(status, [])])
        for key, heading, statuses in GROUPS
    ]


def remediation_states(
    rs: RemediationStore, state_of_step: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """host → {"state", "plan", "step"}: where the host's remediation left it, read from the
    step records (a step that ran, or runs now); a host whose plans never ran a step, or whose
    last one was `resume` (back in service), has no entry. `state_of_step` maps a plan step to
    the host state it leaves (host_states.yaml)."""
    out: dict[str, dict[str, Any]] = {}
    listed = [p for p in rs.plans(limit=MAX_PLANS) if p["status"] not in NEVER_RAN]
    latest: dict[str, int] = {}  # host → ts of the record that set its entry
    for summary in reversed(listed):  # oldest first: a newer plan's record wins on a tie
        plan = rs.plan(summary["id"])
        running, done = None, None  # a step started and not finished; the last one that ran
        for record in plan.get("steps") or []:
            if record["phase"] == "started":
                running = record
            else:
                running = None
                if record["event"] == "ok":
                    done = record
        last = running or done
        if last is None:
            continue
        host = plan["host"]
        if last["ts_ns"] < latest.get(host, -1):
            continue
        latest[host] = last["ts_ns"]
        state = state_of_step.get(last["state"])
        if state is None:  # resume ran: the host is back in service
            out.pop(host, None)
            continue
        out[host] = {"state": state, "plan": plan["id"], "step": last["state"]}
    return out


def incident_plans(rs: RemediationStore, incident_id: int) -> list[dict[str, Any]]:
    """The plans of one incident (for its page: a link and the plan's state)."""
    return rs.plans(incident=incident_id, limit=20)


@dataclass(slots=True)
class AuditView:
    ok: bool
    verdict: str  # the verifier's sentence
    records_checked: int
    head_seq: int
    head_hash: str
    bad_line: int | None
    checked_ms: float
    records: list[dict[str, Any]]  # this tenant's newest records, newest first


def audit_view(db: Database, tenant: str) -> AuditView:
    """Verify the whole chain (every tenant's records are links of the one chain: a gap
    anywhere breaks it for all) and list this tenant's newest records."""
    began = time.perf_counter()
    verdict = audit_log.verify_store(db)
    took = (time.perf_counter() - began) * 1000
    records = audit_log.tenant_records(db, tenant, MAX_AUDIT)
    return AuditView(
        ok=verdict.ok,
        verdict=verdict.describe(),
        records_checked=verdict.records,
        head_seq=verdict.head.seq,
        head_hash=verdict.head.hash,
        bad_line=verdict.line,
        checked_ms=took,
        records=records,
    )
