"""Single sign-on for the web UI: "Sign in with <provider>" runs the OpenID Connect
authorization code flow with PKCE (RFC 7636) against the server's OIDC provider (`denpex
server --oidc FILE`, its `web:` client), checks state, issuer (RFC 9207) and nonce, maps the
ID token's groups to a tenant and role by the configuration's mappings, and opens the same
sealed session a token login does, holding the ID token (every page re-verifies it, so the
session ends when the token expires or the mapping no longer gives it a role).

The pending login (state, nonce, PKCE verifier, where to go next) lives in a second sealed
cookie, SameSite=Lax so it comes back on the provider's top-level redirect, for ten minutes
and for one use. It must never open a session for a callback whose state is not the one it
sent, for an ID token the verifier refused, or for an identity no mapping places.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import hmac
import logging
import secrets
import time
import urllib.parse
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from denpex.control.ui.action_routes import PageKit
from denpex.control.ui.session import (
    SessionCodec,
    UiError,
    client_source,
    new_session,
    safe_next,
    throttle_check,
)
from denpex.enterprise.auth import Principal
from denpex.enterprise.credentials import OIDC_CLIENT_SECRET
from denpex.enterprise.oidc import OidcError, OidcVerifier
from denpex.enterprise.oidc_login import pkce_pair, token_request

log = logging.getLogger("denpex.server.sso")

PENDING_COOKIE = "denpex_sso"
PENDING_PATH = "/login/oidc"
PENDING_TTL_S = 600  # a person signs in at the provider within ten minutes


def sso_name(rt: Any) -> str | None:
    """The provider's name for the login page's button; None when SSO is not configured."""
    verifier: OidcVerifier | None = getattr(rt, "oidc", None)
    if verifier is None or not verifier.config.web_client_id:
        return None
    return verifier.config.web_name


def _verifier(rt: Any) -> OidcVerifier:
    verifier: OidcVerifier | None = getattr(rt, "oidc", None)
    if verifier is None or not verifier.config.web_client_id:
        raise UiError(
            404,
            "single sign-on is not configured on this server "
            "(its --oidc file names no web.client_id)",
        )
    return verifier


def _redirect_uri(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}{PENDING_PATH}/callback"


def add_sso_routes(app: FastAPI, rt: Any, kit: PageKit, codec: SessionCodec) -> None:
    def refused(request: Request, status: int, message: str, next_path: str = "/") -> Response:
        session = kit.session_of(request) or new_session()
        response = kit.page(
            request, "login.html", session, None, status, next=next_path, message=message,
            sso=sso_name(rt),
        )  # fmt: skip
        response.delete_cookie(PENDING_COOKIE, path=PENDING_PATH)
        return kit.set_session(response, request, session)

    @app.get(PENDING_PATH, include_in_schema=False)
    def sso_start(request: Request, _: Annotated[None, kit.public], next: str = "/") -> Response:
        verifier = _verifier(rt)
        config = verifier.config
        try:
            endpoint = verifier.discovery.document()["authorization_endpoint"]
        except (OidcError, KeyError) as exc:
            log.warning("single sign-on: the provider's discovery failed: %s", exc)
            return refused(
                request,
                502,
                "The sign-in provider cannot be reached right now; "
                "log in with a token, or try again.",
            )
        code_verifier, challenge = pkce_pair()
        pending = {
            "state": secrets.token_urlsafe(24),
            "nonce": secrets.token_urlsafe(24),
            "verifier": code_verifier,
            "next": safe_next(next),
        }
        params = {
            "response_type": "code",
            "client_id": config.web_client_id or "",
            "redirect_uri": _redirect_uri(request),
            "scope": " ".join(config.web_scopes),
            "state": pending["state"],
            "nonce": pending["nonce"],
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        if config.login_resource:
            params["resource"] = config.login_resource
        response = RedirectResponse(endpoint + "?" + urllib.parse.urlencode(params), 303)
        response.set_cookie(
            PENDING_COOKIE,
            codec.seal_data(pending),
            max_age=PENDING_TTL_S,
            path=PENDING_PATH,
            httponly=True,
            samesite="lax",  # it must come back on the provider's cross-site redirect
            secure=request.url.scheme == "https",
        )
        return response

    @app.get(PENDING_PATH + "/callback", include_in_schema=False)
    def sso_callback(
        request: Request,
        _: Annotated[None, kit.public],
        state: str = "",
        code: str = "",
        error: str = "",
        iss: str = "",
    ) -> Response:
        verifier = _verifier(rt)
        config = verifier.config
        source = client_source(request)
        throttle_check(rt, source)  # a flood of forged callbacks waits; nothing is checked
        pending = codec.open_data(request.cookies.get(PENDING_COOKIE), PENDING_TTL_S)
        if pending is None:
            rt.signins.refused("oidc", source)
            return refused(
                request, 400, "That sign-in expired or was not started here: start again."
            )
        next_path = str(pending.get("next") or "/")
        if not state or not hmac.compare_digest(state.encode(), str(pending["state"]).encode()):
            log.warning("single sign-on: a callback with another state was refused")
            rt.signins.refused("oidc", source)
            return refused(
                request,
                400,
                "That sign-in answer did not match the one this browser started: "
                "refused. Start again.",
                next_path,
            )
        if iss and iss.rstrip("/") != config.issuer:  # RFC 9207: an answer from another provider
            log.warning("single sign-on: a callback from issuer %r was refused", iss)
            rt.signins.refused("oidc", source)
            return refused(
                request, 400, "That sign-in answer came from another provider: refused.", next_path
            )
        if error or not code:
            return refused(
                request, 401, f"The provider did not sign you in ({error or 'no code'}).", next_path
            )
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": _redirect_uri(request),
            "code_verifier": str(pending["verifier"]),
            "client_id": config.web_client_id or "",
        }
        if config.login_resource:
            form["resource"] = config.login_resource
        # the server's credentials secret first: a rotated client secret is used at once
        secret = rt.credential(OIDC_CLIENT_SECRET) or config.web_client_secret
        try:
            doc = verifier.discovery.document()
            tokens = token_request(
                doc["token_endpoint"],
                form,
                (config.web_client_id or "", secret) if secret else None,
            )
            id_token = str(tokens.get("id_token") or "")
            identity = verifier.verify(id_token, nonce=str(pending["nonce"]))
            tenant, role = verifier.binding(identity)
        except (OidcError, KeyError) as exc:
            log.warning("single sign-on refused: %s", exc)
            rt.identity.login_failed("oidc", time.time_ns())
            rt.signins.refused("oidc", source)
            return refused(
                request,
                403,
                "The provider signed you in, but this server does not accept that identity "
                "here (no tenant and role for your groups, or the token did not verify). "
                "Ask an admin.",
                next_path,
            )
        log.info("single sign-on: oidc:%s as %s in %s", identity.subject, role, tenant)
        principal = Principal(tenant, role, identity.subject, kind="oidc")
        # raises when the record cannot be written: no unaudited way in
        rt.identity.login(principal, "oidc", time.time_ns())
        session = new_session(id_token)
        # A plain page that moves on by itself: after a redirect chain that began at the
        # provider (another site), the browser would hold back the SameSite=Strict session
        # cookie on a redirect; a navigation this page starts is same-site.
        response = kit.page(request, "signed_in.html", session, None, next=next_path,
                            subject=identity.subject, tenant=tenant, role=role,
                            expires=int(identity.claims.get("exp", time.time())))  # fmt: skip
        response.delete_cookie(PENDING_COOKIE, path=PENDING_PATH)  # one use
        return kit.set_session(response, request, session)
