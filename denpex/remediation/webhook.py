"""The webhook backend, for bare metal and any site tool: each plan step is POSTed as signed
JSON (denpex.core.webhook_signature) to one configured URL, retried with backoff
(delivery.py), and the receiver's answer is the step's result, recorded whole (it reaches the
audit as the step's `answer`).

The receiver's contract (README "Remediation", webhook backend): a 2xx JSON answer
`{"ok": bool, "changed": bool, "detail": str}` for an operation, and for `state`
`{"schedulable": bool, "drained": bool, "reason": str|null, "jobs": [..]}`. It must never
report a step done that the receiver did not answer with ok: no answer is an error.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from denpex.core.audit import canonical
from denpex.remediation import delivery
from denpex.remediation.backend import (
    Backend,
    BackendError,
    BackendTimeout,
    NodeState,
    Operation,
    StepResult,
    Target,
    result,
)

SCHEMA = "denpex.remediation.step/v1"


def delivery_key(op: str, target: Target, params: Mapping[str, Any]) -> str:
    """The same step (op, target, parameters: the reason names the incident) has the same
    key on every try and after a leader change, so a receiver can drop a duplicate."""
    digest = hashlib.sha256(canonical([op, target.to_dict(), dict(params)])).hexdigest()
    return f"step-{digest[:32]}"


class WebhookBackend(Backend):
    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        secret: bytes | None,
        attempts: int | None = None,
        timeout_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url, self.secret = url, secret
        self.attempts, self.timeout_s, self.sleep = attempts, timeout_s, sleep

    def available(self) -> str | None:
        if not self.url.startswith(("http://", "https://")):
            return f"webhook: {self.url!r} is not an http(s) URL"
        if self.secret is None:
            return "webhook: no signing secret (DENPEX_REMEDIATION_WEBHOOK_SECRET)"
        return None

    def _send(
        self, op: str, target: Target, params: Mapping[str, Any], *, key: str | None = None
    ) -> tuple[Mapping[str, Any], delivery.Delivery]:
        body = {
            "schema": SCHEMA,
            "op": op,
            "target": target.to_dict(),
            "params": dict(params),
            "sent_ns": time.time_ns(),
        }
        key = key or delivery_key(op, target, params)
        timeout = float(params.get("timeout_s", 0)) or self.timeout_s
        sent = delivery.post(
            self.url,
            body,
            delivery=key,
            secret=self.secret,
            attempts=self.attempts,
            timeout_s=timeout,
            sleep=self.sleep,
        )
        if sent.status is None:
            kind = BackendTimeout if "Timeout" in (sent.error or "") else BackendError
            raise kind(f"webhook: {op} on {target.host}: no answer ({sent.error})")
        if not sent.ok:
            raise BackendError(
                f"webhook: {op} on {target.host}: the receiver answered {sent.status} "
                f"{str(sent.answer)[:200]}"
            )
        if not isinstance(sent.answer, Mapping):
            raise BackendError(f"webhook: {op} on {target.host}: the answer is not a JSON object")
        return sent.answer, sent

    def _step(self, op: Operation, target: Target, params: Mapping[str, Any]) -> StepResult:
        started = time.time_ns()
        answer, sent = self._send(str(op), target, params)
        return result(
            op,
            target,
            started,
            ok=answer.get("ok") is True,
            changed=bool(answer.get("changed", True)),
            detail=str(answer.get("detail") or f"{op} answered by {self.url}"),
            record={"answer": dict(answer), "delivery": sent.to_dict()},
        )

    def perform(self, op: Operation, target: Target, params: Mapping[str, Any]) -> StepResult:
        return self._step(op, target, params)

    def cordon(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._step(Operation.CORDON, target, {"reason": reason, "timeout_s": timeout_s})

    def drain(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._step(Operation.DRAIN, target, {"reason": reason, "timeout_s": timeout_s})

    def checkpoint(self, target: Target, *, budget_s: float) -> StepResult:
        return self._step(Operation.CHECKPOINT, target, {"budget_s": budget_s})

    def evict(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._step(Operation.EVICT, target, {"reason": reason, "timeout_s": timeout_s})

    def requeue(self, target: Target, *, exclude: Sequence[str], timeout_s: float) -> StepResult:
        params = {"exclude": list(exclude), "timeout_s": timeout_s}
        return self._step(Operation.REQUEUE, target, params)

    def run_diagnostics(self, target: Target, *, level: int, timeout_s: float) -> StepResult:
        params = {"level": level, "timeout_s": timeout_s}
        return self._step(Operation.DIAGNOSTICS, target, params)

    def resume(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._step(Operation.RESUME, target, {"reason": reason, "timeout_s": timeout_s})

    def rma(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._step(Operation.RMA, target, {"reason": reason, "timeout_s": timeout_s})

    def state(self, target: Target, *, timeout_s: float) -> NodeState:
        # a read: a fresh key each time (it is never a duplicate of an earlier read)
        key = f"state-{uuid.uuid4().hex}"
        answer, _ = self._send("state", target, {"timeout_s": timeout_s}, key=key)
        try:
            return NodeState(
                target.host,
                schedulable=bool(answer["schedulable"]),
                drained=bool(answer["drained"]),
                reason=answer.get("reason"),
                jobs=tuple(str(j) for j in answer.get("jobs", [])),
                raw=dict(answer),
            )
        except KeyError as exc:
            raise BackendError(f"webhook: the state answer lacks {exc}") from None

    def pool_hosts(self, pool: str, *, timeout_s: float) -> tuple[str, ...]:
        key = f"pool-{uuid.uuid4().hex}"
        probe = Target.from_dict({"kind": "host", "host": "-", "pool": pool})
        answer, _ = self._send("pool_hosts", probe, {"timeout_s": timeout_s}, key=key)
        hosts = answer.get("hosts")
        if not isinstance(hosts, list):
            raise BackendError(f"webhook: the receiver did not list the hosts of pool {pool!r}")
        return tuple(sorted(str(h) for h in hosts))
