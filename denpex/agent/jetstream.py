"""The agent's exporter to NATS JetStream (`server.jetstream` in agent.yaml): the same
Exporter the shipper drives for OTLP/HTTP, publishing each batch as one OTLP protobuf
message on the token's subject (denpex.core.bus), signed with the token, and reporting
success only once the stream acknowledged it (stored on a quorum of its replicas).

The disk spool stays the source of truth: a batch leaves it only after that ack, so a broker
outage or a leader change delays evidence and loses none. A republished batch carries the
same message id (from its event ids) and the stream drops the copy; past the stream's window
the server's store drops it by event id.

nats-py is asyncio: one event-loop thread per exporter, the shipper's thread waits on it.
It must never block the shipper past the timeout it was given, and never report a batch
delivered that the stream did not acknowledge.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from denpex.agent.otlp import ExportResult, Outcome
from denpex.core import bus
from denpex.enterprise.tokens import hash_secret, parse_token


class JetStreamExporter:
    """Publishes OTLP requests to JetStream; `close()` ends its connection and loop."""

    def __init__(
        self, servers: Sequence[str], token: str, *, timeout_s: float = 10.0, name: str = ""
    ) -> None:
        parsed = parse_token(token)
        if parsed is None:
            raise ValueError("server.token_file: not a denpex bearer token (dpx_<id>_<secret>)")
        if not servers:
            raise ValueError("server.jetstream.servers: at least one nats:// URL")
        self.token_id, secret = parsed
        self._secret_hash = hash_secret(secret)
        self.servers = [str(s) for s in servers]
        self.endpoint = ",".join(self.servers)  # what dead-letter entries name
        self.timeout_s = timeout_s
        self.name = name or f"denpex-agent-{self.token_id}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="denpex-jetstream", daemon=True
        )
        self._thread.start()
        self._nc: Any = None
        self._connecting: asyncio.Task[Any] | None = None

    # --- the Exporter protocol -------------------------------------------------------------

    def export_logs(
        self, request: ExportLogsServiceRequest, *, timeout_s: float | None = None
    ) -> ExportResult:
        ids = [
            kv.value.string_value
            for resource_logs in request.resource_logs
            for scope_logs in resource_logs.scope_logs
            for record in scope_logs.log_records
            for kv in record.attributes
            if kv.key == "denpex.event_id"
        ]
        return self._publish("logs", ids, request.SerializeToString(), timeout_s)

    def export_metrics(
        self, request: ExportMetricsServiceRequest, *, timeout_s: float | None = None
    ) -> ExportResult:
        return self._publish("metrics", [], request.SerializeToString(), timeout_s)

    def close(self, timeout_s: float = 2.0) -> None:
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout_s)
        except (FutureTimeout, RuntimeError):
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    # --- inside the loop -------------------------------------------------------------------

    def _publish(
        self, kind: str, event_ids: list[str], payload: bytes, timeout_s: float | None
    ) -> ExportResult:
        timeout = self.timeout_s if timeout_s is None else max(0.05, timeout_s)
        name = bus.subject(self.token_id, kind)
        msg_id = bus.message_id(kind, event_ids, payload)
        headers = {
            bus.MSG_ID: msg_id,
            bus.SIGNATURE: bus.sign(self._secret_hash, name, msg_id, payload),
        }
        future = asyncio.run_coroutine_threadsafe(
            self._send(name, payload, headers, timeout), self._loop
        )
        try:
            return future.result(timeout + 0.5)
        except FutureTimeout:
            future.cancel()
            return ExportResult("retryable", None, None, 0, f"{name}: no ack within {timeout} s")

    async def _send(
        self, name: str, payload: bytes, headers: dict[str, str], timeout: float
    ) -> ExportResult:
        import nats.errors
        import nats.js.errors

        try:
            nc = await asyncio.wait_for(asyncio.shield(self._connection()), timeout)
            ack = await nc.jetstream().publish(
                name, payload, timeout=timeout, stream=bus.STREAM, headers=headers
            )
        except nats.errors.MaxPayloadError as exc:
            return ExportResult("too_large", 413, None, 0, f"{name}: {exc}")
        except nats.js.errors.APIError as exc:
            code = exc.code or 0
            outcome: Outcome = "too_large" if code == 413 else "retryable"
            if code in (400, 401, 403, 404) and exc.err_code != 10060:  # 10060: wrong stream
                outcome = "permanent"
            return ExportResult(outcome, code or None, None, 0, f"{name}: JetStream {exc}")
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            return ExportResult("retryable", None, None, 0, f"{name}: {type(exc).__name__} {exc}")
        return ExportResult("success", 200, None, 0, f"stream seq {ack.seq}")

    async def _connection(self) -> Any:
        if self._nc is not None and not self._nc.is_closed:
            return self._nc
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._connect())
        self._nc = await self._connecting
        return self._nc

    async def _connect(self) -> Any:
        import nats

        async def quiet(_exc: Exception) -> None:  # reconnects are normal; results say more
            return None

        return await nats.connect(
            servers=self.servers,
            name=self.name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            connect_timeout=2,
            error_cb=quiet,
        )

    async def _close(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()
