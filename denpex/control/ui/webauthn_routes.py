"""The web UI's security-key routes (WebAuthn, driven by static/webauthn.js): register a key
(`/mfa/webauthn/options`, `/mfa/webauthn/register`, action identity:self, open to a session
owing its enrolment) and give it as the second factor a sign-in owes
(`/login/webauthn/options`, `/login/webauthn`, public like the code page). The challenge
travels in the sealed session; the RP id is the server's host name, the origin its own.

Each is a JSON POST carrying the session's CSRF token in `X-Denpex-CSRF` from the same
origin. It must never accept an answer to a challenge the session was not given, and never
complete a sign-in whose key's counter did not move forward.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import time
from base64 import urlsafe_b64decode, urlsafe_b64encode
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from denpex.control.ui.mfa_routes import mfa_subject
from denpex.control.ui.session import CsrfRefused, Session, UiError, check_csrf, new_session
from denpex.enterprise import AuthError, Principal, authenticate
from denpex.enterprise import webauthn_factor as wa
from denpex.enterprise.mfa import MfaError

MAX_JSON = 64 * 1024


def _b64(data: bytes) -> str:
    return urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return urlsafe_b64decode(text + "=" * (-len(text) % 4))


def add_webauthn_routes(
    app: FastAPI,
    rt: Any,
    *,
    public: Any,
    decides: Callable[..., Any],
    session_of: Callable[[Request], Session | None],
    set_session: Callable[[Response, Request, Session], Response],
    safe_next: Callable[[str], str],
) -> None:
    enrolling = decides("identity:self", enrolling=True)

    def party(request: Request) -> tuple[str, str]:
        return request.url.hostname or "", f"{request.url.scheme}://{request.url.netloc}"

    async def json_of(request: Request) -> tuple[Session, dict[str, Any]]:
        origin = request.headers.get("origin")
        if origin and origin != party(request)[1]:
            raise CsrfRefused()
        session = session_of(request)
        check_csrf(session, request.headers.get("x-denpex-csrf"))
        assert session is not None  # check_csrf refused a missing one
        body = await request.body()
        if len(body) > MAX_JSON:
            raise UiError(413, "too large")
        try:
            import json

            value = json.loads(body or b"{}")
        except ValueError:
            raise UiError(400, "not JSON") from None
        if not isinstance(value, dict):
            raise UiError(400, "not a JSON object")
        return session, value

    def with_challenge(request: Request, session: Session, options: str, challenge: bytes):
        response = Response(options, media_type="application/json")
        return set_session(response, request, replace(session, challenge=_b64(challenge)))

    def owing(session: Session) -> Principal:
        if session.token is None or session.mfa != "verify":
            raise UiError(409, "no sign-in waits for a second factor: log in first")
        try:
            return authenticate({"authorization": f"Bearer {session.token}"}, rt.tokens, None)
        except AuthError:
            raise UiError(401, "that sign-in is no longer valid: log in again") from None

    @app.post("/mfa/webauthn/options", include_in_schema=False)
    async def key_options(request: Request, who: Annotated[Principal, enrolling]) -> Response:
        session, _ = await json_of(request)
        subject = mfa_subject(rt, who)
        known = [k[0] for k in rt.mfa.security_keys(who.tenant, subject)]
        user_id = subject.encode()[:64]
        options, challenge = wa.registration_options(
            party(request)[0], "denpex", user_id, f"{subject}@{who.tenant}", known
        )
        return with_challenge(request, session, options, challenge)

    @app.post("/mfa/webauthn/register", include_in_schema=False)
    async def key_register(request: Request, who: Annotated[Principal, enrolling]) -> Response:
        session, answer = await json_of(request)
        if session.challenge is None:
            raise UiError(409, "ask for the options first")
        rp_id, origin = party(request)
        now = time.time_ns()
        try:
            key = wa.verify_registration(answer, _unb64(session.challenge), rp_id, origin)
        except MfaError as exc:
            raise UiError(400, str(exc)) from None
        rt.mfa.add_security_key(who.tenant, mfa_subject(rt, who), key, now)
        fresh = replace(session, challenge=None)
        if session.mfa == "enrol":  # the sign-in this enrolment was owed completes now
            rt.identity.login(who, who.kind, now, mfa="webauthn-enrolled")
            fresh = new_session(session.token)
        return set_session(JSONResponse({"registered": True}), request, fresh)

    @app.post("/login/webauthn/options", include_in_schema=False)
    async def login_options(request: Request, _: Annotated[None, public]) -> Response:
        session, _body = await json_of(request)
        found = owing(session)
        keys = rt.mfa.security_keys(found.tenant, mfa_subject(rt, found))
        if not keys:
            raise UiError(409, "no security key is registered for this sign-in")
        options, challenge = wa.authentication_options(party(request)[0], [k[0] for k in keys])
        return with_challenge(request, session, options, challenge)

    @app.post("/login/webauthn", include_in_schema=False)
    async def login_key(request: Request, _: Annotated[None, public]) -> Response:
        session, answer = await json_of(request)
        found = owing(session)
        subject = mfa_subject(rt, found)
        now = time.time_ns()
        rp_id, origin = party(request)
        try:
            if session.challenge is None:
                raise MfaError("no challenge was given to this session")
            wanted = wa.credential_id_of(answer)
            key = next((k for k in rt.mfa.security_keys(found.tenant, subject) if k[0] == wanted),
                       None)  # fmt: skip
            if key is None:
                raise MfaError("not a key of this person")
            count = wa.verify_authentication(
                answer, _unb64(session.challenge), rp_id, origin, key[1], key[2]
            )
            if not rt.mfa.advance_security_key(found.tenant, subject, key[0], key[2], count):
                raise MfaError("the key's counter moved meanwhile")
        except MfaError:
            rt.identity.login_failed("webauthn", now, subject=found.label, tenant=found.tenant)
            response = JSONResponse({"error": "that key's answer was not accepted"}, 401)
            return set_session(response, request, replace(session, challenge=None))
        rt.identity.login(found, found.kind, now, mfa="webauthn")
        target = safe_next(str(answer.get("next") or "/"))
        return set_session(JSONResponse({"next": target}), request, new_session(session.token))
