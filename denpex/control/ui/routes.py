"""The UI's routes on the FastAPI app: login/logout, fleet (`/`), incident, evidence, host
and jobs pages, the vendored static files, and the security headers on every response.

Each page depends on one PageDecides (the API's Decides, over the session's token: every
action whose data it shows, a form the action of the API route it mirrors) and reaches its
data through `store.scoped(principal)`; every POST checks the session's CSRF token. It must
never render a page for a request it could not authenticate, nor show one tenant's data to
another (a foreign id is a 404).
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import time
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from denpex import __version__
from denpex.control.access import allows
from denpex.control.remediation_store import RemediationStore
from denpex.control.signin_guard import account_of
from denpex.control.spare_store import SpareStore
from denpex.control.store import Conflict, NotFound, decode_cursor
from denpex.control.timefmt import iso
from denpex.control.ui.action_routes import PageKit, add_action_routes
from denpex.control.ui.actions import incident_plans, remediation_states
from denpex.control.ui.graph import causal_svg, row_anchor
from denpex.control.ui.mfa_routes import add_mfa_routes, owed_factor
from denpex.control.ui.session import (
    COOKIE,
    MAX_AGE_S,
    CsrfRefused,
    LoginRequired,
    MfaPending,
    PageDecides,
    Session,
    SessionCodec,
    UiError,
    check_csrf,
    client_source,
    new_session,
    throttle_check,
)
from denpex.control.ui.session import safe_next as _safe_next
from denpex.control.ui.sso import add_sso_routes, sso_name
from denpex.control.ui.sso_routes import add_sso_routes as add_saml_routes
from denpex.control.ui.views import fleet as fleet_view
from denpex.control.ui.views import (
    host_states,
    incident_view,
    jobs_page,
    layer_of,
    state_of_step,
)
from denpex.control.ui.webauthn_routes import add_webauthn_routes
from denpex.enterprise import AuthError, Principal, authenticate
from denpex.enterprise.oidc import looks_like_jwt
from denpex.lite.report_html import timeline_svg

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
MAX_FORM_BYTES = 16 * 1024


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("denpex.control.ui", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["iso"] = lambda ns: (iso(ns) or "—").replace("T", " ")[:19]
    env.filters["pct"] = lambda x: f"{float(x or 0):.2f}"
    env.globals["version"] = __version__
    return env


def mount_ui(app: FastAPI, rt: Any) -> None:
    """Add the UI to `app` (the Runtime `rt` of denpex.control.api)."""
    env = _environment()
    codec = SessionCodec(rt.store)
    app.add_middleware(_SecurityHeaders)
    app.mount("/static", StaticFiles(packages=[("denpex.control.ui", "static")]), name="static")

    def session_of(request: Request) -> Session | None:
        return codec.open(request.cookies.get(COOKIE))

    def decides(action: str, *also: str, enrolling: bool = False) -> Any:
        return Depends(PageDecides(rt, codec, action, also=also, enrolling=enrolling))

    public = Depends(PageDecides(rt, codec, "service:read", public=True))

    def session_for(request: Request) -> Session:
        session: Session | None = request.state.session  # PageDecides opened it
        assert session is not None  # PageDecides raised LoginRequired otherwise
        return session

    def page(
        request: Request,
        name: str,
        session: Session,
        principal: Principal | None,
        code: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        body = env.get_template(name).render(
            request=request,
            csrf=session.csrf,
            principal=principal,
            may_write=bool(principal and allows(rt, principal, "incidents:write")),
            may_plans=bool(principal and allows(rt, principal, "remediation:read")),
            may_audit=bool(principal and allows(rt, principal, "audit:read")),
            path=request.url.path,
            **context,
        )
        return HTMLResponse(body, status_code=code, headers={"Cache-Control": "no-store"})

    def set_session(response: Response, request: Request, session: Session) -> Response:
        response.set_cookie(
            COOKIE,
            codec.seal(session),
            max_age=MAX_AGE_S,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def form_of(request: Request) -> dict[str, str]:
        """The urlencoded form of a POST, after the same-origin and CSRF checks."""
        origin = request.headers.get("origin")
        if origin and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise CsrfRefused()
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise UiError(413, "form too large")
        fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        check_csrf(session_of(request), fields.get("csrf"))
        return fields

    # --- errors ------------------------------------------------------------------------------

    @app.exception_handler(LoginRequired)
    def _login(request: Request, _exc: LoginRequired) -> Response:
        target = "/login?next=" + quote(request.url.path + _query(request), safe="")
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": target})
        return RedirectResponse(target, status_code=303)

    @app.exception_handler(MfaPending)
    def _mfa(request: Request, exc: MfaPending) -> Response:
        target = exc.target + "?next=" + quote(request.url.path + _query(request), safe="")
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": target})
        return RedirectResponse(target, status_code=303)

    @app.exception_handler(CsrfRefused)
    def _csrf(request: Request, _exc: CsrfRefused) -> Response:
        message = "form refused: it did not carry this session's CSRF token (reload the page)"
        return error(request, 403, message)

    @app.exception_handler(UiError)
    def _ui_error(request: Request, exc: UiError) -> Response:
        response = error(request, exc.status, exc.message)
        response.headers.update(exc.headers)
        return response

    def error(request: Request, status: int, message: str) -> HTMLResponse:
        session = session_of(request) or new_session()
        return page(request, "error.html", session, None, status, status=status, message=message)

    def guarded(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except NotFound as exc:
            raise UiError(404, str(exc)) from None
        except Conflict as exc:
            raise UiError(409, str(exc)) from None

    kit = PageKit(page, decides, form_of, guarded, session_for, public, set_session, session_of)
    add_action_routes(app, rt, kit)
    add_sso_routes(app, rt, kit, codec)

    # --- login -------------------------------------------------------------------------------

    @app.get("/login", include_in_schema=False)
    def login_form(request: Request, _: Annotated[None, public], next: str = "/") -> Response:
        session = session_of(request)
        if session is not None and session.token is not None:
            return RedirectResponse(_safe_next(next), status_code=303)
        session = session or new_session()
        saml = getattr(rt, "saml", None) is not None
        response = page(
            request, "login.html", session, None, next=_safe_next(next), sso=sso_name(rt),
            saml=saml,
        )  # fmt: skip
        return set_session(response, request, session)

    @app.post("/login", include_in_schema=False)
    async def login(request: Request, _: Annotated[None, public]) -> Response:
        fields = await form_of(request)
        token = fields.get("token", "").strip()
        target = _safe_next(fields.get("next", "/"))
        source, account = client_source(request), account_of(token)
        if token:
            throttle_check(rt, source, account)
        try:
            found = authenticate({"authorization": f"Bearer {token}"}, rt.tokens, rt.oidc)
        except AuthError:
            method = "oidc" if rt.oidc is not None and looks_like_jwt(token) else "token"
            rt.identity.login_failed(method, time.time_ns(), credential=token, directory=rt.tokens)
            if token:
                rt.signins.refused(method, source, account)
            session = session_of(request) or new_session()
            message = "That token was not accepted: check it, or ask an admin for a new one."
            return page(
                request, "login.html", session, None, 401, next=target, message=message,
                sso=sso_name(rt),
            )  # fmt: skip
        owed = owed_factor(rt, found)
        if owed is not None:  # not signed in yet: the second factor comes first
            where = "/login/mfa" if owed == "verify" else "/mfa"
            response = RedirectResponse(f"{where}?next={quote(target, safe='')}", status_code=303)
            return set_session(response, request, new_session(token, owed))
        rt.identity.login(found, found.kind, time.time_ns())
        response = RedirectResponse(target, status_code=303)
        return set_session(response, request, new_session(token))  # a fresh CSRF token too

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request, _: Annotated[None, public]) -> Response:
        await form_of(request)
        session = session_of(request)
        if session is not None and session.token is not None:
            try:
                found = authenticate(
                    {"authorization": f"Bearer {session.token}"}, rt.tokens, rt.oidc
                )
            except AuthError:
                found = None  # the token ended already: nobody to sign out
            if found is not None:
                now = time.time_ns()
                record = rt.store.find_token(found.token_id) if found.kind == "token" else None
                # an SSO session's own token (it has an owner and an end) dies with the session
                revoked = bool(
                    record is not None
                    and record.owner is not None
                    and record.expires_ns is not None
                    and rt.store.revoke_token(found.token_id, now, actor=found.label)
                )
                rt.identity.logout(found, now, revoked=revoked)
        return set_session(RedirectResponse("/login", status_code=303), request, new_session())

    add_saml_routes(app, rt, public, set_session, _safe_next)
    add_mfa_routes(app, rt, public=public, decides=decides, page=page, form_of=form_of,
                   session_of=session_of, set_session=set_session, safe_next=_safe_next)  # fmt: skip
    add_webauthn_routes(app, rt, public=public, decides=decides, session_of=session_of,
                        set_session=set_session, safe_next=_safe_next)  # fmt: skip

    # --- pages -------------------------------------------------------------------------------

    @app.get("/", include_in_schema=False)
    def fleet_page(
        request: Request,
        principal: Annotated[Principal, decides("hosts:read", "incidents:read")],
        state: str = "",
        category: str = "",
        q: str = "",
        group: str = "rack",
    ) -> Response:
        session = session_for(request)
        store = rt.store.scoped(principal)
        held = None  # None: this session may not read remediation (cells show incidents only)
        spares = None
        if allows(rt, principal, "remediation:read"):
            rs = RemediationStore.scoped(rt.db, principal)
            held = remediation_states(rs, state_of_step())
            spares = SpareStore.scoped(rt.db, principal).spares()
        fleet = fleet_view(
            store,
            state=state or None,
            category=category or None,
            text=q,
            remediation=held,
            placements=rt.options.topology,
            group_by=group,
            spares=spares,
        )
        return page(
            request,
            "fleet.html",
            session,
            principal,
            fleet=fleet,
            states=host_states(),
            remediation_shown=held is not None,
            filters={"state": state, "category": category, "q": q, "group": fleet.group_by},
        )

    @app.get("/incidents/{incident_id}", include_in_schema=False)
    def incident_page(
        request: Request,
        principal: Annotated[Principal, decides("incidents:read", "evidence:read", "jobs:read")],
        incident_id: int,
    ) -> Response:
        session = session_for(request)
        store = rt.store.scoped(principal)
        view = guarded(lambda: incident_view(store, incident_id))
        for row in view.evidence:
            row["anchor"] = row_anchor(row)
        diagnosis = view.diagnosis or {}
        entries = [e for e in diagnosis.get("timeline") or [] if isinstance(e, dict)]
        cause_ids = {str(i) for i in (diagnosis.get("root_cause") or {}).get("evidence") or []}
        plans = None  # None: this session may not read plans (the page says nothing of them)
        if allows(rt, principal, "remediation:read"):
            plans = incident_plans(RemediationStore.scoped(rt.db, principal), incident_id)
        return page(
            request,
            "incident.html",
            session,
            principal,
            view=view,
            root=diagnosis.get("root_cause") or {},
            graph=Markup(causal_svg(view.incident, view.evidence)),
            timeline=Markup(timeline_svg(entries, cause_ids)) if entries else None,
            plans=plans,
        )

    @app.post("/incidents/{incident_id}/{verb}", include_in_schema=False)
    async def incident_transition(
        request: Request,
        principal: Annotated[Principal, decides("incidents:write")],
        incident_id: int,
        verb: str,
    ) -> Response:
        to = {"acknowledge": "acknowledged", "resolve": "resolved"}.get(verb)
        if to is None:
            raise UiError(404, f"no action {verb!r} on an incident")
        await form_of(request)
        store = rt.store.scoped(principal)
        guarded(lambda: store.transition(incident_id, to, principal.label, time.time_ns()))
        return RedirectResponse(f"/incidents/{incident_id}", status_code=303)

    @app.get("/evidence/{evidence_id:path}", include_in_schema=False)
    def evidence_page(
        request: Request,
        principal: Annotated[Principal, decides("evidence:read")],
        evidence_id: str,
    ) -> Response:
        session = session_for(request)
        row = guarded(lambda: rt.store.scoped(principal).evidence(evidence_id))
        row["layer"] = layer_of(row["category"])
        return page(request, "evidence.html", session, principal, row=row)

    @app.get("/hosts/{host}", include_in_schema=False)
    def host_page(
        request: Request,
        principal: Annotated[Principal, decides("hosts:read", "incidents:read", "jobs:read")],
        host: str,
    ) -> Response:
        session = session_for(request)
        found = guarded(
            lambda: rt.store.scoped(principal).host(host, since=None, until=None, limit=50)
        )
        for row in found["evidence"]:
            row["layer"] = layer_of(row["category"])
        return page(request, "host.html", session, principal, host=found)

    @app.get("/jobs", include_in_schema=False)
    def jobs_route(
        request: Request,
        principal: Annotated[Principal, decides("jobs:read")],
        job: str = "",
        user: str = "",
        category: str = "",
        host: str = "",
        cursor: str = "",
    ) -> Response:
        session = session_for(request)
        filters = {"job": job, "user": user, "category": category, "host": host}
        try:
            after = decode_cursor(cursor, 2) if cursor else None
        except ValueError:
            raise UiError(400, "that page link is not one this server gave out") from None
        found = jobs_page(rt.store.scoped(principal), filters, after)
        return page(
            request, "jobs.html", session, principal, jobs=found, filters=filters, cursor=cursor
        )


def _query(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


class _SecurityHeaders:
    """Pure ASGI middleware: the CSP and framing headers on every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in SECURITY_HEADERS if k not in have]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)
