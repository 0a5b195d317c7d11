"""`denpex server` at run time: the Runtime (store, token cache, quotas, leadership, self-
metrics), the leader loop thread (correlation — per job and the fleet rules —, retention,
partitions), the JetStream ingest consumer when `--jetstream` is given, and uvicorn.

Replicas share nothing but the database: any replica ingests and answers; the loop's work
happens only on the leader and only behind its epoch fence. It must never keep acting as
leader after a refused write, and never exit with the loop thread still writing.

A replay server (`replay=True`: recorded or simulated fleet history replayed faster than
real time) has no loop thread: its leader passes run when the replayer says, at the fleet
time it says (`replay_tick`), so that the rules' windows follow the replayed clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from denpex.control.bus_ingest import BusIngest, BusOptions
from denpex.control.correlation import correlate_tenant
from denpex.control.db import Database
from denpex.control.denials import DenialStore
from denpex.control.fleet import FleetConfig, load_fleet_rules
from denpex.control.fleet.model import Placement
from denpex.control.fleet_pass import FleetWindow
from denpex.control.global_view import publish
from denpex.control.identity_audit import IdentityAudit
from denpex.control.ingest import LogBatch
from denpex.control.leader import Leadership
from denpex.control.mfa_store import MfaStore
from denpex.control.notice_store import NoticeLedger
from denpex.control.objects import ObjectStore, open_objects
from denpex.control.paths import default_state_dir
from denpex.control.quotas import QuotaPolicy, Quotas
from denpex.control.remediation_loop import RemediationPass, RemediationThread, make_backend
from denpex.control.residency import Residency, claim_region
from denpex.control.retention import RetentionPolicy, apply_retention, ensure_partitions
from denpex.control.secrets import SecretStore
from denpex.control.selfmetrics import ServerMetrics
from denpex.control.sensitive import SensitiveEvidence
from denpex.control.signin_guard import SignInGuard
from denpex.control.similar import index_incidents
from denpex.control.sso import StoreSamlLedger
from denpex.control.store import Fence, Fenced, Store, TenantStore
from denpex.enterprise import (
    OidcConfig,
    OidcVerifier,
    Principal,
    TokenDirectory,
    TokenRecord,
    load_policies,
    open_kms,
)
from denpex.enterprise.credentials import DB_PASSWORD, open_source
from denpex.enterprise.oidc import Mapping_
from denpex.enterprise.saml import SamlConfig, SamlServiceProvider
from denpex.enterprise.signin_limits import SignInLimits
from denpex.remediation.notify import Notifier

log = logging.getLogger("denpex.server")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    url: str
    host: str = "127.0.0.1"
    port: int = 9479
    lease_s: float = 10.0
    loop_interval_s: float = 1.0
    retention_interval_s: float = 3600.0
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    quotas: QuotaPolicy = field(default_factory=QuotaPolicy)
    token_cache_s: float = 5.0
    policy_dir: str | None = None  # a Cedar policy folder (default: the bundled set)
    oidc: OidcConfig | None = None  # accept OIDC tokens from this provider too
    saml: SamlConfig | None = None  # sign people in to the UI through this SAML IdP too
    kms_url: str | None = None  # the KMS sealing stored secrets (default: a local key file)
    objects_url: str | None = None  # report archives, bundles, attachments (default: a folder)
    remediation_backend: str | None = None  # "slurm"; None: plans are proposed, never run
    diagnostics_command: tuple[str, ...] | None = None
    remediation_webhook_url: str | None = None  # the webhook backend's receiver
    notify_channels: tuple[Any, ...] = ()  # notify.Channel: where remediation notices go
    spare_checks: tuple[Any, ...] | None = None  # spares.Check: the preflight (None: spares.yaml)
    topology: Mapping[str, Placement] = field(default_factory=dict)  # host → placement
    fleet_rules: FleetConfig | None = None  # None: the packaged rules.yaml
    replay: bool = False  # no loop thread: passes run by replay_tick at the replayed time
    jetstream: tuple[str, ...] = ()  # nats:// URLs: also consume the ingest stream
    jetstream_replicas: int = 3
    jetstream_ack_wait_s: float = 30.0
    residency: Residency | None = None  # --region: this region's hosts and resident tenants
    signin_limits: SignInLimits | None = None  # None: the packaged signin_limits.yaml
    credentials: str | None = None  # k8s-volume:///PATH | k8s-secret://NS/NAME: own secrets


def kms_url(url: str | None) -> str:
    """The KMS URL in use: `url`, DENPEX_KMS, else a key file under the state dir."""
    import os

    return (
        url
        or os.environ.get("DENPEX_KMS")
        or f"file://{default_state_dir() / 'server' / 'kek.json'}"
    )


def objects_url(url: str | None) -> str:
    """The object store URL in use: `url`, DENPEX_OBJECTS, else a folder under the state dir."""
    import os

    return (
        url
        or os.environ.get("DENPEX_OBJECTS")
        or f"file://{default_state_dir() / 'server' / 'objects'}"
    )


class CachedTokens:
    """The TokenDirectory denpex.enterprise reads, with a short cache (a revoked token is
    refused within `ttl_s`)."""

    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, TokenRecord | None]] = {}
        self._lock = threading.Lock()

    def find_token(self, token_id: str) -> TokenRecord | None:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(token_id)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        record = self.store.find_token(token_id)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[token_id] = (now, record)
        return record


class Runtime:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.policies = load_policies(options.policy_dir)  # before the store: fail fast
        self.credentials = open_source(options.credentials) if options.credentials else None
        self.db = Database(options.url, password=self._credential_reader(DB_PASSWORD))
        self.schema_revision = self.db.migrate()
        self.store = Store(self.db)
        self.denials = DenialStore(self.db)
        self.oidc = OidcVerifier(options.oidc) if options.oidc is not None else None
        self.identity = IdentityAudit(self.db)
        self.signins = SignInGuard(options.signin_limits or SignInLimits.load(), self.identity)
        if options.oidc is not None:
            self.identity.sync_mappings("oidc", options.oidc.rules_by_tenant(), time.time_ns())
        self.saml: SamlServiceProvider | None = None
        if options.saml is not None:
            self.saml = SamlServiceProvider(options.saml, StoreSamlLedger(self.db))
            self.identity.sync_mappings("saml", options.saml.rules_by_tenant(), time.time_ns())
        kms = kms_url(options.kms_url)
        self.secrets = SecretStore(self.db, lambda: open_kms(kms, credentials=self.credentials))
        if kms.startswith("pkcs11:"):
            from denpex.enterprise.kms_pkcs11 import open_token

            open_token(kms)  # a wrong PIN stops the start, not a later request
        self.mfa = MfaStore(self.db, self.secrets)
        self.objects: ObjectStore = open_objects(objects_url(options.objects_url))
        self.objects.backend.check()  # fail fast: a missing bucket is a start-up error
        self.sensitive = SensitiveEvidence(self.db, lambda: self.secrets.kms)
        self.store.sealer = self.sensitive
        self.metrics = ServerMetrics()
        self.tokens: TokenDirectory = CachedTokens(self.store, options.token_cache_s)
        self.quotas = Quotas(options.quotas)
        self.leadership = Leadership(self.db, lease_s=options.lease_s)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_retention = 0.0
        self.backend = make_backend(
            options.remediation_backend,
            options.diagnostics_command,
            options.remediation_webhook_url,
        )
        self.remediation = RemediationThread(
            RemediationPass(
                self.db,
                self.store,
                self.backend,
                (
                    Notifier(
                        options.notify_channels,
                        memory=NoticeLedger(self.db),
                        attachments=self.objects.read_for,
                    )
                    if options.notify_channels
                    else None
                ),
                objects=self.objects,
                spare_checks=options.spare_checks,
            ),
            self.store.tenants,
            self._leading_fence,
            options.loop_interval_s,
        )

        self.residency = options.residency
        if self.residency is not None:
            claim_region(self.db, self.residency.region)
            if self.db.postgres:
                publish(self.db, self.residency)
        self.bus: BusIngest | None = None
        if options.jetstream:
            bus_options = BusOptions(
                options.jetstream,
                replicas=options.jetstream_replicas,
                ack_wait_s=options.jetstream_ack_wait_s,
            )
            self.bus = BusIngest(bus_options, self, self.admit_bus)

        self.fleet_rules = options.fleet_rules or load_fleet_rules()
        self.windows: dict[str, FleetWindow] = {}  # tenant → its history, this epoch's
        self._tick_lock = threading.Lock()

    def _credential_reader(self, key: str) -> Callable[[], str | None] | None:
        source = self.credentials
        return None if source is None else (lambda: source.get(key))

    def credential(self, key: str) -> str | None:
        """The server's own credential `key` from its secret source, as it is now."""
        return None if self.credentials is None else self.credentials.get(key)

    def identity_rules(self) -> list[Mapping_]:
        """Every identity-provider mapping rule (SAML's, then OIDC's): group → tenant, role."""
        found: list[Mapping_] = []
        for config in (self.options.saml, self.options.oidc):
            if config is not None:
                found.extend(config.mappings)
        return found

    def admit_bus(
        self, who: Principal, batch: LogBatch | None, rows: list[tuple[Any, ...]] | None
    ) -> None:
        """The region's residency check of a bus message (IngestError 403 when refused)."""
        if self.residency is not None:
            if batch is not None:
                self.residency.check_batch(who.tenant, batch)
            if rows is not None:
                self.residency.check_metrics(who.tenant, rows)

    def _leading_fence(self) -> Fence | None:
        state = self.leadership.state
        return self.leadership.fence if state.leader else None

    # --- the leader loop -------------------------------------------------------------------

    def start_loop(self) -> None:
        if self.bus is not None:
            self.bus.start()
        if self.options.replay:
            return  # passes come from replay_tick
        self._thread = threading.Thread(target=self._loop, name="denpex-leader", daemon=True)
        self._thread.start()
        self.remediation.start()

    def stop_loop(self, timeout: float = 10.0) -> None:
        if self.bus is not None:
            self.bus.stop(timeout)
        self.remediation.stop(timeout)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.leadership.step_down()
        self.db.dispose()

    def wake_leader(self) -> None:
        self._wake.set()
        self.remediation.wake()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick(time.time_ns())
            except Exception:
                self.metrics.loop_errors.inc()
                log.exception("leader loop pass failed")
            self._wake.wait(self.options.loop_interval_s)
            self._wake.clear()

    @property
    def replaying(self) -> bool:
        return self.options.replay

    def replay_tick(self, as_of_ns: int) -> dict[str, Any]:
        """A replay server's leader pass at fleet time `as_of_ns` (the lease keeps the wall
        clock); returns what each tenant's pass wrote."""
        if not self.options.replay:
            raise PermissionError("passes at a given time are for replay servers only")
        return self.tick(time.time_ns(), as_of_ns)

    def tick(self, now_ns: int, as_of_ns: int | None = None) -> dict[str, Any]:
        """One pass: become leader if possible, do the leader's work (fenced), renew.
        `as_of_ns` is the fleet time the rules see (default `now_ns`). Returns, per tenant,
        the fleet incident ids opened, grown and resolved."""
        with self._tick_lock:
            return self._tick(now_ns, now_ns if as_of_ns is None else as_of_ns)

    def _tick(self, now_ns: int, as_of_ns: int) -> dict[str, Any]:
        lead = self.leadership
        was = lead.state.leader
        done: dict[str, Any] = {}
        if not lead.try_acquire(now_ns):
            self._publish()
            return done
        if not was:
            log.warning("leading the correlation loop at epoch %d", lead.state.epoch)
            self.windows.clear()  # a new epoch reads the store afresh
            ensure_partitions(
                self.db, as_of_ns - 86_400 * 10**9, max(now_ns, as_of_ns) + 3 * 86_400 * 10**9
            )
        try:
            for tenant in self.store.tenants():
                window = self.windows.get(tenant)
                if window is None:
                    window = self.windows[tenant] = FleetWindow(
                        tenant, self.fleet_rules, self.options.topology
                    )
                scoped = self.store.for_leader(tenant, lead.fence)
                result = correlate_tenant(scoped, as_of_ns, window)
                self.metrics.incidents.inc(result.written)
                if result.written or not was:  # new incidents, or a new leader's backfill
                    self._index_incidents(scoped)
                done[tenant] = result.fleet
            if time.monotonic() >= self._next_retention:
                self._next_retention = time.monotonic() + self.options.retention_interval_s
                apply_retention(
                    self.store,
                    lambda t: self.store.for_leader(t, lead.fence),
                    self.options.retention,
                    as_of_ns,
                )
        except Fenced as exc:
            self.metrics.fenced.inc()
            lead.note_fenced()
            self.windows.clear()
            log.warning("no longer leader: %s", exc)
        else:
            fenced_before = lead.state.fenced
            if not lead.renew(time.time_ns()):
                if lead.state.fenced > fenced_before:
                    self.metrics.fenced.inc()
                log.warning("no longer leader: the lease could not be renewed")
                self.windows.clear()
        self._publish()
        return done

    def _index_incidents(self, scoped: TenantStore) -> None:
        """Store the vectors of incidents that have none yet (similar-incident search); a
        broken embedding model costs the search, never the pass."""
        try:
            index_incidents(scoped)
        except Fenced:
            raise
        except Exception:
            log.exception("embedding the incidents of %s failed", scoped.tenant)

    def _publish(self) -> None:
        state = self.leadership.state
        self.metrics.leader.set(1 if state.leader else 0)
        self.metrics.epoch.set(state.epoch)


def serve(options: ServerOptions) -> int:
    """Run the server until SIGINT/SIGTERM; returns the exit status."""
    import uvicorn

    from denpex.control.api import create_app

    runtime = Runtime(options)
    app = create_app(runtime)
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
    )
    server = uvicorn.Server(config)
    runtime.start_loop()
    try:
        server.run()
    finally:
        runtime.stop_loop()
    return 0 if server.started else 1
