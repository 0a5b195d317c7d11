"""Ships the node agent's evidence from the disk spool to an OTLP endpoint (at least once,
acknowledging only what the endpoint accepted) and its latest metrics (best effort).

Statuses (denpex.agent.otlp.outcome_of): 408, 429, 5xx and a redirect are retried with
backoff (at least Retry-After); 413 halves the batch, down to one record; a record refused
for good (400, 401, 403, 404, 422, or 413 alone) goes to the dead-letter segment with its
status, counted and inspectable, never silently dropped.

It must never block the callers that submit (they only append to the spool), never retry a
permanently refused batch forever, and never hang in stop().
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from denpex.agent.dead_letter import dead_letter_entry
from denpex.agent.otlp import ExportResult, encode_logs, encode_metrics
from denpex.agent.spool import Cursor
from denpex.core.events import Event, Evidence
from denpex.core.wire import WireError, evidence_from_dict, evidence_to_dict


class Exporter(Protocol):
    def export_logs(
        self, request: ExportLogsServiceRequest, *, timeout_s: float | None = None
    ) -> ExportResult: ...

    def export_metrics(
        self, request: ExportMetricsServiceRequest, *, timeout_s: float | None = None
    ) -> ExportResult: ...


class EvidenceSpool(Protocol):
    def append(self, records: list[dict[str, Any]]) -> None: ...

    def read(self, max_records: int) -> tuple[Cursor, list[dict[str, Any]]]: ...

    def ack(self, cursor: Cursor) -> None: ...

    def stats(self) -> dict[str, Any]: ...


def backoff_delay(failures: int, *, base_s: float, max_s: float, rng: random.Random) -> float:
    """Exponential backoff with jitter above a floor: uniform in [base/2, min(max, base * 2**n)]
    (not "full jitter", whose floor is 0: half the base keeps a retry from coming at once)."""
    ceiling = min(max_s, base_s * (2 ** min(failures, 30)))
    return rng.uniform(min(base_s / 2, ceiling), ceiling)


class Shipper:
    """One background thread: spool → OTLP logs, latest metric snapshot → OTLP metrics."""

    def __init__(
        self,
        spool: EvidenceSpool,
        exporter: Exporter,
        *,
        batch_size: int = 512,
        max_backoff_s: float = 30.0,
        min_backoff_s: float = 0.5,
        idle_wait_s: float = 1.0,
        seed: int | None = None,
        helps: Mapping[str, str] | None = None,
        dead_letter: EvidenceSpool | None = None,
    ) -> None:
        self.spool = spool
        self.exporter = exporter
        # refused records go here; without one they are dropped and counted (tests, --once)
        self.dead_letter = dead_letter
        self.helps = dict(helps or {})  # metric name → HELP text, sent as OTLP description
        self.batch_size = batch_size
        self.max_backoff_s = max_backoff_s
        self.min_backoff_s = min(min_backoff_s, max_backoff_s)
        self.idle_wait_s = idle_wait_s
        self._rng = random.Random(seed)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._deadline = float("inf")  # monotonic time stop() must return by
        self._thread: threading.Thread | None = None
        self._metrics_lock = threading.Lock()
        self._metrics: list[Event] | None = None
        self._failures = 0  # consecutive retryable failures
        self._retry_at = 0.0  # monotonic time before which the endpoint is left alone
        self._start_ns = time.time_ns()
        self._sent = self._failed = 0
        self._dropped: dict[str, int] = {"refused": 0, "invalid": 0, "metrics_unsent": 0}
        self._last_success_ns: int | None = None
        self._limit = batch_size  # records per export now: halved by a 413, regrown on success
        self._splits = 0
        self._dead_lettered: dict[str, int] = {}  # by status ("invalid" for non-evidence)
        self._failed_by_status: dict[str, int] = {}
        self._last_error = ""

    # --- callers ---------------------------------------------------------------------------

    def submit_evidence(self, evidence: Sequence[Evidence]) -> None:
        """Spool `evidence`; when this returns it is acknowledged (see the spool's policy)."""
        if evidence:
            self.spool.append([evidence_to_dict(e) for e in evidence])
            self._wake.set()

    def submit_metrics(self, events: Sequence[Event]) -> None:
        """Replace the metric snapshot to send; an unsent older snapshot is dropped."""
        with self._metrics_lock:
            if self._metrics is not None:
                self._dropped["metrics_unsent"] += len(self._metrics)
            self._metrics = list(events)
        self._wake.set()

    def wake(self) -> None:
        """Look at the spool now (records were put there from outside: a requeue)."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="denpex-shipper", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Deliver what can be delivered within `timeout` seconds, then stop; returns whether
        the spool was drained. Undelivered evidence stays spooled for the next start."""
        self._deadline = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout + 0.5)  # an export in flight ends by its own timeout
        return self.spool.stats()["records_pending"] == 0

    def stats(self) -> dict[str, Any]:
        """The shipper's self-metrics; counts are of log records and metric data points."""
        return {
            "sent_total": self._sent,
            "failed_total": self._failed,
            "dropped_total": sum(self._dropped.values()),
            "dropped_by_reason": dict(self._dropped),
            "last_success_ns": self._last_success_ns,
            "backlog": self.spool.stats()["records_pending"],
            "dead_lettered_total": sum(self._dead_lettered.values()),
            "dead_lettered_by_status": dict(self._dead_lettered),
            "failed_by_status": dict(self._failed_by_status),
            "split_batches_total": self._splits,
            "batch_limit": self._limit,
            "last_error": self._last_error or None,
        }

    # --- the thread ------------------------------------------------------------------------

    def _remaining(self) -> float:
        return self._deadline - time.monotonic()

    def _run(self) -> None:
        while not (self._stopping.is_set() and self._remaining() <= 0):
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                self._drop_metrics_while_down()
                if self._stopping.is_set() and wait > self._remaining():
                    return  # the endpoint is down and the deadline comes first
                if self._stopping.is_set():
                    time.sleep(wait)
                else:
                    self._stopping.wait(wait)  # stop() cuts a backoff short
                continue
            self._ship_metrics()
            shipped = self._ship_batch()
            if shipped is None:  # nothing pending
                if self._stopping.is_set():
                    return
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()

    def _timeout(self) -> float | None:
        return max(0.05, self._remaining()) if self._stopping.is_set() else None

    def _ship_batch(self) -> bool | None:
        cursor, records = self.spool.read(self._limit)
        if not records:
            return None
        evidence: list[Evidence] = []
        invalid: list[dict[str, Any]] = []
        for record in records:
            try:
                evidence.append(evidence_from_dict(record))
            except WireError:
                invalid.append(record)  # cannot become valid by waiting
        if not evidence:
            return self._refuse(cursor, invalid, None, "not denpex evidence", "invalid")
        result = self.exporter.export_logs(encode_logs(evidence), timeout_s=self._timeout())
        if result.outcome == "retryable":
            self._note_retryable(result)
            return False
        if result.outcome == "too_large" and len(records) > 1:
            self._note_failure(result)
            self._splits += 1
            self._limit = max(1, len(records) // 2)  # the same records again, in halves
            return True
        if result.outcome in ("too_large", "permanent"):
            self._note_failure(result)
            return self._refuse(cursor, records, result.status, result.message, str(result.status))
        self._note_success(len(evidence) - result.rejected)
        self._dropped["refused"] += result.rejected  # a partial success names no records
        if invalid and not self._refuse_quietly(invalid, None, "not denpex evidence", "invalid"):
            return False
        self._limit = min(self.batch_size, self._limit * 2)
        self.spool.ack(cursor)
        return True

    def _refuse(
        self,
        cursor: Cursor,
        records: list[dict[str, Any]],
        status: int | None,
        reason: str,
        key: str,
    ) -> bool:
        """Records the endpoint will never take: into the dead-letter segment, then acked;
        when even that cannot be written they stay in the spool and come again later."""
        if not self._refuse_quietly(records, status, reason, key):
            self._retry_at = time.monotonic() + self.max_backoff_s
            return False
        self.spool.ack(cursor)
        return True

    def _refuse_quietly(
        self, records: list[dict[str, Any]], status: int | None, reason: str, key: str
    ) -> bool:
        if self.dead_letter is None:
            self._dropped["invalid" if key == "invalid" else "refused"] += len(records)
            return True
        endpoint = str(getattr(self.exporter, "endpoint", ""))
        entries = [
            dead_letter_entry(r, status=status, reason=reason, endpoint=endpoint) for r in records
        ]
        try:
            self.dead_letter.append(entries)
        except Exception as exc:  # a full disk: keep them where they are
            self._last_error = f"dead-letter segment: {exc}"
            return False
        self._dead_lettered[key] = self._dead_lettered.get(key, 0) + len(records)
        return True

    def _ship_metrics(self) -> None:
        with self._metrics_lock:
            snapshot, self._metrics = self._metrics, None
        if not snapshot:
            return
        request = encode_metrics(snapshot, start_ns=self._start_ns, helps=self.helps)
        result = self.exporter.export_metrics(request, timeout_s=self._timeout())
        if result.ok:
            self._note_success(len(snapshot) - result.rejected)
            self._dropped["metrics_unsent"] += result.rejected
            return
        self._dropped["metrics_unsent"] += len(snapshot)  # best effort: never retried
        if result.outcome == "retryable":
            self._note_retryable(result)
        else:
            self._note_failure(result)

    def _drop_metrics_while_down(self) -> None:
        with self._metrics_lock:
            if self._metrics:
                self._dropped["metrics_unsent"] += len(self._metrics)
            self._metrics = None

    def _note_success(self, count: int) -> None:
        self._last_error = ""
        self._sent += count
        self._failures = 0
        self._retry_at = 0.0
        self._last_success_ns = time.time_ns()

    def _note_failure(self, result: ExportResult) -> None:
        self._failed += 1
        status = str(result.status) if result.status is not None else "network"
        self._failed_by_status[status] = self._failed_by_status.get(status, 0) + 1
        self._last_error = result.message

    def _note_retryable(self, result: ExportResult) -> None:
        self._note_failure(result)
        delay = backoff_delay(
            self._failures, base_s=self.min_backoff_s, max_s=self.max_backoff_s, rng=self._rng
        )
        if result.retry_after_s is not None:
            delay = max(delay, min(result.retry_after_s, 10 * self.max_backoff_s))
        self._failures += 1
        self._retry_at = time.monotonic() + delay
