"""The HTTP surface of `denpex server` (FastAPI): OTLP/HTTP ingest on /v1/logs and
/v1/metrics, the REST API under /api/v1, /healthz, /metrics and /openapi.json (the web UI
at `/` is mounted from denpex.control.ui).

Every route names its action and depends on one Decides (control/access.py): it
authenticates (except for the public service routes) and asks the Cedar policy set BEFORE
the handler runs (a denial is recorded in the denial log); the handler reaches storage only
through `store.scoped(principal)`. tests/control/test_route_policies.py walks the route
table: a route without a Decides fails. It must never answer a malformed payload with a
5xx, nor store part of one.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import hashlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from starlette.concurrency import run_in_threadpool

from denpex import __version__
from denpex.control import ingest
from denpex.control.access import Decides, add_access_routes
from denpex.control.db import Database, StoreError
from denpex.control.denials import DenialStore
from denpex.control.leader import Leadership
from denpex.control.object_routes import add_object_routes, archive_report
from denpex.control.objects import ObjectStore
from denpex.control.quotas import Quotas
from denpex.control.remediation_api import add_routes as add_remediation_routes
from denpex.control.residency import Residency, audit_refusal
from denpex.control.scim_routes import add_scim_routes
from denpex.control.secrets import SecretError, SecretStore
from denpex.control.selfmetrics import ServerMetrics
from denpex.control.sensitive import SensitiveEvidence
from denpex.control.signin_guard import SignInGuard, SignInThrottled
from denpex.control.store import Conflict, NotFound, Page, Store, decode_cursor
from denpex.control.timefmt import parse_time_param
from denpex.control.ui.mfa_routes import add_mfa_api
from denpex.core import jsonio
from denpex.enterprise import (
    AuthError,
    KmsError,
    OidcVerifier,
    PolicySet,
    Principal,
    Resource,
    TokenDirectory,
    authorize,
)


class Runtime(Protocol):
    """What the routes use of denpex.control.server.Runtime (named here, not imported:
    the server imports this module)."""

    db: Database
    store: Store
    metrics: ServerMetrics
    tokens: TokenDirectory
    quotas: Quotas
    leadership: Leadership
    schema_revision: str
    policies: PolicySet
    denials: DenialStore
    oidc: OidcVerifier | None
    secrets: SecretStore
    residency: Residency | None
    objects: ObjectStore
    signins: SignInGuard
    sensitive: SensitiveEvidence

    def wake_leader(self) -> None: ...

    @property
    def replaying(self) -> bool: ...

    def replay_tick(self, as_of_ns: int) -> dict[str, Any]: ...


Limit = Annotated[int, Query(ge=1, le=1000, description="items per page")]
Cursor = Annotated[str | None, Query(description="`next_cursor` of the previous page")]
Since = Annotated[str | None, Query(description="ISO 8601 time or ns since the epoch (inclusive)")]
Until = Annotated[str | None, Query(description="ISO 8601 time or ns since the epoch (exclusive)")]


def create_app(rt: Runtime) -> FastAPI:
    app = FastAPI(
        title="denpex control plane",
        version=__version__,
        openapi_url=None,  # served below, behind a policy decision like every route
        docs_url=None,
        redoc_url=None,
        description="Fleet ingest (OTLP/HTTP, job reports), incidents, hosts, jobs, evidence.",
    )
    _error_handlers(app, rt)
    app.add_middleware(_Timing, rt=rt)

    def principal(action: str) -> Decides:
        return Decides(rt, action)

    public = Decides(rt, "service:read", public=True)

    add_remediation_routes(app, rt.db, rt.store, principal)
    add_scim_routes(app, rt, principal, public)
    add_mfa_api(app, rt, principal)
    add_object_routes(app, rt.store, rt.objects, principal)

    # --- service ---------------------------------------------------------------------------

    @app.get("/openapi.json", tags=["service"], include_in_schema=False)
    def openapi(_: Annotated[None, Depends(public)]) -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/healthz", tags=["service"])
    def healthz(_: Annotated[None, Depends(public)]) -> dict[str, Any]:
        state = rt.leadership.state
        return {
            "status": "ok",
            "version": __version__,
            "store": rt.db.dialect,
            "schema": rt.schema_revision,
            "leader": state.leader,
            "epoch": state.epoch,
            "objects": rt.objects.kind,
        }

    @app.get("/metrics", tags=["service"], response_class=Response)
    def metrics(_: Annotated[None, Depends(public)]) -> Response:
        return Response(rt.metrics.render(), media_type="text/plain; version=0.0.4")

    # --- ingest ----------------------------------------------------------------------------

    @app.post("/v1/logs", tags=["ingest"], summary="OTLP/HTTP logs (protobuf or JSON)")
    async def otlp_logs(
        request: Request, who: Annotated[Principal, Depends(principal("evidence:write"))]
    ) -> Response:
        fmt, data = await _otlp_body(request)
        now = time.time_ns()
        async with _audited(rt, who, "/v1/logs"):
            batch = ingest.decode_logs(data, fmt, tenant=who.tenant, received_ns=now)
            if rt.residency is not None:
                rt.residency.check_batch(who.tenant, batch)
        _admit(rt, who.tenant, len(batch.rows))
        stored = await run_in_threadpool(rt.store.scoped(who).add_evidence, batch)
        rt.metrics.ingested.labels(who.tenant, "evidence").inc(stored)
        rt.metrics.duplicates.labels(who.tenant, "evidence").inc(len(batch.rows) - stored)
        return _otlp_reply(ExportLogsServiceResponse(), fmt)

    @app.post("/v1/metrics", tags=["ingest"], summary="OTLP/HTTP metrics (protobuf or JSON)")
    async def otlp_metrics(
        request: Request, who: Annotated[Principal, Depends(principal("evidence:write"))]
    ) -> Response:
        fmt, data = await _otlp_body(request)
        async with _audited(rt, who, "/v1/metrics"):
            rows = ingest.decode_metrics(data, fmt, tenant=who.tenant)
            if rt.residency is not None:
                rt.residency.check_metrics(who.tenant, rows)
        _admit(rt, who.tenant, len(rows))
        stored = await run_in_threadpool(rt.store.scoped(who).add_metrics, rows)
        rt.metrics.ingested.labels(who.tenant, "metric").inc(stored)
        return _otlp_reply(ExportMetricsServiceResponse(), fmt)

    @app.post(
        "/api/v1/reports",
        tags=["ingest"],
        status_code=201,
        summary="a job's diagnosis (denpex.diagnosis/v1) with job id, hosts, ranks, scheduler ids",
    )
    async def post_report(
        request: Request, who: Annotated[Principal, Depends(principal("reports:write"))]
    ) -> Response:
        if ingest.body_format(request.headers.get("content-type")) != "json":
            raise ingest.IngestError(415, "a report is application/json")
        data = ingest.body_bytes(await request.body(), request.headers.get("content-encoding"))
        now = time.time_ns()
        async with _audited(rt, who, "/api/v1/reports"):
            report = ingest.decode_report(data, tenant=who.tenant, received_ns=now)
            if rt.residency is not None:
                rt.residency.check_report(who.tenant, report)
        _admit(rt, who.tenant, 1 + len(report.evidence.rows))
        new = await run_in_threadpool(rt.store.scoped(who).add_report, report, now)
        # after the row: a failed archive answers 503 and the client's retry archives it
        await run_in_threadpool(archive_report, rt.objects.scoped(who), report.id, data, new)
        rt.metrics.ingested.labels(who.tenant, "report").inc(int(new))
        rt.metrics.duplicates.labels(who.tenant, "report").inc(int(not new))
        rt.wake_leader()
        body = {"id": report.id, "stored": new, "duplicate": not new}
        return JSONResponse(body, status_code=201 if new else 200)

    # --- incidents -------------------------------------------------------------------------

    @app.get("/api/v1/incidents", tags=["incidents"])
    def list_incidents(
        request: Request,
        who: Annotated[Principal, Depends(principal("incidents:read"))],
        status: Annotated[str | None, Query(pattern="^(open|acknowledged|resolved)$")] = None,
        host: str | None = None,
        job: str | None = None,
        category: str | None = None,
        kind: Annotated[
            str | None, Query(description="component kind: job, host, gpu, switch, driver …")
        ] = None,
        component: Annotated[
            str | None, Query(description="component id: a host, a GPU serial, a switch …")
        ] = None,
        roots: Annotated[
            bool, Query(description="leave out job incidents a fleet incident holds")
        ] = False,
        since: Since = None,
        until: Until = None,
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Response:
        page = rt.store.scoped(who).incidents(
            status=status,
            host=host,
            job=job,
            category=category,
            kind=kind,
            component=component,
            roots=roots,
            since=_time(since, "since"),
            until=_time(until, "until"),
            limit=limit,
            cursor=_cursor(cursor, 2),
        )
        return _page(request, page)

    @app.get("/api/v1/incidents/similar", tags=["incidents"], summary="similar past incidents")
    def similar(
        request: Request,
        who: Annotated[Principal, Depends(principal("incidents:read"))],
        q: Annotated[str, Query(min_length=1, max_length=8000, description="failure lines")],
        k: Annotated[int, Query(ge=1, le=20)] = 3,
        exclude_report: Annotated[
            str | None, Query(description="leave out incidents opened from this report")
        ] = None,
    ) -> Response:
        from denpex.control.similar import similar_incidents

        _need_retrieval()
        hits = similar_incidents(rt.store.scoped(who), q, k, exclude_report=exclude_report)
        items = [{**h.passage.to_dict(), "score": round(h.score, 4)} for h in hits]
        return _json(request, {"items": items})

    @app.get("/api/v1/incidents/{incident_id}/summary", tags=["incidents"])
    def incident_summary(
        request: Request,
        who: Annotated[Principal, Depends(principal("incidents:read"))],
        incident_id: Annotated[int, Path(ge=1)],
    ) -> Response:
        """The incident's deterministic explanation first, then its retrieval block (similar
        past incidents, runbook), each entry citing its id; `retrieval` is null when the
        server has no retrieval extra."""
        from denpex.catalog import load_catalog
        from denpex.control.similar import incident_block

        scoped = rt.store.scoped(who)
        incident = scoped.incident(incident_id)
        block = incident_block(scoped, incident, load_catalog())
        lines: list[str] = []
        if block is not None:
            from denpex.control.similar import incident_diagnosis
            from denpex.retrieval.rewrite import rewritten_lines

            lines = block.lines() + rewritten_lines(incident_diagnosis(scoped, incident), block)
        return _json(
            request,
            {
                "incident": incident_id,
                "title": incident["title"],
                "explanation": incident["explanation"],
                "retrieval": None if block is None else block.to_dict(),
                "text": "" if block is None else "\n".join(lines),
            },
        )

    @app.get("/api/v1/incidents/{incident_id}", tags=["incidents"])
    def get_incident(
        request: Request,
        who: Annotated[Principal, Depends(principal("incidents:read"))],
        incident_id: Annotated[int, Path(ge=1)],
    ) -> Response:
        return _json(request, rt.store.scoped(who).incident(incident_id))

    @app.post("/api/v1/incidents/{incident_id}/acknowledge", tags=["incidents"])
    def acknowledge(
        who: Annotated[Principal, Depends(principal("incidents:write"))],
        incident_id: Annotated[int, Path(ge=1)],
    ) -> Response:
        done = rt.store.scoped(who).transition(
            incident_id, "acknowledged", _who(who), time.time_ns()
        )
        return JSONResponse(done)

    @app.post("/api/v1/incidents/{incident_id}/resolve", tags=["incidents"])
    async def resolve(
        request: Request,
        who: Annotated[Principal, Depends(principal("incidents:write"))],
        incident_id: Annotated[int, Path(ge=1)],
    ) -> Response:
        note = None
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                body = jsonio.loads(await request.body() or b"{}")
            except ValueError:
                return _error(400, 'the body is not JSON: send {"note": "what was done"}')
            note = body.get("note") if isinstance(body, dict) else None
            if note is not None and not isinstance(note, str):
                return _error(400, "note: must be a string")
        store = rt.store.scoped(who)
        done = await run_in_threadpool(
            store.transition, incident_id, "resolved", _who(who), time.time_ns(), note
        )
        return JSONResponse(done)

    if rt.replaying:

        @app.post(
            "/api/v1/replay/tick",
            tags=["replay"],
            summary="a replay server's leader pass at the replayed fleet time (all tenants)",
        )
        def replay_tick(
            _who: Annotated[Principal, Depends(principal("tenant:admin"))],
            now_ns: Annotated[int, Query(ge=0, description="the replayed fleet time")],
        ) -> Response:
            return JSONResponse({"tenants": rt.replay_tick(now_ns)})

    # --- hosts, jobs, evidence ---------------------------------------------------------------

    @app.get("/api/v1/hosts", tags=["hosts"])
    def list_hosts(
        request: Request,
        who: Annotated[Principal, Depends(principal("hosts:read"))],
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Response:
        return _page(request, rt.store.scoped(who).hosts(limit=limit, cursor=_cursor(cursor, 1)))

    @app.get("/api/v1/hosts/{host}", tags=["hosts"], summary="a host's history")
    def get_host(
        request: Request,
        who: Annotated[Principal, Depends(principal("hosts:read"))],
        host: str,
        since: Since = None,
        until: Until = None,
        limit: Limit = 100,
    ) -> Response:
        history = rt.store.scoped(who).host(
            host, since=_time(since, "since"), until=_time(until, "until"), limit=limit
        )
        return _json(request, history)

    @app.get("/api/v1/jobs", tags=["jobs"], summary="job reports by job id, user, category, host")
    def list_jobs(
        request: Request,
        who: Annotated[Principal, Depends(principal("jobs:read"))],
        job: str | None = None,
        user: str | None = None,
        category: str | None = None,
        host: str | None = None,
        gpu: Annotated[str | None, Query(description="a GPU's serial or UUID")] = None,
        status: Annotated[str | None, Query(pattern="^(failed|ok)$")] = None,
        since: Since = None,
        until: Until = None,
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Response:
        page = rt.store.scoped(who).jobs(
            job=job,
            user=user,
            category=category,
            host=host,
            gpu=gpu,
            status=status,
            since=_time(since, "since"),
            until=_time(until, "until"),
            limit=limit,
            cursor=_cursor(cursor, 2),
        )
        return _page(request, page)

    @app.get("/api/v1/gpus/{gpu}/jobs", tags=["jobs"], summary="a GPU's jobs, on any host")
    def list_gpu_jobs(
        request: Request,
        who: Annotated[Principal, Depends(principal("jobs:read"))],
        gpu: str,
        since: Since = None,
        until: Until = None,
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Response:
        page = rt.store.scoped(who).jobs(
            gpu=gpu,
            since=_time(since, "since"),
            until=_time(until, "until"),
            limit=limit,
            cursor=_cursor(cursor, 2),
        )
        return _page(request, page)

    @app.get("/api/v1/jobs/{job}", tags=["jobs"])
    def get_job(
        request: Request, who: Annotated[Principal, Depends(principal("jobs:read"))], job: str
    ) -> Response:
        return _json(request, rt.store.scoped(who).job(job))

    @app.get("/api/v1/reports/{report_id}", tags=["jobs"])
    def get_report(
        request: Request,
        who: Annotated[Principal, Depends(principal("jobs:read"))],
        report_id: str,
    ) -> Response:
        return _json(request, rt.store.scoped(who).report(report_id))

    @app.get("/api/v1/evidence", tags=["evidence"])
    def list_evidence(
        request: Request,
        who: Annotated[Principal, Depends(principal("evidence:read"))],
        host: str | None = None,
        job: str | None = None,
        category: str | None = None,
        since: Since = None,
        until: Until = None,
        limit: Limit = 100,
        cursor: Cursor = None,
    ) -> Response:
        page = rt.store.scoped(who).list_evidence(
            host=host,
            job=job,
            category=category,
            since=_time(since, "since"),
            until=_time(until, "until"),
            limit=limit,
            cursor=_cursor(cursor, 2),
        )
        return _page(request, page)

    @app.get("/api/v1/evidence/{evidence_id:path}", tags=["evidence"])
    def get_evidence(
        request: Request,
        who: Annotated[Principal, Depends(principal("evidence:read"))],
        evidence_id: str,
        reveal: Annotated[
            bool,
            Query(description="open a body marked sensitive (needs evidence:read_sensitive)"),
        ] = False,
    ) -> Response:
        scoped = rt.store.scoped(who)
        doc = scoped.evidence(evidence_id)
        if reveal and doc.get("sensitive"):
            resource = Resource("evidence", who.tenant)
            authorize(
                who, "evidence:read_sensitive", resource, policies=rt.policies, denials=rt.denials
            )
            sealed = scoped.sealed_body(evidence_id)
            if sealed is not None:
                doc["body"] = rt.sensitive.open_body(who.tenant, evidence_id, sealed)
                doc["revealed"] = True
                rt.sensitive.audit_reveal(who, evidence_id)
        return _json(request, doc)

    add_access_routes(app, rt)
    from denpex.control.ui import mount_ui  # the web UI at `/`, through the same auth

    mount_ui(app, rt)
    return app


# --- helpers -----------------------------------------------------------------------------------


def _who(principal: Principal) -> str:
    return principal.label


@asynccontextmanager
async def _audited(rt: Runtime, who: Principal, what: str) -> AsyncIterator[None]:
    """A payload refused as another tenant's or region's (403) goes to the audit log."""
    try:
        yield
    except ingest.IngestError as exc:
        if exc.status == 403:
            await run_in_threadpool(audit_refusal, rt.db, who, what, exc.status, exc.message)
        raise


def _admit(rt: Runtime, tenant: str, records: int) -> None:
    wait = rt.quotas.admit(tenant, records)
    if wait is not None:
        raise _QuotaExceeded(wait)


class _QuotaExceeded(Exception):
    def __init__(self, wait_s: float) -> None:
        super().__init__(f"ingest quota exceeded; retry in {wait_s:.1f} s")
        self.wait_s = wait_s


async def _otlp_body(request: Request) -> tuple[str, bytes]:
    fmt = ingest.body_format(request.headers.get("content-type"))
    data = ingest.body_bytes(await request.body(), request.headers.get("content-encoding"))
    return fmt, data


def _otlp_reply(message: Any, fmt: str) -> Response:
    if fmt == "json":
        return Response(b"{}", media_type="application/json")
    return Response(message.SerializeToString(), media_type="application/x-protobuf")


def _time(value: str | None, name: str) -> int | None:
    try:
        return parse_time_param(value)
    except ValueError:
        raise ingest.IngestError(400, f"{name}: an ISO 8601 time or integer ns") from None


def _cursor(value: str | None, arity: int) -> tuple[Any, ...] | None:
    if value is None:
        return None
    try:
        return decode_cursor(value, arity)
    except ValueError as exc:
        raise ingest.IngestError(400, f"cursor: {exc}") from None


def _json(request: Request, data: Any) -> Response:
    """JSON with a weak ETag; 304 when the client's If-None-Match names it."""
    body = jsonio.dumps(data)
    etag = 'W/"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
    match = request.headers.get("if-none-match")
    if match and etag in [m.strip() for m in match.split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _page(request: Request, page: Page) -> Response:
    return _json(request, {"items": page.items, "next_cursor": page.next_cursor})


class _NoRetrieval(RuntimeError):
    """The server has no retrieval extra: a 503 that says what to install."""


def _need_retrieval() -> None:
    from denpex.retrieval.lookup import enabled

    if not enabled():
        raise _NoRetrieval("retrieval is not installed on this server: pip install 'denpex[rag]'")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"status": status, "message": message}}, status_code=status, headers=headers
    )


def _error_handlers(app: FastAPI, rt: Runtime) -> None:
    @app.exception_handler(AuthError)
    def _auth(_request: Request, exc: AuthError) -> JSONResponse:
        headers = {"WWW-Authenticate": 'Bearer realm="denpex"'} if exc.status == 401 else None
        return _error(exc.status, exc.message, headers)

    @app.exception_handler(SignInThrottled)
    def _throttled(_request: Request, exc: SignInThrottled) -> JSONResponse:
        rt.metrics.rejected.labels("429").inc()
        return _error(429, str(exc), exc.headers)

    @app.exception_handler(ingest.IngestError)
    def _ingest(request: Request, exc: ingest.IngestError) -> JSONResponse:
        rt.metrics.rejected.labels(str(exc.status)).inc()
        return _error(exc.status, exc.message)

    @app.exception_handler(_QuotaExceeded)
    def _quota(_request: Request, exc: _QuotaExceeded) -> JSONResponse:
        rt.metrics.rejected.labels("429").inc()
        return _error(429, str(exc), {"Retry-After": str(max(1, round(exc.wait_s)))})

    @app.exception_handler(_NoRetrieval)
    def _no_retrieval(_request: Request, exc: _NoRetrieval) -> JSONResponse:
        return _error(503, str(exc))

    @app.exception_handler(NotFound)
    def _not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(Conflict)
    def _conflict(_request: Request, exc: Conflict) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(RequestValidationError)
    def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg')}"
            for err in exc.errors()
        ]
        return _error(400, "; ".join(problems) or "invalid request")

    @app.exception_handler(SecretError)
    def _secret(_request: Request, exc: SecretError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(KmsError)
    def _kms(_request: Request, exc: KmsError) -> JSONResponse:
        return _error(503, f"the KMS could not seal or open a secret: {exc}")

    @app.exception_handler(StoreError)
    def _store(_request: Request, exc: StoreError) -> JSONResponse:
        return _error(503, str(exc))


class _Timing:
    """Pure ASGI middleware: per-route request counts and latency for /metrics."""

    def __init__(self, app: Any, rt: Runtime) -> None:
        self.app = app
        self.rt = rt

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", "unmatched")
            self.rt.metrics.requests.labels(name, str(status[0])).inc()
            self.rt.metrics.latency.labels(name).observe(time.perf_counter() - start)
