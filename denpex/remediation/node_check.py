"""The node-local hooks (Slurm Prolog, Epilog, HealthCheckProgram) through the same engine as
the control plane: a critical finding of `denpex agent --once --json` becomes a plan whose
only step is the cordon, decided by the remediation policy (tier per pool and category),
checked by the guards (blast radius and unhealthy share of the pool as the scheduler reports
them, rate limit, lemon), run by the Executor, and every decision appended to a local
hash-chained audit file (denpex.core.audit, verifiable with `denpex audit verify`).

It must never cordon outside the policy or past a guard, never touch a node someone else
drained (the backend refuses), and never run a step beyond the cordon: eviction, reroute and
repair belong to the control plane's leader.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from denpex.core import audit, jsonio
from denpex.remediation.backend import REASON_PREFIX, Backend, BackendError, Target, TargetKind
from denpex.remediation.executor import (
    ACTIVE,
    Executor,
    PlanRecord,
    dry_run,
    initial_status,
)
from denpex.remediation.machine import Event, State
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Policy

LOCAL_STEPS = (State.CORDON,)  # a node hook only takes the node out of service


def critical_finding(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first evidence of severity critical in an agent report (None: healthy)."""
    for item in report.get("evidence") or []:
        if item.get("severity") == "critical" and item.get("category"):
            return dict(item)
    return None


def plan_for(finding: Mapping[str, Any], host: str, pool: str | None) -> Plan:
    action = str(finding.get("action") or "drain_node")
    category = str(finding["category"])
    target = Target(TargetKind.HOST, host, None, pool)
    return Plan(None, category, "node_check", target, (action,), LOCAL_STEPS, category)


class AuditFileLog:
    """The Executor's PlanLog on a local JSONL audit file (locked while appending); the
    pool's counts come from the scheduler, which sees every node's cordon."""

    def __init__(self, path: Path, backend: Backend, tenant: str | None = None) -> None:
        self.path, self.backend, self.tenant = path, backend, tenant

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_bytes().splitlines()
        return [audit.loads_record(line) for line in lines if line.strip()]

    def append(
        self,
        kind: str,
        actor: str,
        subject: str,
        why: Mapping[str, Any],
        result: Mapping[str, Any],
        now_ns: int,
    ) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            lines = [ln for ln in handle.read().splitlines() if ln.strip()]
            head = audit.head_of(audit.loads_record(lines[-1])) if lines else audit.EMPTY
            record = audit.seal(
                head,
                ts_ns=now_ns,
                kind=kind,
                actor=actor,
                tenant=self.tenant,
                subject=subject,
                why=why,
                result=result,
            )
            handle.write(audit.canonical(record) + b"\n")

    # --- PlanLog ---------------------------------------------------------------------------

    def begin_step(self, record: PlanRecord, state: State, now_ns: int) -> None:
        self.append(
            "step.started",
            f"policy:{record.tier}",
            f"{record.plan.target.host} {state}",
            {"category": record.plan.category},
            {},
            now_ns,
        )

    def finish_step(
        self,
        record: PlanRecord,
        state: State,
        event: Event,
        result: Mapping[str, Any],
        next_state: State,
        status: str,
        now_ns: int,
    ) -> None:
        self.append(
            "step.finished",
            f"policy:{record.tier}",
            f"{record.plan.target.host} {state}",
            {"category": record.plan.category},
            {
                "event": str(event),
                "next": str(next_state),
                "status": status,
                "detail": result.get("detail") or result.get("error"),
                "changed": result.get("changed"),
            },
            now_ns,
        )

    def wait(self, record: PlanRecord, status: str, kind: str, reason: str, now_ns: int) -> None:
        self.append(
            kind,
            f"policy:{record.tier}",
            f"{record.plan.target.host}",
            {"category": record.plan.category},
            {"status": status, "reason": reason},
            now_ns,
        )

    def guard_tripped(self, pool: str | None) -> str | None:
        return None  # a tripped guard lives on the control plane; the share check still runs

    def trip_guard(self, pool: str | None, reason: str, now_ns: int) -> None:
        self.append("plan.held", "policy", f"pool {pool or '-'}", {}, {"reason": reason}, now_ns)

    def _ours(self, pool: str | None) -> tuple[int, set[str]]:
        """(hosts of the pool held by a denpex reason, the hosts not schedulable)."""
        if not pool:
            return 0, set()
        ours, unhealthy = 0, set()
        for host in self.backend.pool_hosts(pool, timeout_s=10):
            state = self.backend.state(Target(TargetKind.HOST, host), timeout_s=10)
            ours += bool(state.reason and state.reason.startswith(REASON_PREFIX))
            if not state.schedulable:
                unhealthy.add(host)
        return ours, unhealthy

    def cordons(self, pool: str | None, since_ns: int) -> Sequence[int]:
        return [time.time_ns()] * self._ours(pool)[0]  # held now: counted as within the window

    def unhealthy_hosts(self, pool: str | None) -> set[str]:
        return self._ours(pool)[1]

    def _finished(self, since_ns: int, host: str | None = None) -> list[int]:
        return [
            int(r["ts_ns"])
            for r in self.records()
            if r.get("kind") == "step.finished"
            and int(r["ts_ns"]) >= since_ns
            and (host is None or str(r.get("subject", "")).startswith(f"{host} "))
        ]

    def backend_ops(self, since_ns: int) -> Sequence[int]:
        return self._finished(since_ns)

    def host_incidents(self, host: str, since_ns: int) -> Sequence[int]:
        return self._finished(since_ns, host)


def run(
    report: Mapping[str, Any],
    *,
    host: str,
    backend: Backend,
    policy: Policy,
    audit_path: Path,
    dry: bool = False,
) -> dict[str, Any]:
    """Decide and (unless `dry`) act on one agent report; what happened, for the hook."""
    finding = critical_finding(report)
    if finding is None:
        return {"healthy": True}
    try:
        pool = backend.pool_of(host, timeout_s=10)
    except BackendError:
        pool = None
    plan = plan_for(finding, host, pool)
    preview = dry_run(plan, "node_check", policy)
    if dry:
        return {"healthy": False, "dry_run": preview}
    tier = policy.tier_for(pool, plan.category)
    log = AuditFileLog(audit_path, backend)
    now = time.time_ns()
    log.append(
        "plan.proposed",
        f"policy:{tier}",
        host,
        {"evidence": jsonio.loads(jsonio.dumps(finding))},
        {"tier": str(tier), "steps": ["cordon"]},
        now,
    )
    status = initial_status(tier)
    if status != ACTIVE:
        return {"healthy": False, "tier": str(tier), "status": status, "state": "cordon"}
    record = PlanRecord(0, "local", plan, tier, State.CORDON, ACTIVE, None, None)
    final = Executor(backend, log, policy).run(record, now)
    return {
        "healthy": False,
        "tier": str(tier),
        "status": final.status,
        "state": str(final.state),
        "cordoned": final.state is State.DONE,
    }
