"""The web UI's second-factor routes: the code page a token sign-in owes when its person has
a TOTP factor (`/login/mfa`), enrolment and confirmation (`/mfa`, `/mfa/enrol`,
`/mfa/confirm`, action identity:self, reachable by a session that owes its enrolment because
the tenant requires a second factor) and the tenant's setting in the API
(`/api/v1/tenant/mfa`, tenant:admin). SSO sign-ins (SAML, OIDC) leave the second factor to
the identity provider; API bearer tokens are machine credentials and owe none.

It must never treat a session as signed in before its second factor was given, never show a
TOTP key or recovery code twice, and never say whether a wrong code was close.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel

from denpex.control.access import Decides
from denpex.control.ui.session import Session, UiError, client_source, new_session, throttle_check
from denpex.enterprise import AuthError, Principal, authenticate
from denpex.enterprise.mfa import MfaError, provisioning_uri


class MfaSetting(BaseModel):
    required: bool


def mfa_subject(rt: Any, principal: Principal) -> str:
    """Whose factor it is: the person a token stands for (its owner), else the token itself."""
    if principal.kind == "token":
        record = rt.store.find_token(principal.token_id)
        if record is not None and record.owner:
            return str(record.owner)
    return principal.label


def owed_factor(rt: Any, principal: Principal) -> str | None:
    """What a token sign-in still owes: 'verify', 'enrol' or None."""
    if principal.kind != "token":
        return None
    if rt.mfa.confirmed(principal.tenant, mfa_subject(rt, principal)):
        return "verify"
    return "enrol" if rt.mfa.required(principal.tenant) else None


def add_mfa_routes(
    app: FastAPI,
    rt: Any,
    *,
    public: Any,
    decides: Callable[..., Any],
    page: Callable[..., Response],
    form_of: Callable[[Request], Awaitable[dict[str, str]]],
    session_of: Callable[[Request], Session | None],
    set_session: Callable[[Response, Request, Session], Response],
    safe_next: Callable[[str], str],
) -> None:
    enrolling = decides("identity:self", enrolling=True)

    def owing(request: Request) -> tuple[Session, Principal]:
        session = session_of(request)
        if session is None or session.token is None or session.mfa != "verify":
            raise UiError(409, "no sign-in waits for a second factor: log in first")
        try:
            found = authenticate({"authorization": f"Bearer {session.token}"}, rt.tokens, None)
        except AuthError:
            raise UiError(401, "that sign-in is no longer valid: log in again") from None
        return session, found

    @app.get("/login/mfa", include_in_schema=False)
    def mfa_form(request: Request, _: Annotated[None, public], next: str = "/") -> Response:
        session, found = owing(request)
        keys = len(rt.mfa.security_keys(found.tenant, mfa_subject(rt, found)))
        return page(request, "mfa_code.html", session, None, next=safe_next(next), keys=keys)

    @app.post("/login/mfa", include_in_schema=False)
    async def mfa_verify(request: Request, _: Annotated[None, public]) -> Response:
        fields = await form_of(request)
        session, found = owing(request)
        source, account = client_source(request), found.label
        throttle_check(rt, source, account)  # a code guesser waits out the window
        now = time.time_ns()
        how = rt.mfa.verify(found.tenant, mfa_subject(rt, found), fields.get("code", ""), now)
        target = safe_next(fields.get("next", "/"))
        if how is None:
            rt.identity.login_failed("totp", now, subject=found.label, tenant=found.tenant)
            rt.signins.refused("totp", source, account, found.tenant)
            message = "That code was not accepted."
            return page(request, "mfa_code.html", session, None, 401, next=target,
                        message=message)  # fmt: skip
        rt.identity.login(found, found.kind, now, mfa=how)
        response = RedirectResponse(target, status_code=303)
        return set_session(response, request, new_session(session.token))

    def enrolment(request: Request, who: Principal, code: int = 200, **context: Any) -> Response:
        session = request.state.session
        subject = mfa_subject(rt, who)
        enrolled = rt.mfa.totp_confirmed(who.tenant, subject)
        keys = len(rt.mfa.security_keys(who.tenant, subject))
        return page(request, "mfa.html", session, who, code, enrolled=enrolled, keys=keys,
                    owed=session.mfa == "enrol", **context)  # fmt: skip

    @app.get("/mfa", include_in_schema=False)
    def mfa_page(request: Request, who: Annotated[Principal, enrolling]) -> Response:
        return enrolment(request, who)

    @app.post("/mfa/enrol", include_in_schema=False)
    async def mfa_enrol(request: Request, who: Annotated[Principal, enrolling]) -> Response:
        await form_of(request)
        subject = mfa_subject(rt, who)
        try:
            secret = rt.mfa.begin(who.tenant, subject, time.time_ns())
        except MfaError as exc:
            return enrolment(request, who, 409, message=str(exc))
        uri = provisioning_uri(secret, f"{subject}@{who.tenant}")
        return enrolment(request, who, secret=secret, uri=uri)

    @app.post("/mfa/confirm", include_in_schema=False)
    async def mfa_confirm(request: Request, who: Annotated[Principal, enrolling]) -> Response:
        fields = await form_of(request)
        now = time.time_ns()
        codes = rt.mfa.confirm(who.tenant, mfa_subject(rt, who), fields.get("code", ""), now)
        if codes is None:
            message = "That code was not accepted: set up the key again and enter a fresh code."
            return enrolment(request, who, 400, message=message)
        session: Session = request.state.session
        response = enrolment(request, who, codes=codes)
        if session.mfa == "enrol":  # the sign-in this enrolment was owed completes now
            rt.identity.login(who, who.kind, now, mfa="totp-enrolled")
            return set_session(response, request, new_session(session.token))
        return response


def add_mfa_api(app: FastAPI, rt: Any, principal: Callable[[str], Decides]) -> None:
    @app.get("/api/v1/tenant/mfa", tags=["tenant"], summary="whether token sign-ins need MFA")
    def get_mfa(who: Annotated[Principal, Depends(principal("tenant:admin"))]) -> Response:
        return JSONResponse({"required": rt.mfa.required(who.tenant)})

    @app.put("/api/v1/tenant/mfa", tags=["tenant"], summary="require a second factor (or not)")
    def put_mfa(
        who: Annotated[Principal, Depends(principal("tenant:admin"))], body: MfaSetting
    ) -> Response:
        rt.mfa.set_required(who.tenant, body.required, who.label, time.time_ns())
        return JSONResponse({"required": body.required})
