"""The executor's PlanLog with notifications: every call goes to the wrapped log (the store,
fenced and audited) first, then the matching notice is queued (notify.Notifier): a step that
waits for a human, one that finished, a plan that is done, failed or handed to RMA.

The RMA notice names the incident's evidence bundle as an attachment: `bundle` (the control
plane's) stores it in the object store and returns file name → object, which the Jira hand-off
reads when it sends.

It must never change what the wrapped log records, nor let a notification fail a step: the
notifier only queues, and a bundle that cannot be stored is noted in the notice instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from denpex.remediation.executor import DONE, FAILED, PlanLog, PlanRecord
from denpex.remediation.machine import Event, State
from denpex.remediation.notify import Notice, Notifier

logger = logging.getLogger("denpex.remediation.notify")

# a plan → its incident's stored evidence bundle as {file name: "kind/name"}
BundleStore = Callable[[PlanRecord], Mapping[str, str]]


class NotifyingLog:
    def __init__(
        self,
        log: PlanLog,
        notifier: Notifier,
        *,
        link: str | None = None,
        bundle: BundleStore | None = None,
    ) -> None:
        self.log, self.notifier, self.link = log, notifier, link
        self.bundle = bundle

    def _rma_files(self, record: PlanRecord, detail: str) -> dict[str, Any]:
        evidence = {"step.json": detail}
        attachments: Mapping[str, str] = {}
        if self.bundle is not None and record.plan.incident_id is not None:
            try:
                attachments = self.bundle(record)
            except Exception as exc:  # the hand-off goes ahead, saying what is missing
                logger.warning("RMA of plan %s: no evidence bundle: %s", record.id, exc)
                evidence["bundle-error.txt"] = f"the evidence bundle was not stored: {exc}"
        return {"evidence": evidence, "attachments": dict(attachments)}

    def _notice(self, record: PlanRecord, kind: str, summary: str, **extra: Any) -> None:
        plan = record.plan
        self.notifier.submit(
            Notice(
                kind,
                tenant=record.tenant,
                incident_id=plan.incident_id,
                plan_id=record.id,
                host=plan.target.host,
                category=plan.category,
                summary=summary,
                link=f"{self.link.rstrip('/')}/plans/{record.id}" if self.link else None,
                **extra,
            )
        )

    def begin_step(self, record: PlanRecord, state: State, now_ns: int) -> None:
        self.log.begin_step(record, state, now_ns)

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
        self.log.finish_step(record, state, event, result, next_state, status, now_ns)
        detail = str(result.get("detail") or result.get("error") or "")
        self._notice(
            record,
            "step.finished",
            f"{state}: {event}",
            state=str(state),
            details={"detail": detail[:500], "next": str(next_state)},
        )
        if state is State.RMA and event is Event.OK:
            self._notice(
                record,
                "rma",
                f"{record.plan.target.host} leaves the pool for repair",
                state=str(state),
                **self._rma_files(record, detail),
            )
        if status == DONE:
            self._notice(record, "plan.done", f"plan done after {state}", severity="info")
        elif status == FAILED:
            self._notice(
                record, "plan.failed", f"{state} {event}: {detail[:200]}", state=str(state)
            )

    def wait(self, record: PlanRecord, status: str, kind: str, reason: str, now_ns: int) -> None:
        self.log.wait(record, status, kind, reason, now_ns)
        self._notice(
            record,
            "plan.waiting",
            reason[:300],
            state=str(record.state),
            details={"status": status, "why": kind},
        )

    def guard_tripped(self, pool: str | None) -> str | None:
        return self.log.guard_tripped(pool)

    def trip_guard(self, pool: str | None, reason: str, now_ns: int) -> None:
        self.log.trip_guard(pool, reason, now_ns)

    def cordons(self, pool: str | None, since_ns: int) -> Sequence[int]:
        return self.log.cordons(pool, since_ns)

    def unhealthy_hosts(self, pool: str | None) -> set[str]:
        return self.log.unhealthy_hosts(pool)

    def backend_ops(self, since_ns: int) -> Sequence[int]:
        return self.log.backend_ops(since_ns)

    def host_incidents(self, host: str, since_ns: int) -> Sequence[int]:
        return self.log.host_incidents(host, since_ns)
