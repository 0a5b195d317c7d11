"""The remediation pass of the leader: open incidents → plans (proposed once per incident and
host, under the tenant's policy) → the executor moves active plans forward on the configured
backend. It runs in its own thread beside the correlation loop, so a long step (diagnostics)
never holds back the lease renewal; every write it makes checks the leader's fence.

It must never propose or run anything while this replica is not the leader.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from denpex.control.db import Database
from denpex.control.objects import ObjectStore
from denpex.control.objects.bundle import store_bundle
from denpex.control.remediation_store import RemediationStore
from denpex.control.spare_store import SpareStore
from denpex.control.store import Fence, Fenced, Store
from denpex.remediation import diagnostics, guards
from denpex.remediation import executor as ex
from denpex.remediation.backend import Backend, BackendError
from denpex.remediation.kube import KubernetesBackend
from denpex.remediation.notify import Notifier
from denpex.remediation.notify_log import BundleStore, NotifyingLog
from denpex.remediation.plan import derive_plans, proposals_of
from denpex.remediation.slurm import SlurmBackend
from denpex.remediation.spares import TAKEN, Check, SparePool
from denpex.remediation.webhook import WebhookBackend

log = logging.getLogger("denpex.server.remediation")
BACKENDS = ("slurm", "kubernetes", "webhook")
WEBHOOK_SECRET_ENV = "DENPEX_REMEDIATION_WEBHOOK_SECRET"  # never on a command line


def make_backend(
    name: str | None,
    diagnostics_command: Sequence[str] | None,
    webhook_url: str | None = None,
) -> Backend | None:
    if not name:
        return None
    command = tuple(diagnostics_command or diagnostics.DEFAULT_COMMAND)
    if name == "slurm":
        return SlurmBackend(diagnostics_command=command)
    if name == "kubernetes":  # in-cluster credentials, else $KUBECONFIG / ~/.kube/config
        return KubernetesBackend(diagnostics_command=command)
    if name == "webhook":
        if not webhook_url:
            raise ValueError("the webhook backend needs --remediation-webhook-url")
        secret = os.environ.get(WEBHOOK_SECRET_ENV)
        return WebhookBackend(webhook_url, secret=secret.encode() if secret else None)
    raise ValueError(f"unknown remediation backend {name!r} (one of {', '.join(BACKENDS)})")


class RemediationPass:
    def __init__(
        self,
        db: Database,
        store: Store,
        backend: Backend | None,
        notifier: Notifier | None = None,
        objects: ObjectStore | None = None,
        spare_checks: Sequence[Check] | None = None,
    ) -> None:
        self.db = db
        self.objects = objects  # where the RMA hand-off's evidence bundles are stored
        self.store = store
        self.backend = backend
        self.notifier = notifier  # notices of every step (Slack, PagerDuty, webhooks, RMA)
        self.spare_checks = spare_checks  # the spares' preflight (None: spares.yaml's)
        self._examined: dict[tuple[str, int], int] = {}

    def prepare(self) -> None:
        """Ready the backend before the first incident needs it (the Kubernetes client takes
        seconds to import and configure) and say now, not at 3 a.m., when it cannot work."""
        if self.backend is None:
            return
        why = self.backend.available()
        if why:
            log.warning("remediation backend %s is not usable here: %s", self.backend.name, why)

    def tenant_pass(self, tenant: str, fence: Fence, now_ns: int) -> int:
        """Propose plans for new incidents, then run the active ones; returns steps taken."""
        rs = RemediationStore(self.db, tenant, fence)
        policy = rs.policy()
        for incident_row in rs.open_incidents():
            key = (tenant, incident_row["id"])
            if self._examined.get(key) == incident_row["updated_ns"]:
                continue
            self._examined[key] = incident_row["updated_ns"]
            if rs.has_plans(incident_row["id"]) or rs.superseded_by(incident_row["id"]):
                continue
            self._propose(rs, policy, incident_row["id"], fence, now_ns)
        if self.backend is None:
            return 0
        taken = 0
        book = SpareStore(self.db, tenant, fence)
        spares = self.tend_spares(book, now_ns)
        before = {h: sp.status for h, sp in spares.spares.items()}
        log: ex.PlanLog = (
            NotifyingLog(rs, self.notifier, bundle=self._bundler(tenant, fence))
            if self.notifier
            else rs
        )
        executor = ex.Executor(self.backend, log, policy, spares=spares)
        for record in rs.active_plans():
            after = executor.run(record, time.time_ns())
            taken += after.state != record.state
        for host, spare in spares.spares.items():
            if spare.status == TAKEN and before.get(host) != TAKEN:
                book.save(spare, "spare.checked", "taken by a reroute", time.time_ns())
        return taken

    def _bundler(self, tenant: str, fence: Fence) -> BundleStore | None:
        """The RMA notice's bundle: stored in the tenant's objects, named by the notice."""
        if self.objects is None:
            return None
        objects = self.objects.for_leader(tenant)
        store = self.store.for_leader(tenant, fence)

        def bundle(record: ex.PlanRecord) -> dict[str, str]:
            incident_id = int(record.plan.incident_id or 0)
            stored = store_bundle(store, objects, incident_id)
            return {f"incident-{incident_id}-evidence.tar.gz": stored.ref}

        return bundle

    def tend_spares(self, book: SpareStore, now_ns: int) -> SparePool:
        """The tenant's spare pool, brought up to date: requested spares held out of service,
        removed ones given back, those due checked again; the pool a reroute takes from."""
        assert self.backend is not None
        pool = SparePool(self.backend, checks=self.spare_checks, clock=time.time)
        requested, removing = book.load(pool)
        for host in removing:
            try:
                released = pool.release(host, reason="denpex: warm spare removed from the pool")
            except BackendError as exc:
                released, why = False, str(exc)
            else:
                why = "the backend did not resume it"
            if released:
                book.drop(host, now_ns)
            else:
                pool.spares.pop(host, None)  # never offered while it waits to leave
                log.warning("spare %s not given back: %s", host, why)
        for host, pool_name in requested:
            try:
                spare = pool.enroll(host, pool_name)
            except BackendError as exc:
                book.note(host, f"not held out of service: {exc}", now_ns)
                continue
            if not book.save(
                spare, "spare.enrolled", "held out of service; preflight next", now_ns
            ):
                # removed while it was being held out: give it back rather than keep it drained
                try:
                    pool.release(host, reason="denpex: warm spare removed from the pool")
                except BackendError as exc:
                    log.warning("spare %s removed but not given back: %s", host, exc)
                pool.spares.pop(host, None)
        for host in pool.due():
            passed = pool.preflight(host)
            note = "preflight passed" if passed else "preflight failed: sent to diagnostics"
            book.save(pool.spares[host], "spare.checked", note, time.time_ns())
        return pool

    def _propose(
        self, rs: RemediationStore, policy, incident_id: int, fence: Fence, now_ns: int
    ) -> None:
        incident = self.store.for_leader(rs.tenant, fence).incident(incident_id)
        evidence = rs.incident_evidence(incident_id)
        proposals = proposals_of(incident, evidence, rs.diagnosis_actions(incident))
        pool_of: dict[str, str] = {}
        if self.backend is not None:
            for host in {p.host for p in proposals if p.host}:
                try:
                    pool = self.backend.pool_of(host, timeout_s=30)
                except BackendError as exc:
                    log.warning("pool of %s unknown: %s", host, exc)
                    continue
                if pool:
                    pool_of[host] = pool
        for plan in derive_plans(incident, proposals, pool_of=pool_of):
            if not plan.acts:
                continue
            tier = policy.tier_for(plan.target.pool, plan.category)
            status, note = ex.initial_status(tier), ""
            blocked = guards.never_cordon(plan, str(incident.get("rule", "")), policy.guards)
            if blocked:
                status, note = ex.OBSERVED, blocked
            elif self.backend is None and status == ex.ACTIVE:
                status = ex.RECOMMENDED
                note = "no remediation backend configured (denpex server --remediation-backend)"
            rs.propose(plan, tier, status, note, [e["id"] for e in evidence], now_ns)


class RemediationThread:
    """Runs RemediationPass while `leading()` says this replica leads."""

    def __init__(
        self,
        remediation: RemediationPass,
        tenants: Callable[[], list[str]],
        leading: Callable[[], Fence | None],
        interval_s: float,
    ) -> None:
        self.remediation = remediation
        self.tenants = tenants
        self.leading = leading
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="denpex-remediation", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def once(self) -> None:
        fence = self.leading()
        if fence is None:
            return
        for tenant in self.tenants():
            self.remediation.tenant_pass(tenant, fence, time.time_ns())

    def _loop(self) -> None:
        try:
            self.remediation.prepare()
        except Exception:
            log.exception("remediation backend check failed")
        while not self._stop.is_set():
            try:
                self.once()
            except Fenced as exc:
                log.warning("remediation stopped: no longer leader (%s)", exc)
            except Exception:
                log.exception("remediation pass failed")
            self._wake.wait(self.interval_s)
            self._wake.clear()
