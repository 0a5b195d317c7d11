"""The executor's decisions with a recording backend and an in-memory PlanLog: an interrupted
non-idempotent step is never re-run without a human, an interrupted idempotent one is; a
tripped guard holds automatic steps; rate limits defer without recording; a lemon goes to RMA."""

from __future__ import annotations

import time

from denpex.remediation.backend import Target, TargetKind
from denpex.remediation.executor import ACTIVE, HELD, Executor, PlanRecord, dry_run
from denpex.remediation.machine import State, plan_steps
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Tier, parse_policy
from tests.remediation.test_backend import Recording

NOW = time.time_ns()


class MemoryLog:
    def __init__(
        self,
        *,
        tripped: str | None = None,
        ops: int = 0,
        incidents: int = 0,
        unhealthy: tuple[str, ...] = (),
    ) -> None:
        self.events: list[tuple] = []
        self.unhealthy = unhealthy
        self.tripped = tripped
        self.ops = [NOW] * ops
        self.incidents = [NOW] * incidents

    def begin_step(self, record, state, now_ns):
        self.events.append(("begin", state))

    def finish_step(self, record, state, event, result, next_state, status, now_ns):
        self.events.append(("finish", state, event, next_state))

    def wait(self, record, status, kind, reason, now_ns):
        self.events.append(("wait", status, kind))

    def guard_tripped(self, pool):
        return self.tripped

    def trip_guard(self, pool, reason, now_ns):
        self.tripped = reason

    def cordons(self, pool, since_ns):
        return []

    def unhealthy_hosts(self, pool):
        return set(self.unhealthy)

    def backend_ops(self, since_ns):
        return self.ops

    def host_incidents(self, host, since_ns):
        return self.incidents


class PoolBackend(Recording):
    name = "slurm"  # policy.yaml's rate limit for it: 30 operations a minute

    def pool_hosts(self, pool, *, timeout_s):
        return tuple(f"n{i}" for i in range(10))


PLAN = Plan(
    1,
    "gpu.fallen_off_bus",
    "job_root_cause",
    Target(TargetKind.HOST, "n1", None, "gpu"),
    ("drain_node",),
    plan_steps(["drain_node"]),
    "",
)
POLICY = parse_policy({"tier": "autoremediate"})


def record(state: State, *, interrupted: State | None = None, approved: State | None = None):
    return PlanRecord(1, "acme", PLAN, Tier.AUTOREMEDIATE, state, ACTIVE, approved, interrupted)


def test_interrupted_non_idempotent_step_waits_for_a_human() -> None:
    backend, log = PoolBackend(), MemoryLog()
    after = Executor(backend, log, POLICY).run(record(State.EVICT, interrupted=State.EVICT), NOW)
    assert backend.calls == [] and log.events == [("wait", HELD, "plan.interrupted")]
    assert after.state is State.EVICT
    # approved by a human: it runs (once), and the plan goes on
    backend, log = PoolBackend(), MemoryLog()
    rec = record(State.EVICT, interrupted=State.EVICT, approved=State.EVICT)
    after = Executor(backend, log, POLICY).run(rec, NOW)
    assert [name for name, _ in backend.calls][:1] == ["evict"]
    assert after.state is State.DONE


def test_interrupted_idempotent_step_runs_again() -> None:
    backend, log = PoolBackend(), MemoryLog()
    rec = record(State.DIAGNOSTICS, interrupted=State.DIAGNOSTICS)
    after = Executor(backend, log, POLICY).run(rec, NOW)
    assert [name for name, _ in backend.calls] == ["diagnostics", "resume"]
    assert after.state is State.DONE


def test_tripped_guard_holds_and_rate_limit_defers() -> None:
    backend, log = PoolBackend(), MemoryLog(tripped="3 of 10 unhealthy")
    Executor(backend, log, POLICY).run(record(State.CORDON), NOW)
    assert backend.calls == [] and log.events == [("wait", HELD, "plan.held")]
    backend, log = PoolBackend(), MemoryLog(ops=30)  # 30 in the last minute: the limit
    after = Executor(backend, log, POLICY).run(record(State.CORDON), NOW)
    assert backend.calls == [] and log.events == [] and after.state is State.CORDON


def test_the_plans_own_host_already_out_does_not_trip_the_unhealthy_stop() -> None:
    # 2 of 10 unhealthy is the 20 % stop; when one of them is the plan's own host (a second
    # plan on a host the first one cordoned) the pool is no worse for this cordon
    backend, log = PoolBackend(), MemoryLog(unhealthy=("n1", "n2"))
    Executor(backend, log, POLICY).run(record(State.CORDON), NOW)
    assert backend.calls[0][0] == "cordon" and log.tripped is None
    backend, log = PoolBackend(), MemoryLog(unhealthy=("n2", "n3"))
    Executor(backend, log, POLICY).run(record(State.CORDON), NOW)
    assert backend.calls == [] and log.tripped and "2 of 10" in log.tripped


def test_a_lemon_goes_to_rma_not_back_to_service() -> None:
    backend, log = PoolBackend(), MemoryLog(incidents=3)
    after = Executor(backend, log, POLICY).run(record(State.DIAGNOSTICS), NOW)
    assert [name for name, _ in backend.calls] == ["diagnostics", "rma"]
    assert ("finish", State.DIAGNOSTICS, "lemon", State.RMA) in log.events
    assert after.state is State.DONE


def test_dry_run_says_what_each_tier_would_do() -> None:
    autosafe = dry_run(PLAN, "job_root_cause", parse_policy({"tier": "autosafe"}))
    decisions = {s["step"]: s["decision"] for s in autosafe["would"]}
    assert decisions["cordon"] == "run" and decisions["evict"] == "wait"
    fleet = dry_run(PLAN, "fleet_wide", POLICY)
    assert fleet["status"] == "observed" and "never cordons" in fleet["note"]
    assert {s["decision"] for s in fleet["would"]} == {"record"}
