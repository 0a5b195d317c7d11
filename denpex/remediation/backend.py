"""The contract every remediation backend (Slurm, Kubernetes, a webhook) implements: one
method per operation, each idempotent, each bounded by a timeout, each returning what it did
together with the backend's own record of it.

A backend must never report success it did not read back: `changed` says whether this call
altered anything, and `record` holds what the scheduler itself said (its state after the
call), so an operator can check it. An operation a backend cannot perform raises
BackendError with the reason, never a silent no-op.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Operation(StrEnum):
    """What a plan step asks of a backend (the `op` of a step in machine.yaml)."""

    CORDON = "cordon"  # no new work lands on the target
    DRAIN = "drain"  # running work is let finish or moved; the target empties
    CHECKPOINT = "checkpoint"  # the target's jobs are asked to save their state
    EVICT = "evict"  # the target's jobs are stopped (after the checkpoint)
    REQUEUE = "requeue"  # the evicted jobs go back to the queue, excluding the target
    DIAGNOSTICS = "diagnostics"  # hardware diagnostics (DCGM level 3 by default)
    RESUME = "resume"  # the target returns to service
    RMA = "rma"  # the target leaves the pool for repair


class TargetKind(StrEnum):
    HOST = "host"
    GPU = "gpu"
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class Target:
    """What a plan acts on. A GPU or a switch is acted on through its host(s): a scheduler
    cordons nodes, not devices."""

    kind: TargetKind
    host: str  # the node the backend acts on
    device: str | None = None  # GPU index/UUID/PCI id, or the switch's name
    pool: str | None = None  # partition (Slurm) or node pool (Kubernetes)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "host": self.host, "device": self.device, "pool": self.pool}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        return cls(TargetKind(data["kind"]), data["host"], data.get("device"), data.get("pool"))


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as the backend reads it back."""

    host: str
    schedulable: bool  # new work may land on it
    drained: bool  # cordoned AND no work left on it
    reason: str | None  # the reason the backend holds (ours start with "denpex:")
    jobs: tuple[str, ...]  # the backend's ids of the work running on it
    raw: Mapping[str, Any] = field(default_factory=dict)  # what the backend said, verbatim

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "schedulable": self.schedulable,
            "drained": self.drained,
            "reason": self.reason,
            "jobs": list(self.jobs),
            "raw": dict(self.raw),
        }


@dataclass(frozen=True, slots=True)
class StepResult:
    """The outcome of one operation. `ok` False means the operation ran and failed (the
    plan takes its failure edge); a timeout raises BackendTimeout instead."""

    op: Operation
    target: Target
    ok: bool
    changed: bool  # False: the target was already in the requested state (idempotent call)
    detail: str  # one line a person reads
    record: Mapping[str, Any]  # the backend's own record (its state after the call, its ids)
    started_ns: int
    ended_ns: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": str(self.op),
            "target": self.target.to_dict(),
            "ok": self.ok,
            "changed": self.changed,
            "detail": self.detail,
            "record": dict(self.record),
            "started_ns": self.started_ns,
            "ended_ns": self.ended_ns,
        }


class BackendError(RuntimeError):
    """The backend cannot perform the operation (unreachable, refused, unsupported)."""


class BackendTimeout(BackendError):
    """The operation did not finish within its timeout; its effect is unknown until the
    state is read back."""


REASON_PREFIX = "denpex:"


def reason_text(incident_id: int | None, text: str) -> str:
    """The reason a backend stores with a cordon or drain: recognisably ours."""
    ref = f" incident {incident_id}" if incident_id is not None else ""
    return f"{REASON_PREFIX}{ref} {text}".strip()


class Backend(ABC):
    """One scheduler or cluster. Every operation is idempotent: calling it again on a target
    already in the requested state returns ok with changed=False."""

    name: str = "backend"

    def available(self) -> str | None:
        """None when usable here; otherwise why not (a missing binary, no credentials)."""
        return None

    @abstractmethod
    def cordon(self, target: Target, *, reason: str, timeout_s: float) -> StepResult: ...

    @abstractmethod
    def drain(self, target: Target, *, reason: str, timeout_s: float) -> StepResult: ...

    @abstractmethod
    def checkpoint(self, target: Target, *, budget_s: float) -> StepResult: ...

    @abstractmethod
    def evict(self, target: Target, *, reason: str, timeout_s: float) -> StepResult: ...

    @abstractmethod
    def requeue(
        self, target: Target, *, exclude: Sequence[str], timeout_s: float
    ) -> StepResult: ...

    @abstractmethod
    def run_diagnostics(self, target: Target, *, level: int, timeout_s: float) -> StepResult: ...

    @abstractmethod
    def resume(self, target: Target, *, reason: str, timeout_s: float) -> StepResult: ...

    @abstractmethod
    def rma(self, target: Target, *, reason: str, timeout_s: float) -> StepResult: ...

    @abstractmethod
    def state(self, target: Target, *, timeout_s: float) -> NodeState: ...

    def pool_of(self, host: str, *, timeout_s: float) -> str | None:
        """The partition or node pool `host` belongs to (None: the backend has no pools)."""
        return None

    def pool_hosts(self, pool: str, *, timeout_s: float) -> tuple[str, ...]:
        """Every node of `pool` (the blast-radius guard's denominator)."""
        raise BackendError(f"{self.name}: cannot list the nodes of pool {pool!r}")

    def perform(self, op: Operation, target: Target, params: Mapping[str, Any]) -> StepResult:
        """Run `op` with the step's parameters (what the executor calls)."""
        timeout_s = float(params.get("timeout_s", 60.0))
        reason = str(params.get("reason", REASON_PREFIX))
        if op is Operation.CORDON:
            return self.cordon(target, reason=reason, timeout_s=timeout_s)
        if op is Operation.DRAIN:
            return self.drain(target, reason=reason, timeout_s=timeout_s)
        if op is Operation.CHECKPOINT:
            return self.checkpoint(target, budget_s=float(params.get("budget_s", 120.0)))
        if op is Operation.EVICT:
            return self.evict(target, reason=reason, timeout_s=timeout_s)
        if op is Operation.REQUEUE:
            exclude = list(params.get("exclude", [])) or [target.host]
            return self.requeue(target, exclude=exclude, timeout_s=timeout_s)
        if op is Operation.DIAGNOSTICS:
            level = int(params.get("level", 3))
            return self.run_diagnostics(target, level=level, timeout_s=timeout_s)
        if op is Operation.RESUME:
            return self.resume(target, reason=reason, timeout_s=timeout_s)
        if op is Operation.RMA:
            return self.rma(target, reason=reason, timeout_s=timeout_s)
        raise BackendError(f"{self.name}: no operation {op!r}")


def result(
    op: Operation,
    target: Target,
    started_ns: int,
    *,
    ok: bool,
    changed: bool,
    detail: str,
    record: Mapping[str, Any],
) -> StepResult:
    """A StepResult ending now (the helper backends build their answers with)."""
    return StepResult(op, target, ok, changed, detail, dict(record), started_ns, time.time_ns())
