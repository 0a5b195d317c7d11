"""The executor: moves one plan forward, step by step, on the control plane's leader. Each step
is recorded before it runs and after it ends (the PlanLog the control plane implements writes
behind the leader's epoch fence), so a new leader continues from the last recorded step: an
interrupted idempotent step runs again, an interrupted non-idempotent one waits for a human.

It must never run a step the tier does not allow, past a tripped guard, or twice when the
step is not idempotent; every decision goes through the PlanLog, which audits it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from denpex.remediation import guards
from denpex.remediation.backend import (
    Backend,
    BackendError,
    BackendTimeout,
    Operation,
    reason_text,
)
from denpex.remediation.machine import Event, State, advance, info
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Decision, Policy, Tier, decide
from denpex.remediation.spares import SparePool

ACTIVE, WAITING, HELD = "active", "waiting", "held"
DONE, FAILED, REJECTED = "done", "failed", "rejected"
OBSERVED, RECOMMENDED = "observed", "recommended"
TERMINAL_STATUS = {State.DONE: DONE, State.FAILED: FAILED, State.REJECTED: REJECTED}


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """A stored plan as the executor sees it."""

    id: int
    tenant: str
    plan: Plan
    tier: Tier
    state: State  # the step to run next, or a terminal state
    status: str
    approved_step: State | None  # the step a named human approved (it may run once)
    interrupted: State | None  # a step recorded as started and never as finished


class PlanLog(Protocol):
    """The executor's record of its work (fenced writes on the control plane's store)."""

    def begin_step(self, record: PlanRecord, state: State, now_ns: int) -> None: ...

    def finish_step(
        self,
        record: PlanRecord,
        state: State,
        event: Event,
        result: Mapping[str, Any],
        next_state: State,
        status: str,
        now_ns: int,
    ) -> None: ...

    def wait(
        self, record: PlanRecord, status: str, kind: str, reason: str, now_ns: int
    ) -> None: ...

    def guard_tripped(self, pool: str | None) -> str | None: ...

    def trip_guard(self, pool: str | None, reason: str, now_ns: int) -> None: ...

    def cordons(self, pool: str | None, since_ns: int) -> Sequence[int]: ...

    def unhealthy_hosts(self, pool: str | None) -> set[str]: ...

    def backend_ops(self, since_ns: int) -> Sequence[int]: ...

    def host_incidents(self, host: str, since_ns: int) -> Sequence[int]: ...


def initial_status(tier: Tier) -> str:
    return {Tier.OBSERVE: OBSERVED, Tier.RECOMMEND: RECOMMENDED}.get(tier, ACTIVE)


def first_state(plan: Plan) -> State:
    return advance(plan.steps, State.DETECTED, Event.START)[0]


class Executor:
    def __init__(
        self, backend: Backend, log: PlanLog, policy: Policy, *, spares: SparePool | None = None
    ) -> None:
        self.backend = backend
        self.log = log
        self.policy = policy
        self.spares = spares  # reroute takes a validated warm spare from here, when given

    def params(self, record: PlanRecord, state: State) -> dict[str, Any]:
        plan = record.plan
        return {
            "timeout_s": info(state).timeout_s,
            "reason": reason_text(plan.incident_id, plan.category),
            "budget_s": self.policy.checkpoint_budget_s,
            "level": self.policy.diagnostics_level,
            "exclude": [plan.target.host],
        }

    def run(self, record: PlanRecord, now_ns: int, *, max_steps: int = 20) -> PlanRecord:
        """Run the plan's steps until one waits, a guard holds it, or it ends."""
        for _ in range(max_steps):
            if record.status != ACTIVE or info(record.state).terminal:
                return record
            nxt = self._one(record, now_ns)
            if nxt is None:
                return record
            record = nxt
        return record

    def _one(self, record: PlanRecord, now_ns: int) -> PlanRecord | None:
        state, plan = record.state, record.plan
        approved = record.approved_step is state
        if record.interrupted is state and not info(state).idempotent and not approved:
            reason = (
                f"step {state} was interrupted (the leader stopped mid-step) and is not "
                "idempotent: check the target, then approve it to run again or reject the plan"
            )
            self.log.wait(record, HELD, "plan.interrupted", reason, now_ns)
            return None
        decision = decide(record.tier, state, approved=approved)
        if decision is Decision.RECORD:
            return None
        if decision is Decision.WAIT:
            reason = f"tier {record.tier}: step {state} waits for a named human's approval"
            self.log.wait(record, WAITING, "plan.waiting", reason, now_ns)
            return None
        if not approved:
            held = self._guard(record, now_ns)
            if held:
                self.log.wait(record, HELD, "plan.held", held, now_ns)
                return None
            if guards.rate_limited(
                self.backend.name,
                self.log.backend_ops(now_ns - 3600 * 10**9),
                now_ns,
                self.policy.guards,
            ):
                return None  # the next pass tries again; nothing is recorded
        op = info(state).op
        assert op is not None  # every non-terminal state past `detected` has one (machine.py)
        self.log.begin_step(record, state, now_ns)
        params = self.params(record, state)
        spare: dict[str, Any] | None = None
        try:
            if op is Operation.REQUEUE and self.spares is not None:
                taken = self.spares.take(
                    plan.target.pool, exclude=[plan.target.host], reason=params["reason"]
                )
                spare = {"host": taken.host if taken else None}
                if taken:
                    spare["preflight"] = taken.results
            outcome = self.backend.perform(op, plan.target, params)
            event = Event.OK if outcome.ok else Event.FAILED
            result: dict[str, Any] = outcome.to_dict()
            if spare is not None:
                result["spare"] = spare
        except BackendTimeout as exc:
            event, result = Event.TIMEOUT, {"error": str(exc)}
        except BackendError as exc:
            event, result = Event.ERROR, {"error": str(exc)}
        if state is State.DIAGNOSTICS and event is Event.OK and self._lemon(plan, now_ns):
            event = Event.LEMON
        next_state, _ = advance(plan.steps, state, event)
        status = TERMINAL_STATUS.get(next_state, ACTIVE)
        self.log.finish_step(record, state, event, result, next_state, status, now_ns)
        return PlanRecord(
            record.id, record.tenant, plan, record.tier, next_state, status, None, None
        )

    def _guard(self, record: PlanRecord, now_ns: int) -> str | None:
        """Why an automatic step may not run now (None: it may)."""
        plan, g = record.plan, self.policy.guards
        pool = plan.target.pool
        tripped = self.log.guard_tripped(pool)
        if tripped:
            return f"automatic repair of pool {pool or '-'} is stopped: {tripped}"
        if record.state is not State.CORDON:
            return None
        try:
            size = len(self.backend.pool_hosts(pool, timeout_s=30)) if pool else 0
        except BackendError as exc:
            return f"the blast radius cannot be checked: {exc}"
        window_ns = int(g.blast_radius.window_s * 1e9)
        # the plan's own host, when it is already out, adds nothing to the pool's unhealthy
        # share: a story's second plan on a host its first one cordoned must not trip the stop
        others = self.log.unhealthy_hosts(pool) - {plan.target.host}
        view = guards.PoolView(pool, size, len(others), self.log.cordons(pool, now_ns - window_ns))
        stop = guards.unhealthy_stop(view, g)
        if stop:
            self.log.trip_guard(pool, stop, now_ns)
            return stop
        return guards.blast_radius(view, now_ns, g)

    def _lemon(self, plan: Plan, now_ns: int) -> bool:
        since = now_ns - int(self.policy.guards.lemon_window_s * 1e9)
        incidents = self.log.host_incidents(plan.target.host, since)
        return guards.is_lemon(incidents, now_ns, self.policy.guards)


def dry_run(plan: Plan, rule: str, policy: Policy) -> dict[str, Any]:
    """What would happen to `plan` under `policy`, step by step, with nothing run: the tier,
    the plan's status on proposal, and per step whether it would run, wait or only record."""
    tier = policy.tier_for(plan.target.pool, plan.category)
    blocked = guards.never_cordon(plan, rule, policy.guards)
    status = OBSERVED if blocked else initial_status(tier)
    steps = []
    for state in plan.steps:
        decision = Decision.RECORD if blocked else decide(tier, state, approved=False)
        steps.append(
            {
                "step": str(state),
                "op": str(info(state).op),
                "reversible": info(state).reversible,
                "decision": str(decision),
                "explain": info(state).explain,
            }
        )
    return {
        **plan.to_dict(),
        "tier": str(tier),
        "status": status,
        "note": blocked or "",
        "would": steps,
    }
