"""`denpex server --jetstream URLS`: the replica's consumer of the ingest stream (NATS
JetStream, denpex.core.bus). Every replica pulls from one shared durable consumer, so each
message goes to one replica at a time; a message is acknowledged only after its evidence
is committed, so a replica killed mid-batch leaves it to be redelivered (to any replica)
and the store's event-id key makes the second delivery a no-op.

Each message is authenticated by its signature (denpex.enterprise: the tenant comes from the
token its subject names, never from the payload), authorised like `POST /v1/logs`
(`evidence:write` through the policy set, a denial logged), decoded by denpex.control.ingest
and, when refused for good (bad signature, malformed, another tenant or region), terminated
and written to the audit log. A store that fails is a redelivery later, never a loss.

The stream is created here when missing (replicated: `replicas`, work-queue retention: the
store is where evidence lives). It must never acknowledge a message it did not store or
refuse, and never hold the event loop while writing to the store.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa

from denpex.control import ingest
from denpex.control.db import Database
from denpex.control.denials import DenialStore
from denpex.control.residency import audit_refusal
from denpex.control.selfmetrics import ServerMetrics
from denpex.control.store import Store
from denpex.core import bus
from denpex.enterprise import (
    AuthError,
    PolicySet,
    Principal,
    Resource,
    TokenDirectory,
    authenticate_bus_message,
    authorize,
)

log = logging.getLogger("denpex.server")
ACTION = "evidence:write"


@dataclass(frozen=True, slots=True)
class BusOptions:
    servers: tuple[str, ...]
    replicas: int = 3  # the stream's replicas when this replica creates it
    durable: str = "denpex-ingest"  # the one consumer every replica pulls from
    batch: int = 256  # messages per pull
    ack_wait_s: float = 30.0  # an unacknowledged message is redelivered after this
    max_bytes: int = 8 << 30  # the stream's bound: a longer outage of the store fills it


class BusRuntime(Protocol):
    db: Database
    store: Store
    tokens: TokenDirectory
    policies: PolicySet
    denials: DenialStore
    metrics: ServerMetrics


# an ingest check beyond the payload's own (the region's residency): raises IngestError
Admit = Callable[[Principal, ingest.LogBatch | None, list[tuple[Any, ...]] | None], None]


class _Refused(Exception):
    def __init__(self, who: Principal | None, status: int, why: str) -> None:
        super().__init__(why)
        self.who, self.status, self.why = who, status, why


class BusIngest:
    """One thread with its event loop: pull, store (in a worker thread), acknowledge."""

    def __init__(self, options: BusOptions, rt: BusRuntime, admit: Admit | None = None) -> None:
        self.options = options
        self.rt = rt
        self.admit = admit
        self.stored = self.refused = self.redelivered = 0
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Event | None = None
        self._stop_asked = threading.Event()  # stop() before the loop made _stopping
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # set once subscribed

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="denpex-bus-ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread is None:
            return
        self._stop_asked.set()
        stopping = self._stopping
        if stopping is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:
                pass  # the loop closed in between: the thread is done
        self._thread.join(timeout_s)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._run())
        finally:
            self._loop.close()

    async def _run(self) -> None:
        import nats

        self._stopping = asyncio.Event()
        if self._stop_asked.is_set():
            return

        async def quiet(_exc: Exception) -> None:  # a reconnect is normal: pulls time out
            return None

        connecting = asyncio.ensure_future(
            nats.connect(
                servers=list(self.options.servers),
                name="denpex-server",
                allow_reconnect=True,
                max_reconnect_attempts=-1,  # a broker down at start: keep trying
                reconnect_time_wait=0.25,
                error_cb=quiet,
            )
        )
        stopped = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({connecting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():
            connecting.cancel()
            return
        stopped.cancel()
        nc = connecting.result()
        try:
            sub = await self._subscribe(nc)
            if sub is None:
                return
            self.ready.set()
            while not self._stopping.is_set():
                await self._pull(sub)
        finally:
            await nc.close()

    async def _subscribe(self, nc: Any) -> Any:
        """Create the stream (if missing) and bind to the durable consumer, retrying while
        the cluster elects its leaders; None when stopped first."""
        import nats.errors
        import nats.js.errors
        from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig

        js = nc.jetstream()
        stream = StreamConfig(
            name=bus.STREAM,
            subjects=[bus.SUBJECTS],
            num_replicas=self.options.replicas,
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=bus.DUPLICATE_WINDOW_S,
            max_bytes=self.options.max_bytes,
        )
        consumer = ConsumerConfig(
            durable_name=self.options.durable,
            ack_wait=self.options.ack_wait_s,
            max_ack_pending=20_000,
            max_deliver=-1,
        )
        assert self._stopping is not None
        while not self._stopping.is_set():
            try:
                try:
                    await js.stream_info(bus.STREAM)
                except nats.js.errors.NotFoundError:
                    await js.add_stream(stream)
                return await js.pull_subscribe(
                    bus.SUBJECTS, durable=self.options.durable, stream=bus.STREAM, config=consumer
                )
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                log.info("JetStream not ready yet (%s); retrying", exc)
                await asyncio.sleep(0.5)
        return None

    async def _pull(self, sub: Any) -> None:
        import nats.errors

        try:
            messages = await sub.fetch(self.options.batch, timeout=1.0)
        except (nats.errors.Error, TimeoutError, OSError):
            return  # nothing waiting, or the connection is moving to another node
        done = await asyncio.get_running_loop().run_in_executor(None, self._handle, messages)
        for message, verdict in zip(messages, done, strict=True):
            try:
                if verdict == "retry":
                    await message.nak(delay=1.0)
                elif verdict == "refused":
                    await message.term()
                else:
                    await message.ack()
            except (nats.errors.Error, TimeoutError, OSError):
                pass  # unacknowledged: redelivered after ack_wait, stored once by its ids

    # --- in a worker thread ------------------------------------------------------------------

    def _handle(self, messages: list[Any]) -> list[str]:
        for message in messages:
            if message.metadata.num_delivered > 1:
                self.redelivered += 1
        return self.handle_all([(m.subject, dict(m.headers or {}), m.data) for m in messages])

    def handle(self, subject: str, headers: dict[str, str], payload: bytes) -> str:
        """What became of one message: "stored", "refused" (for good) or "retry"."""
        return self.handle_all([(subject, headers, payload)])[0]

    def handle_all(self, messages: list[tuple[str, dict[str, str], bytes]]) -> list[str]:
        """Check every message, then store each tenant's evidence in one transaction (a
        pull's messages together: one commit, not one per message); a verdict per message."""
        verdicts = ["retry"] * len(messages)
        logs: dict[str, list[tuple[int, Principal, ingest.LogBatch]]] = {}
        now = time.time_ns()
        decided: dict[Principal, AuthError | None] = {}
        for n, (subject, headers, payload) in enumerate(messages):
            try:
                who, kind = self._check(subject, headers, payload, decided)
                if kind == "logs":
                    batch = ingest.decode_logs(
                        payload, "protobuf", tenant=who.tenant, received_ns=now
                    )
                    if self.admit is not None:
                        self.admit(who, batch, None)
                    logs.setdefault(who.tenant, []).append((n, who, batch))
                else:
                    verdicts[n] = self._store_metrics(who, payload)
            except _Refused as refused:
                verdicts[n] = self._refuse(refused.who, subject, refused.status, refused.why)
            except (AuthError, ingest.IngestError) as exc:
                verdicts[n] = self._refuse(who, subject, exc.status, exc.message)
        for tenant, items in logs.items():
            merged = ingest.LogBatch([row for _, _, b in items for row in b.rows])
            for _, _, batch in items:
                for host, (first, last) in batch.hosts.items():
                    was = merged.hosts.get(host, (first, last))
                    merged.hosts[host] = (min(was[0], first), max(was[1], last))
            try:
                stored = self.rt.store.scoped(items[0][1]).add_evidence(merged)
            except sa.exc.SQLAlchemyError as exc:
                log.warning("bus ingest: the store failed (%s); the messages come again", exc)
                continue
            self.rt.metrics.ingested.labels(tenant, "evidence").inc(stored)
            self.rt.metrics.duplicates.labels(tenant, "evidence").inc(len(merged.rows) - stored)
            for n, _, _ in items:
                verdicts[n] = "stored"
        self.stored += verdicts.count("stored")
        return verdicts

    def _check(
        self,
        subject: str,
        headers: dict[str, str],
        payload: bytes,
        decided: dict[Principal, AuthError | None],
    ) -> tuple[Principal, str]:
        """The signing token's principal, allowed to write evidence, and the message's kind.
        The policy set is asked once per principal and pull (`decided`): the same question
        gets the same answer, and asking costs more than storing a message."""
        rt = self.rt
        try:
            who = authenticate_bus_message(subject, headers, payload, rt.tokens)
        except AuthError as exc:
            raise _Refused(None, exc.status, exc.message) from None
        if who not in decided:
            resource = Resource("evidence", who.tenant)
            try:
                authorize(who, ACTION, resource, policies=rt.policies, denials=rt.denials)
                decided[who] = None
            except AuthError as exc:
                decided[who] = exc
        refusal = decided[who]
        if refusal is not None:
            raise _Refused(who, refusal.status, refusal.message)
        return who, bus.parse_subject(subject)[1]

    def _store_metrics(self, who: Principal, payload: bytes) -> str:
        rows = ingest.decode_metrics(payload, "protobuf", tenant=who.tenant)
        if self.admit is not None:
            self.admit(who, None, rows)
        try:
            stored = self.rt.store.scoped(who).add_metrics(rows)
        except sa.exc.SQLAlchemyError as exc:
            log.warning("bus ingest: the store failed (%s); the message comes again", exc)
            return "retry"
        self.rt.metrics.ingested.labels(who.tenant, "metric").inc(stored)
        return "stored"

    def _refuse(self, who: Principal | None, subject: str, status: int, why: str) -> str:
        self.refused += 1
        self.rt.metrics.rejected.labels(f"bus-{status}").inc()
        log.warning("bus ingest: refused a message on %s: %s", subject, why)
        try:
            audit_refusal(self.rt.db, who, subject, status, why)
        except sa.exc.SQLAlchemyError as exc:
            log.warning("bus ingest: the refusal could not be audited: %s", exc)
            return "retry"  # audited on the next delivery
        return "refused"
