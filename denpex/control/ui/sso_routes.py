"""The web UI's SAML 2.0 routes: the SP metadata (`GET /saml/metadata`), the redirect to the
IdP with a fresh AuthnRequest (`GET /saml/login`) and the assertion consumer service
(`POST /saml/acs`), which opens a UI session for the tenant and role the assertion's groups
map to. All three are public (decided as `service:read` by the pages' PageDecides); on a
server without `--saml` they answer 404.

The ACS is the one POST without the session's CSRF token: the IdP's form posts it from
another site, and the signed, solicited, once-only assertion is its proof. It must never open
a session for a response denpex.enterprise.saml refused, and never say why to the browser.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import html
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from denpex.control.scim import user_role
from denpex.control.sso import open_session_token
from denpex.control.ui.session import (
    Session,
    UiError,
    client_source,
    new_session,
    throttle_check,
)
from denpex.enterprise import AuthError, authenticate
from denpex.enterprise.saml import SamlError, SamlServiceProvider

log = logging.getLogger("denpex.server")
MAX_ACS_BYTES = 256 * 1024  # a signed response with a few attributes is under 16 KB


def add_sso_routes(
    app: FastAPI,
    rt: Any,
    public: Any,
    set_session: Callable[[Response, Request, Session], Response],
    safe_next: Callable[[str], str],
) -> None:
    def provider() -> SamlServiceProvider:
        sp: SamlServiceProvider | None = getattr(rt, "saml", None)
        if sp is None:
            raise UiError(404, "this server has no SAML identity provider (denpex server --saml)")
        return sp

    @app.get("/saml/metadata", include_in_schema=False)
    def saml_metadata(_: Annotated[None, public]) -> Response:
        return Response(provider().metadata(), media_type="application/samlmetadata+xml")

    @app.get("/saml/login", include_in_schema=False)
    def saml_login(_: Annotated[None, public], next: str = "/") -> Response:
        return RedirectResponse(provider().login_url(safe_next(next)), status_code=303)

    @app.post("/saml/acs", include_in_schema=False)
    async def saml_acs(request: Request, _: Annotated[None, public]) -> Response:
        sp = provider()
        source = client_source(request)
        throttle_check(rt, source)
        body = await request.body()
        if len(body) > MAX_ACS_BYTES:
            raise UiError(413, "SAML response too large")
        fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        now = time.time_ns()
        try:
            identity = sp.consume(fields.get("SAMLResponse", ""))
            tenant, role = sp.binding(identity)
            provisioned = user_role(rt.db, tenant, identity.name_id)
            if provisioned is not None:  # SCIM knows them: it says whether and as what
                active, scim_role = provisioned
                if not active or scim_role is None:
                    raise SamlError(f"{identity.name_id}: deprovisioned or without a role (SCIM)")
                role = scim_role
        except SamlError as exc:
            log.info("SAML sign-in refused: %s", exc)
            rt.identity.login_failed("saml", now)
            rt.signins.refused("saml", source)
            raise UiError(401, "The identity provider's answer was not accepted.") from None
        owner = f"saml:{identity.name_id}"
        token = open_session_token(rt.store, tenant, role, owner, now, sp.config.session_s, "saml")
        try:
            principal = authenticate({"authorization": f"Bearer {token}"}, rt.tokens, None)
        except AuthError:  # a token minted a moment ago: only a broken store gets here
            raise UiError(503, "the session could not be opened; try again") from None
        rt.identity.login(principal, "saml", now, name_id=identity.name_id)
        target = safe_next(fields.get("RelayState", "/"))
        # a page, not a redirect: the SameSite=Strict cookie travels only on a same-site
        # navigation, and a redirect answering the IdP's cross-site POST is not one
        page = (
            f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(target)}">'
            f'<title>Signed in</title><p><a href="{html.escape(target)}">Continue</a></p>'
        )
        response = HTMLResponse(page, headers={"Cache-Control": "no-store"})
        return set_session(response, request, new_session(token))
