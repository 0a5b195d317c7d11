"""The SCIM 2.0 endpoint (`/scim/v2`, RFC 7644) on the FastAPI app: Users, Groups, Bulk,
`.search`, ResourceTypes and Schemas for a bearer token of role `provisioner` (action
`scim:provision`, decided by the one Decides like every route), served by scim2-server's
handler over the caller's tenant's storage (control/scim.py); ServiceProviderConfig is public
(RFC 7643 §5), decided as `service:read`.

It must never serve a tenant but the token's, and never answer a SCIM request with a
traceback (SCIM errors are SCIM error documents).
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import threading
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from denpex.control.access import Decides
from denpex.control.scim import TenantScimStorage, scim_available
from denpex.enterprise import AuthError, Principal
from denpex.enterprise.oidc import Mapping_

PREFIX = "/scim/v2"
MAX_BODY = 1024 * 1024  # the bulk maxPayloadSize the configuration announces
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class _Service:
    """scim2-server's service for denpex's resource types, built at first use."""

    def __init__(self) -> None:
        self._service: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        missing = scim_available()
        if missing:
            raise AuthError(503, missing)
        with self._lock:
            if self._service is None:
                from scim2_models import AuthenticationScheme, ScimProvider
                from scim2_server.service import ScimService
                from scim2_server.utils import (
                    load_default_resource_types,
                    load_default_schemas,
                    load_default_service_provider_config,
                )

                config = load_default_service_provider_config()
                if config.change_password is not None:
                    config.change_password.supported = False  # denpex takes no passwords
                config.authentication_schemes = [
                    AuthenticationScheme(
                        type=AuthenticationScheme.Type.oauthbearertoken,
                        name="denpex bearer token",
                        description="a token of role provisioner: denpex server token "
                        "--tenant T --role provisioner",
                        primary=True,
                    )
                ]
                provider = ScimProvider.from_discovery(
                    load_default_schemas().values(),
                    load_default_resource_types().values(),
                    config=config,
                )
                self._service = ScimService(provider)
            return self._service


def add_scim_routes(
    app: FastAPI, rt: Any, principal: Callable[[str], Decides], public: Decides
) -> None:
    service = _Service()

    def rules(tenant: str) -> Sequence[Mapping_]:
        return [m for m in rt.identity_rules() if m.tenant == tenant]

    async def serve(request: Request, who: Principal | None, path: str) -> Response:
        from scim2_models import SCIMException
        from scim2_server.handler import ScimHandler
        from scim2_server.requests import ScimRequest

        svc = service.get()
        body = await request.body()
        if len(body) > MAX_BODY:
            raise AuthError(413, f"a SCIM request is at most {MAX_BODY} bytes")
        scim_request = ScimRequest(
            method=request.method,
            base_url=str(request.base_url).rstrip("/") + PREFIX,
            path="/" + path.removesuffix(".scim"),
            query=dict(request.query_params),
            headers=list(request.headers.items()),
            body=body,
            subject=who,
        )
        tenant, actor = (who.tenant, who.label) if who is not None else ("", "anonymous")
        # the public ServiceProviderConfig reads no storage: its tenant is none
        storage = TenantScimStorage(rt.db, rt.store, rt.identity, tenant, rules, svc.get_model,
                                    actor)  # fmt: skip
        handler = ScimHandler(svc, storage)
        handle = handler.handle if who is not None else handler.service_provider_config
        try:
            reply = await run_in_threadpool(handle, scim_request)
        except SCIMException as exc:
            reply = svc.error_response(exc)
        headers = {k: v for k, v in reply.headers.items() if k.lower() != "content-type"}
        if reply.body is None:
            return Response(status_code=int(reply.status), headers=headers)
        return JSONResponse(
            reply.body,
            status_code=int(reply.status),
            headers=headers,
            media_type="application/scim+json",
        )

    @app.get(f"{PREFIX}/ServiceProviderConfig", tags=["scim"], summary="SCIM capabilities")
    async def scim_config(request: Request, _: Annotated[None, Depends(public)]) -> Response:
        return await serve(request, None, "ServiceProviderConfig")

    for method in METHODS:

        async def scim(
            request: Request,
            who: Annotated[Principal, Depends(principal("scim:provision"))],
            path: str,
        ) -> Response:
            return await serve(request, who, path)

        app.add_api_route(
            f"{PREFIX}/{{path:path}}",
            scim,
            methods=[method],
            tags=["scim"],
            summary=f"SCIM {method} (Users, Groups, Bulk, .search, ResourceTypes, Schemas)",
            name=f"scim_{method.lower()}",
        )
