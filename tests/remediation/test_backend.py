"""The backend contract: perform() dispatches every operation with its parameters, and an
unknown operation is refused."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from denpex.remediation.backend import (
    Backend,
    BackendError,
    NodeState,
    Operation,
    StepResult,
    Target,
    TargetKind,
    reason_text,
    result,
)


class Recording(Backend):
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def _done(self, op: Operation, target: Target, **params: object) -> StepResult:
        self.calls.append((str(op), params))
        return result(op, target, time.time_ns(), ok=True, changed=True, detail="", record={})

    def cordon(self, target, *, reason, timeout_s):
        return self._done(Operation.CORDON, target, reason=reason, timeout_s=timeout_s)

    def drain(self, target, *, reason, timeout_s):
        return self._done(Operation.DRAIN, target, reason=reason, timeout_s=timeout_s)

    def checkpoint(self, target, *, budget_s):
        return self._done(Operation.CHECKPOINT, target, budget_s=budget_s)

    def evict(self, target, *, reason, timeout_s):
        return self._done(Operation.EVICT, target, reason=reason, timeout_s=timeout_s)

    def requeue(self, target, *, exclude: Sequence[str], timeout_s):
        return self._done(Operation.REQUEUE, target, exclude=list(exclude), timeout_s=timeout_s)

    def run_diagnostics(self, target, *, level, timeout_s):
        return self._done(Operation.DIAGNOSTICS, target, level=level, timeout_s=timeout_s)

    def resume(self, target, *, reason, timeout_s):
        return self._done(Operation.RESUME, target, reason=reason, timeout_s=timeout_s)

    def rma(self, target, *, reason, timeout_s):
        return self._done(Operation.RMA, target, reason=reason, timeout_s=timeout_s)

    def state(self, target, *, timeout_s):
        return NodeState(target.host, True, False, None, ())


TARGET = Target(TargetKind.GPU, "node7", device="0000:3b:00.0", pool="gpu")


def test_perform_dispatches_every_operation_with_its_parameters() -> None:
    backend = Recording()
    for op in Operation:
        res = backend.perform(op, TARGET, {"timeout_s": 5, "reason": "denpex: x", "level": 2})
        assert res.op is op and res.ok and res.target == TARGET
    names = [name for name, _ in backend.calls]
    assert names == [str(op) for op in Operation]
    params = dict(backend.calls)
    assert params["requeue"]["exclude"] == ["node7"]  # the target itself by default
    assert params["diagnostics"]["level"] == 2
    assert params["checkpoint"]["budget_s"] == 120.0


def test_unknown_operation_is_refused() -> None:
    with pytest.raises(BackendError):
        Recording().perform("reboot", TARGET, {})  # type: ignore[arg-type]


def test_target_and_reason_round_trip() -> None:
    assert Target.from_dict(TARGET.to_dict()) == TARGET
    assert reason_text(12, "Xid 79") == "denpex: incident 12 Xid 79"
    assert reason_text(None, "x").startswith("denpex:")
