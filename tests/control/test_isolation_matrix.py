"""The tenant isolation matrix: two tenants drive every endpoint and method of a real
`denpex server` (taken from its own /openapi.json and the web UI's route table, the UI's
pages and forms through a logged-in session: an endpoint the matrix has no request for
fails the test) with seeded random interleaved requests, each probing the other tenant's ids
and names; then the store is read past the application. 0 rows of one tenant may be seen
or changed by the other. The same matrix runs on SQLite and on PostgreSQL, where the
catalog is checked too: every table with a tenant column has row-level security ENABLEd and
FORCEd, or is closed to the tenant role."""

from __future__ import annotations

import gzip
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from denpex.agent.otlp import encode_logs, encode_metrics, serialise
from denpex.control.ui.session import COOKIE
from denpex.core.events import metric
from tests.control.conftest import ServerProcess, mint
from tests.control.helpers import T0, evidence, report

TENANTS = ("red", "blue")
HOSTS = ("node1", "node2", "node3")  # both tenants use the same host and job names
JOBS = ("train-a", "train-b")
GPUS = ("1650000000001", "GPU-5f0e3a1c-0000-4e56-8d2f-000000000001")  # a serial, a UUID
PROTOBUF = {"Content-Type": "application/x-protobuf"}
SCIM = {"Content-Type": "application/scim+json"}
SCIM_USER = "urn:ietf:params:scim:schemas:core:2.0:User"


def mark(tenant: str) -> str:
    """A string only `tenant`'s data contains (in ids, users, labels)."""
    return f"MARK{tenant.upper()}"


@dataclass
class Side:
    tenant: str
    tokens: dict[str, str]
    sessions: dict[str, tuple[str, str]] = field(default_factory=dict)  # role → cookie, CSRF
    evidence: list[str] = field(default_factory=list)
    reports: list[str] = field(default_factory=list)
    incidents: list[int] = field(default_factory=list)
    plans: list[int] = field(default_factory=list)  # remediation plans the leader derived
    spares: list[str] = field(default_factory=list)  # warm spares only this tenant names
    scim_users: list[str] = field(default_factory=list)  # SCIM ids its provisioner made
    sent: int = 0


@dataclass
class Tally:
    requests: int = 0
    probes: int = 0  # requests that named the other tenant's ids
    seen: int = 0  # responses carrying the other tenant's data
    changed: int = 0  # rows of one tenant written or altered by the other
    by_route: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


Request = tuple[str, str, str, dict[str, Any], Callable[[httpx.Response], bool]]


def ok(*codes: int) -> Callable[[httpx.Response], bool]:
    return lambda reply: reply.status_code in codes


class Matrix:
    """One generator per (method, route): each returns the role to ask as, the method, the
    URL, the request's arguments and what its answer must be."""

    def __init__(self, rng: random.Random, sides: dict[str, Side]) -> None:
        self.rng = rng
        self.sides = sides
        self.generators: dict[tuple[str, str], Callable[[Side, Side], Request]] = {
            ("GET", "/healthz"): lambda me, other: self.read("/healthz"),
            ("GET", "/metrics"): lambda me, other: self.read("/metrics"),
            ("POST", "/v1/logs"): self.post_logs,
            ("POST", "/v1/metrics"): self.post_metrics,
            ("POST", "/api/v1/reports"): self.post_report,
            ("GET", "/api/v1/incidents"): lambda me, other: self.read(
                "/api/v1/incidents", **self.filters("status", "host", "job", "category")
            ),
            ("GET", "/api/v1/incidents/{incident_id}"): self.get_incident,
            ("GET", "/api/v1/incidents/{incident_id}/summary"): self.get_summary,
            ("GET", "/api/v1/incidents/similar"): lambda me, other: (
                "viewer",
                "GET",
                "/api/v1/incidents/similar",
                # the other tenant's words as the query: its incidents must still not come back
                {"params": {"q": f"GPU fell off the bus {mark(other.tenant)}", "k": 5}},
                ok(200, 503),  # 503: this server has no retrieval extra installed
            ),
            ("POST", "/api/v1/incidents/{incident_id}/acknowledge"): self.transition,
            ("POST", "/api/v1/incidents/{incident_id}/resolve"): self.transition,
            ("GET", "/api/v1/hosts"): lambda me, other: self.read("/api/v1/hosts"),
            ("GET", "/api/v1/hosts/{host}"): lambda me, other: self.read(
                f"/api/v1/hosts/{self.rng.choice(HOSTS)}"
            ),
            ("GET", "/api/v1/jobs"): lambda me, other: self.read(
                "/api/v1/jobs", **self.filters("job", "host", "category", "user")
            ),
            ("GET", "/api/v1/jobs/{job}"): self.get_job,
            ("GET", "/api/v1/gpus/{gpu}/jobs"): lambda me, other: self.read(
                f"/api/v1/gpus/{self.rng.choice(GPUS)}/jobs"
            ),
            ("GET", "/api/v1/reports/{report_id}"): self.get_report,
            # the object store: a report as received, an incident's evidence bundle (tar.gz)
            ("GET", "/api/v1/reports/{report_id}/archive"): lambda me, other: self.by_id(
                "/api/v1/reports/{}/archive", me, other, "reports"
            ),
            ("GET", "/api/v1/incidents/{incident_id}/bundle"): lambda me, other: self.by_id(
                "/api/v1/incidents/{}/bundle", me, other, "incidents"
            ),
            ("GET", "/api/v1/evidence"): lambda me, other: self.read(
                "/api/v1/evidence", **self.filters("host", "job", "category")
            ),
            ("GET", "/api/v1/evidence/{evidence_id}"): self.get_evidence,
            ("GET", "/api/v1/denials"): lambda me, other: (
                "auditor",
                "GET",
                "/api/v1/denials",
                {},
                ok(200),
            ),
            ("GET", "/api/v1/secrets"): lambda me, other: (
                "admin",
                "GET",
                "/api/v1/secrets",
                {},
                ok(200),
            ),
            ("PUT", "/api/v1/secrets/{name}"): self.put_secret,
            # remediation: plans, decisions, dry-runs, guards and the tenant's policy
            ("GET", "/api/v1/remediation/plans"): lambda me, other: self.read(
                "/api/v1/remediation/plans"
            ),
            ("GET", "/api/v1/remediation/plans/{plan_id}"): self.get_plan,
            ("POST", "/api/v1/remediation/plans/{plan_id}/approve"): self.decide_plan,
            ("POST", "/api/v1/remediation/plans/{plan_id}/reject"): self.decide_plan,
            ("GET", "/api/v1/remediation/dry-run/{incident_id}"): self.dry_run,
            ("GET", "/api/v1/remediation/guards"): lambda me, other: self.read(
                "/api/v1/remediation/guards"
            ),
            ("POST", "/api/v1/remediation/guards/reset"): lambda me, other: (
                "approver",
                "POST",
                "/api/v1/remediation/guards/reset",
                {"json": {"pool": self.rng.choice(("gpu", "cpu")), "by": f"sre-{mark(me.tenant)}"}},
                ok(200),
            ),
            ("GET", "/api/v1/remediation/policy"): lambda me, other: self.read(
                "/api/v1/remediation/policy"
            ),
            ("PUT", "/api/v1/remediation/policy"): lambda me, other: (
                "admin",
                "PUT",
                "/api/v1/remediation/policy",
                {"json": {"tier": self.rng.choice(("observe", "recommend", "approve"))}},
                ok(200),
            ),
            # the warm-spare pool: both tenants add hosts of the same names, and their own
            ("GET", "/api/v1/remediation/spares"): lambda me, other: self.read(
                "/api/v1/remediation/spares"
            ),
            ("GET", "/api/v1/remediation/spares/{host}"): self.get_spare,
            ("POST", "/api/v1/remediation/spares"): self.add_spare,
            ("DELETE", "/api/v1/remediation/spares/{host}"): self.remove_spare,
            # the web UI: pages and forms of a session, as the browser sends them
            ("GET", "/login"): lambda me, other: self.page(me, "GET", "/login", ok(200, 303)),
            ("POST", "/login"): lambda me, other: self.page(
                me, "POST", "/login", ok(303), form={"token": me.tokens["viewer"], "next": "/"}
            ),
            ("POST", "/logout"): lambda me, other: self.page(me, "POST", "/logout", ok(303)),
            # single sign-on: this server has no OIDC web client, so both say so (404)
            ("GET", "/login/oidc"): lambda me, other: self.page(me, "GET", "/login/oidc", ok(404)),
            ("GET", "/login/oidc/callback"): lambda me, other: self.page(
                me, "GET", "/login/oidc/callback", ok(404), params={"state": mark(other.tenant)}
            ),
            ("GET", "/"): lambda me, other: self.page(
                me, "GET", "/", ok(200), params={"q": self.rng.choice(("", mark(other.tenant)))}
            ),
            ("GET", "/incidents/{incident_id}"): self.incident_page,
            ("POST", "/incidents/{incident_id}/{verb}"): self.incident_form,
            ("GET", "/evidence/{evidence_id:path}"): self.evidence_page,
            ("GET", "/hosts/{host}"): lambda me, other: self.page(
                me, "GET", f"/hosts/{self.rng.choice(HOSTS)}", ok(200, 404)
            ),
            ("GET", "/jobs"): lambda me, other: self.page(
                me, "GET", "/jobs", ok(200), params=self.filters("job", "host", "category", "user")
            ),
            # SAML sign-in: this server has no --saml, so each answers 404 (tests/enterprise)
            ("GET", "/saml/metadata"): lambda me, other: self.page(
                me, "GET", "/saml/metadata", ok(404)
            ),
            ("GET", "/saml/login"): lambda me, other: self.page(me, "GET", "/saml/login", ok(404)),
            ("POST", "/saml/acs"): lambda me, other: (
                "viewer",
                "POST",
                "/saml/acs",
                {"data": {"SAMLResponse": mark(other.tenant)}},
                ok(404),
            ),
            # second factors: the tenant's setting (API) and a session's own factor (UI)
            ("GET", "/api/v1/tenant/mfa"): lambda me, other: (
                "admin",
                "GET",
                "/api/v1/tenant/mfa",
                {},
                ok(200),
            ),
            ("PUT", "/api/v1/tenant/mfa"): lambda me, other: (
                "admin",
                "PUT",
                "/api/v1/tenant/mfa",
                {"json": {"required": self.rng.random() < 0.5}},
                ok(200),
            ),
            # these sessions owe no code: the code page and form say so
            ("GET", "/login/mfa"): lambda me, other: self.page(me, "GET", "/login/mfa", ok(409)),
            ("POST", "/login/mfa"): lambda me, other: self.page(
                me, "POST", "/login/mfa", ok(409), form={"code": "123456"}
            ),
            ("GET", "/mfa"): lambda me, other: self.page(me, "GET", "/mfa", ok(200)),
            ("POST", "/mfa/enrol"): lambda me, other: self.page(me, "POST", "/mfa/enrol", ok(200)),
            ("POST", "/mfa/confirm"): lambda me, other: self.page(
                me, "POST", "/mfa/confirm", ok(400), form={"code": "000000"}
            ),
            # security keys (JSON, CSRF in a header): options for my session; the rest owe
            # a challenge or a pending sign-in these sessions do not have
            ("POST", "/mfa/webauthn/options"): lambda me, other: self.key_call(
                me, "/mfa/webauthn/options", ok(200)
            ),
            ("POST", "/mfa/webauthn/register"): lambda me, other: self.key_call(
                me, "/mfa/webauthn/register", ok(409)
            ),
            ("POST", "/login/webauthn/options"): lambda me, other: self.key_call(
                me, "/login/webauthn/options", ok(409)
            ),
            ("POST", "/login/webauthn"): lambda me, other: self.key_call(
                me, "/login/webauthn", ok(409)
            ),
            # SCIM provisioning: a provisioner token's own tenant only
            ("GET", "/scim/v2/ServiceProviderConfig"): lambda me, other: (
                "viewer",
                "GET",
                "/scim/v2/ServiceProviderConfig",
                {},
                ok(200),
            ),
            ("POST", "/scim/v2/{path}"): self.scim_create,
            ("GET", "/scim/v2/{path}"): self.scim_read,
            ("PUT", "/scim/v2/{path}"): self.scim_put,
            ("PATCH", "/scim/v2/{path}"): self.scim_patch,
            ("DELETE", "/scim/v2/{path}"): self.scim_delete,
            ("GET", "/actions"): lambda me, other: self.page(me, "GET", "/actions", ok(200)),
            ("POST", "/actions/plans/{plan_id}/{verb}"): self.plan_form,
            ("GET", "/audit"): lambda me, other: self.page(
                me, "GET", "/audit", ok(200), role="auditor"
            ),
            ("DELETE", "/api/v1/secrets/{name}"): lambda me, other: (
                "admin",
                "DELETE",
                f"/api/v1/secrets/{self.secret_name(me)}",
                {},
                ok(204, 404),
            ),
        }

    # --- helpers -----------------------------------------------------------------------------

    def read(self, path: str, **params: str) -> Request:
        return ("viewer", "GET", path, {"params": params}, ok(200, 404))

    def filters(self, *names: str) -> dict[str, str]:
        choices = {
            "status": ("open", "acknowledged", "resolved"),
            "host": HOSTS,
            "job": JOBS,
            "category": ("gpu.fallen_off_bus", "nccl.timeout"),
            "user": tuple(f"user-{mark(t)}" for t in TENANTS),
        }
        return {n: self.rng.choice(choices[n]) for n in names if self.rng.random() < 0.3}

    def pick(self, me: Side, other: Side, attr: str) -> tuple[Any, bool]:
        """An id of mine or, one time in two, of the other tenant (a probe)."""
        theirs = getattr(other, attr)
        if theirs and self.rng.random() < 0.5:
            return self.rng.choice(theirs), True
        mine = getattr(me, attr)
        return (self.rng.choice(mine) if mine else None), False

    # --- writes ------------------------------------------------------------------------------

    def post_logs(self, me: Side, other: Side) -> Request:
        me.sent += 1
        items = evidence(
            self.rng.randint(1, 4),
            host=self.rng.choice(HOSTS),
            job=self.rng.choice(JOBS),
            prefix=f"ev-{mark(me.tenant)}-{me.sent}",
            ts=T0 + me.sent * 1000,
        )
        me.evidence.extend(e.id for e in items)
        body = serialise(encode_logs(items, observed_ns=time.time_ns()), "http/protobuf")
        return ("operator", "POST", "/v1/logs", {"content": body, "headers": PROTOBUF}, ok(200))

    def post_metrics(self, me: Side, other: Side) -> Request:
        event = metric(
            "psi_some_avg10_ratio",
            self.rng.random(),
            source="psi",
            labels={"resource": "cpu", "owner": mark(me.tenant)},
            host=self.rng.choice(HOSTS),
            ts_ns=T0,
        )
        body = serialise(encode_metrics([event], now_ns=T0), "http/protobuf")
        return ("operator", "POST", "/v1/metrics", {"content": body, "headers": PROTOBUF}, ok(200))

    def post_report(self, me: Side, other: Side) -> Request:
        me.sent += 1
        body = report(
            job=self.rng.choice(JOBS),
            user=f"user-{mark(me.tenant)}",
            host=self.rng.choice(HOSTS),
            report_id=f"r-{mark(me.tenant)}-{me.sent}",
        )
        body["gpus"] = [{"host": body["hosts"][-1], "serial": GPUS[0], "uuid": GPUS[1], "rank": 0}]
        me.reports.append(body["id"])
        return ("operator", "POST", "/api/v1/reports", {"json": body}, ok(201))

    def transition(self, me: Side, other: Side) -> Request:
        incident, probe = self.pick(me, other, "incidents")
        verb = self.rng.choice(("acknowledge", "resolve"))
        if self.rng.random() < 0.1:  # a viewer may not: a 403, logged in its own tenant
            path = f"/api/v1/incidents/{incident or 1}/{verb}"
            return ("viewer", "POST", path, {}, ok(403))
        if incident is None:
            return ("operator", "POST", f"/api/v1/incidents/999999/{verb}", {}, ok(404))
        expect = ok(404) if probe else ok(200, 409)
        return ("operator", "POST", f"/api/v1/incidents/{incident}/{verb}", {}, expect)

    def secret_name(self, me: Side) -> str:
        # names both tenants use, and names only one does
        return self.rng.choice(("slack", "pagerduty", f"hook-{mark(me.tenant).lower()}"))

    def put_secret(self, me: Side, other: Side) -> Request:
        me.sent += 1
        value = {"value": f"https://hooks.test/{mark(me.tenant)}/{me.sent}"}
        path = f"/api/v1/secrets/{self.secret_name(me)}"
        return ("admin", "PUT", path, {"json": value}, ok(200))

    # --- SCIM --------------------------------------------------------------------------------

    def scim_create(self, me: Side, other: Side) -> Request:
        me.sent += 1
        name = f"u{me.sent}-{mark(me.tenant)}@corp.test"
        body = {"schemas": [SCIM_USER], "userName": name, "displayName": mark(me.tenant)}
        return ("provisioner", "POST", "/scim/v2/Users", {"json": body, "headers": SCIM}, ok(201))

    def scim_target(self, me: Side, other: Side) -> tuple[str, bool]:
        found, probe = self.pick(me, other, "scim_users")
        return f"/scim/v2/Users/{found or 'none-yet'}", probe or found is None

    def scim_read(self, me: Side, other: Side) -> Request:
        if self.rng.random() < 0.5:  # a filter naming the other tenant's users: none come back
            query = {"filter": f'userName co "{mark(other.tenant)}"'}
            return ("provisioner", "GET", "/scim/v2/Users", {"params": query}, ok(200))
        path, missing = self.scim_target(me, other)
        return ("provisioner", "GET", path, {}, ok(404) if missing else ok(200))

    def scim_put(self, me: Side, other: Side) -> Request:
        path, missing = self.scim_target(me, other)
        me.sent += 1
        body = {"schemas": [SCIM_USER], "userName": f"p{me.sent}-{mark(me.tenant)}@corp.test"}
        kwargs = {"json": body, "headers": SCIM}
        return ("provisioner", "PUT", path, kwargs, ok(404) if missing else ok(200, 409))

    def scim_patch(self, me: Side, other: Side) -> Request:
        path, missing = self.scim_target(me, other)
        op = {"op": "replace", "path": "displayName", "value": f"patched {mark(me.tenant)}"}
        body = {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"], "Operations": [op]}
        kwargs = {"json": body, "headers": SCIM}
        return ("provisioner", "PATCH", path, kwargs, ok(404) if missing else ok(200, 204))

    def scim_delete(self, me: Side, other: Side) -> Request:
        found, probe = self.pick(me, other, "scim_users")
        if found is None or probe:
            return ("provisioner", "DELETE", f"/scim/v2/Users/{found or 'none-yet'}", {}, ok(404))
        me.scim_users.remove(found)
        return ("provisioner", "DELETE", f"/scim/v2/Users/{found}", {}, ok(204))

    # --- remediation ---------------------------------------------------------------------------

    def get_plan(self, me: Side, other: Side) -> Request:
        return self.by_id("/api/v1/remediation/plans/{}", me, other, "plans")

    def decide_plan(self, me: Side, other: Side) -> Request:
        plan, probe = self.pick(me, other, "plans")
        verb = self.rng.choice(("approve", "reject"))
        body = {"json": {"by": f"sre-{mark(me.tenant)}", "note": mark(me.tenant)}}
        if self.rng.random() < 0.1:  # an operator may not decide: a 403, logged
            path = f"/api/v1/remediation/plans/{plan or 1}/{verb}"
            return ("operator", "POST", path, body, ok(403))
        if plan is None:
            return ("approver", "POST", f"/api/v1/remediation/plans/999999/{verb}", body, ok(404))
        expect = ok(404) if probe else ok(200, 409)
        return ("approver", "POST", f"/api/v1/remediation/plans/{plan}/{verb}", body, expect)

    def dry_run(self, me: Side, other: Side) -> Request:
        incident, probe = self.pick(me, other, "incidents")
        if incident is None:
            return ("viewer", "GET", "/api/v1/remediation/dry-run/999999", {}, ok(404))
        path = f"/api/v1/remediation/dry-run/{incident}"
        return ("viewer", "GET", path, {}, ok(404) if probe else ok(200))

    def get_spare(self, me: Side, other: Side) -> Request:
        return self.by_id("/api/v1/remediation/spares/{}", me, other, "spares")

    def add_spare(self, me: Side, other: Side) -> Request:
        body = {"by": f"sre-{mark(me.tenant)}"}
        if self.rng.random() < 0.1:  # an operator may not keep the pool: a 403, logged
            return (
                "operator",
                "POST",
                "/api/v1/remediation/spares",
                {"json": {"host": "x"}},
                ok(403),
            )
        if self.rng.random() < 0.3:  # a name both tenants use: each has its own spare of it
            body |= {"host": self.rng.choice(HOSTS), "pool": "gpu"}
            return ("approver", "POST", "/api/v1/remediation/spares", {"json": body}, ok(201, 409))
        me.sent += 1
        host = f"spare-{mark(me.tenant)}-{me.sent}"
        me.spares.append(host)
        body |= {"host": host, "pool": self.rng.choice(("gpu", None))}
        return ("approver", "POST", "/api/v1/remediation/spares", {"json": body}, ok(201))

    def remove_spare(self, me: Side, other: Side) -> Request:
        host, probe = self.pick(me, other, "spares")
        params = {"params": {"by": f"sre-{mark(me.tenant)}"}}
        if host is None or probe:
            path = f"/api/v1/remediation/spares/{host or 'none-yet'}"
            return ("approver", "DELETE", path, params, ok(404))
        me.spares.remove(host)
        return ("approver", "DELETE", f"/api/v1/remediation/spares/{host}", params, ok(200))

    # --- the web UI ----------------------------------------------------------------------------

    def page(
        self,
        me: Side,
        method: str,
        path: str,
        expect: Callable[[httpx.Response], bool],
        role: str = "viewer",
        params: dict[str, str] | None = None,
        form: dict[str, str] | None = None,
    ) -> Request:
        cookie, csrf = me.sessions[role]
        kwargs: dict[str, Any] = {"headers": {"Cookie": f"{COOKIE}={cookie}"}}
        if params:
            kwargs["params"] = params
        if method == "POST":
            kwargs["data"] = {"csrf": csrf, **(form or {})}
        return (role, method, path, kwargs, expect)

    def key_call(self, me: Side, path: str, expect: Callable[[httpx.Response], bool]) -> Request:
        cookie, csrf = me.sessions["viewer"]
        headers = {"Cookie": f"{COOKIE}={cookie}", "X-Denpex-CSRF": csrf,
                   "Content-Type": "application/json"}  # fmt: skip
        return ("viewer", "POST", path, {"headers": headers, "content": b"{}"}, expect)

    def incident_page(self, me: Side, other: Side) -> Request:
        incident, probe = self.pick(me, other, "incidents")
        if incident is None:
            return self.page(me, "GET", "/incidents/999999", ok(404))
        return self.page(me, "GET", f"/incidents/{incident}", ok(404) if probe else ok(200))

    def incident_form(self, me: Side, other: Side) -> Request:
        incident, probe = self.pick(me, other, "incidents")
        verb = self.rng.choice(("acknowledge", "resolve"))
        if self.rng.random() < 0.1:  # a viewer's session may not
            return self.page(me, "POST", f"/incidents/{incident or 1}/{verb}", ok(403))
        if incident is None:
            return self.page(me, "POST", f"/incidents/999999/{verb}", ok(404), role="operator")
        expect = ok(404) if probe else ok(303, 409)
        return self.page(me, "POST", f"/incidents/{incident}/{verb}", expect, role="operator")

    def plan_form(self, me: Side, other: Side) -> Request:
        plan, probe = self.pick(me, other, "plans")
        verb = self.rng.choice(("approve", "reject"))
        form = {"by": f"sre-{mark(me.tenant)}", "note": mark(me.tenant)}
        if self.rng.random() < 0.1:  # a viewer's session may not decide
            return self.page(me, "POST", f"/actions/plans/{plan or 1}/{verb}", ok(403), form=form)
        if plan is None:
            path = f"/actions/plans/999999/{verb}"
            return self.page(me, "POST", path, ok(404), role="approver", form=form)
        expect = ok(404) if probe else ok(303, 409)
        path = f"/actions/plans/{plan}/{verb}"
        return self.page(me, "POST", path, expect, role="approver", form=form)

    def evidence_page(self, me: Side, other: Side) -> Request:
        found, probe = self.pick(me, other, "evidence")
        if found is None:
            return self.page(me, "GET", "/evidence/none-yet", ok(404))
        return self.page(me, "GET", f"/evidence/{found}", ok(404) if probe else ok(200))

    # --- reads by id ---------------------------------------------------------------------------

    def by_id(self, path: str, me: Side, other: Side, attr: str) -> Request:
        value, probe = self.pick(me, other, attr)
        if value is None:
            return ("viewer", "GET", path.format("none-yet"), {}, ok(404, 400))
        return ("viewer", "GET", path.format(value), {}, ok(404) if probe else ok(200))

    def get_incident(self, me: Side, other: Side) -> Request:
        return self.by_id("/api/v1/incidents/{}", me, other, "incidents")

    def get_summary(self, me: Side, other: Side) -> Request:
        return self.by_id("/api/v1/incidents/{}/summary", me, other, "incidents")

    def get_report(self, me: Side, other: Side) -> Request:
        return self.by_id("/api/v1/reports/{}", me, other, "reports")

    def get_evidence(self, me: Side, other: Side) -> Request:
        return self.by_id("/api/v1/evidence/{}", me, other, "evidence")

    def get_job(self, me: Side, other: Side) -> Request:
        return self.read(f"/api/v1/jobs/{self.rng.choice(JOBS)}")


def ui_routes() -> set[tuple[str, str]]:
    """The web UI's pages and forms (not in /openapi.json), from its own route table."""
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.routing import APIRoute

    from denpex.control.ui import mount_ui
    from denpex.enterprise import load_policies

    app = FastAPI()
    runtime = SimpleNamespace(store=None, tokens=None, oidc=None, denials=None)
    runtime.policies = load_policies()
    mount_ui(app, runtime)
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    return {(method, route.path) for route in routes for method in route.methods}


def ui_session(base: str, token: str) -> tuple[str, str]:
    """Log in to the UI with `token`: the session cookie and its CSRF token."""

    def csrf_of(html: str) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', html)
        assert found, "no CSRF field in the page"
        return found.group(1)

    with httpx.Client(base_url=base, timeout=30) as client:
        form = client.get("/login")
        reply = client.post("/login", data={"token": token, "csrf": csrf_of(form.text)})
        assert reply.status_code == 303, reply.text
        cookie = reply.cookies[COOKIE]
        jobs = client.get("/jobs", headers={"Cookie": f"{COOKIE}={cookie}"})
        return cookie, csrf_of(jobs.text)


def run_matrix(server: ServerProcess, url: str, kms: str, requests: int, seed: int) -> Tally:
    print(f"isolation matrix seed={seed}")
    rng = random.Random(seed)
    sides = {
        t: Side(
            t,
            {
                r: mint(url, t, r)
                for r in ("viewer", "operator", "approver", "auditor", "admin", "provisioner")
            },
        )
        for t in TENANTS
    }
    for side in sides.values():
        side.sessions = {
            r: ui_session(server.base, side.tokens[r])
            for r in ("viewer", "operator", "approver", "auditor")
        }
    matrix = Matrix(rng, sides)
    spec = httpx.get(server.base + "/openapi.json").json()
    served = {(method.upper(), path) for path, item in spec["paths"].items() for method in item}
    served |= {("GET", "/openapi.json")} | ui_routes()
    missing = served - set(matrix.generators) - {("GET", "/openapi.json")}
    assert not missing, f"endpoints the isolation matrix does not exercise: {sorted(missing)}"
    routes = sorted(matrix.generators)
    tally = Tally()
    with httpx.Client(base_url=server.base, timeout=30) as client:
        for n in range(requests):
            # First every route once for each tenant (a tenant that never posted a report
            # would leave its archive empty and the check on it vacuous), then at random.
            if n < len(routes) * len(TENANTS):
                me = sides[TENANTS[n % len(TENANTS)]]
                route = routes[n // len(TENANTS)]
            else:
                me = sides[rng.choice(TENANTS)]
                route = rng.choice(routes)
            other = sides[TENANTS[1 - TENANTS.index(me.tenant)]]
            role, method, path, kwargs, expect = matrix.generators[route](me, other)
            kwargs = dict(kwargs)
            headers = {"Authorization": f"Bearer {me.tokens[role]}", **kwargs.pop("headers", {})}
            reply = client.request(method, path, headers=headers, **kwargs)
            client.cookies.clear()  # a session travels only in the request that names it
            tally.requests += 1
            tally.by_route[route] += 1
            if route == ("POST", "/scim/v2/{path}") and reply.status_code == 201:
                me.scim_users.append(reply.json()["id"])
            probe = (
                any(str(x) in path for x in (*other.evidence, *other.reports))
                or any(f"/incidents/{i}/" in path + "/" for i in other.incidents)
                or any(f"/dry-run/{i}/" in path + "/" for i in other.incidents)
                or any(f"/plans/{i}/" in path + "/" for i in other.plans)
                or any(f"/Users/{i}" in path for i in other.scim_users)
                or any(path.endswith(f"/spares/{h}") for h in other.spares)
            )
            tally.probes += probe
            # a 404 may echo the id asked for: that is the asker's own text, not data
            text = reply.text
            if reply.headers.get("content-type") == "application/gzip":  # a bundle: its JSON
                text = gzip.decompress(reply.content).decode("utf-8", "replace")
            answered = text.replace(path.rsplit("/", 1)[-1], "")
            for sent in (kwargs.get("params") or {}).values():
                answered = answered.replace(str(sent), "")
            if mark(other.tenant) in answered:
                tally.seen += 1
                tally.problems.append(f"{me.tenant} saw {other.tenant}'s data: {method} {path}")
            if not expect(reply):
                tally.problems.append(
                    f"{me.tenant} {method} {path}: {reply.status_code} {reply.text[:200]}"
                )
            if n % 50 == 0:  # learn my incident ids (the leader opens them from reports)
                listed = client.get(
                    "/api/v1/incidents",
                    params={"limit": 1000},
                    headers={"Authorization": f"Bearer {me.tokens['viewer']}"},
                )
                me.incidents = [i["id"] for i in listed.json()["items"]]
                plans = client.get(
                    "/api/v1/remediation/plans",
                    params={"limit": 1000},
                    headers={"Authorization": f"Bearer {me.tokens['viewer']}"},
                )
                me.plans = [p["id"] for p in plans.json()["items"]]
    tally.changed = changed_rows(url, kms, sides)
    return tally


def changed_rows(url: str, kms: str, sides: dict[str, Side]) -> int:
    """Rows of one tenant, read from every tenant table past the application, that hold the
    other tenant's data, or incidents acknowledged or resolved by the other's tokens."""
    from denpex.control.db import Database
    from denpex.control.schema import TENANT_TABLES
    from denpex.control.secrets import SecretStore
    from denpex.enterprise import open_kms

    db = Database(url)
    secrets = SecretStore(db, lambda: open_kms(kms))
    bad = 0
    try:
        token_ids = {t: {tok.split("_")[1] for tok in s.tokens.values()} for t, s in sides.items()}
        for tenant in TENANTS:
            other = TENANTS[1 - TENANTS.index(tenant)]
            with db.tenant_tx(tenant) as conn:
                for table in TENANT_TABLES:
                    query = sa.text(f"SELECT * FROM {table} WHERE tenant = :t")
                    for row in conn.execute(query, {"t": tenant}).mappings():
                        if mark(other) in " ".join(str(v) for v in row.values()):
                            print(f"{table} of {tenant} holds {other}'s data: {dict(row)}")
                            bad += 1
                mine = sa.text("SELECT * FROM incidents WHERE tenant = :t")
                for row in conn.execute(mine, {"t": tenant}).mappings():
                    for actor in (row["acknowledged_by"], row["resolved_by"]):
                        if actor and actor.removeprefix("token:") in token_ids[other]:
                            print(
                                f"incident {row['id']} of {tenant} changed by {other}: {dict(row)}"
                            )
                            bad += 1
                names = sa.text("SELECT name FROM secrets WHERE tenant = :t")
                for name in conn.execute(names, {"t": tenant}).scalars():
                    value = secrets.reveal(tenant, name) or ""
                    if mark(other) in value or mark(tenant) not in value:
                        print(f"secret {name} of {tenant} holds {value!r}")
                        bad += 1
                changed = remediation_changed(db, tenant, token_ids[other], mark(other))
                bad += changed
                count = sa.text("SELECT count(*) FROM evidence WHERE tenant = :t")
                own = conn.execute(count, {"t": tenant}).scalar()
                assert own and own >= 1, f"{tenant} stored no evidence: the matrix proved nothing"
    finally:
        db.dispose()
    return bad


def changed_objects(root: Path) -> int:
    """Objects under one tenant's prefix, read from the object store's folder past the
    application (bundles unpacked), that hold the other tenant's data; each tenant must
    have some, or the matrix proved nothing."""
    from denpex.control.objects import open_objects
    from denpex.control.objects.bundle import read_members

    store = open_objects(f"file://{root}")
    bad = 0
    for tenant in TENANTS:
        other = TENANTS[1 - TENANTS.index(tenant)]
        mine = store.for_leader(tenant)
        found = {kind: mine.list(kind) for kind in ("reports", "bundles")}
        assert found["reports"], f"{tenant} archived no report: the matrix proved nothing"
        for kind, items in found.items():
            for name, _ in items:
                data = mine.get(kind, name)[0]
                texts = read_members(data).values() if kind == "bundles" else [data]
                if any(mark(other).encode() in text for text in texts):
                    print(f"{kind}/{name} of {tenant} holds {other}'s data")
                    bad += 1
    return bad


def remediation_changed(db, tenant: str, their_tokens: set[str], their_mark: str) -> int:
    """Remediation rows of `tenant` (system tables, filtered in code) decided, reset or
    changed by the other tenant's tokens, or holding its data; its audit records too."""
    bad = 0
    tables = (
        "remediation_plans",
        "remediation_steps",
        "remediation_policies",
        "remediation_spares",
        "remediation_notices",
        "audit",
    )
    with db.system_tx() as conn:
        for table in tables:
            query = sa.text(f"SELECT * FROM {table} WHERE tenant = :t")
            for row in conn.execute(query, {"t": tenant}).mappings():
                text = " ".join(str(v) for v in row.values())
                if their_mark in text or any(f"token:{t}" in text for t in their_tokens):
                    print(f"{table} of {tenant} changed by the other tenant: {dict(row)}")
                    bad += 1
    return bad


def check_row_level_security(pg_url: str) -> None:
    """Every table with a tenant column: RLS ENABLE + FORCE with a policy, or no privilege
    at all for the tenant role; the tenant role owns nothing and cannot bypass RLS."""
    import psycopg

    with psycopg.connect(pg_url.replace("postgresql://", "postgresql://", 1)) as conn:
        tables = conn.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, c.relkind, "
            "(SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid), "
            "has_table_privilege('denpex_tenant', c.oid, 'SELECT,INSERT,UPDATE,DELETE'), "
            "pg_get_userbyid(c.relowner) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND EXISTS ("
            "  SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant')"
        ).fetchall()
        role = conn.execute(
            "SELECT rolsuper, rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = 'denpex_tenant'"
        ).fetchone()
    assert role == (False, False, False)
    assert len(tables) >= 8
    for name, enabled, forced, _kind, policies, granted, owner in tables:
        assert owner != "denpex_tenant", name
        if granted:
            assert enabled and forced and policies >= 1, (
                f"{name}: open to the tenant role without RLS"
            )


def matrix_on(
    engine: str, requests: int, request: pytest.FixtureRequest, tmp_path: Path, server_processes
):
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path / 'control.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    kms = f"file://{tmp_path / 'kek.json'}"
    objects = tmp_path / "objects"
    server = ServerProcess(
        url, tmp_path / "server.log", "--quota", "1000000", "--kms", kms,
        "--objects", f"file://{objects}",
    )  # fmt: skip
    server.start()
    server_processes.append(server)
    seed = int(os.environ.get("DENPEX_TEST_SEED", random.randrange(1 << 30)))
    started = time.monotonic()
    tally = run_matrix(server, url, kms, requests, seed)
    tally.changed += changed_objects(objects)
    print(
        f"isolation matrix [{engine}]: {tally.requests} requests over {len(tally.by_route)} "
        f"endpoints, {tally.probes} naming the other tenant's ids: {tally.seen} responses with "
        f"the other tenant's data, {tally.changed} rows seen or changed by the other tenant "
        f"({time.monotonic() - started:.0f} s, seed {seed})"
    )
    assert not tally.problems, tally.problems[:20]
    assert tally.seen == 0 and tally.changed == 0
    assert tally.probes > requests // 20
    if engine == "postgresql":
        check_row_level_security(url)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_isolation_matrix_10000_requests(engine, request, tmp_path, server_processes):
    matrix_on(engine, 10_000, request, tmp_path, server_processes)


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_isolation_matrix_quick(engine, request, tmp_path, server_processes):
    matrix_on(engine, 600, request, tmp_path, server_processes)
