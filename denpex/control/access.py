"""The control plane's access seam: `Decides`, the one auth dependency every route names
(authenticate, then ask denpex.enterprise's policy set; a denial is logged and answered 403),
and the enterprise routes built on it: the denial log and the tenant's stored secrets.

It must never let a route run before its decision, never answer a secret's value, and never
take the tenant from anything but the authenticated principal.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import time
from typing import Annotated, Protocol

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from denpex.control.denials import DenialStore
from denpex.control.secrets import MAX_VALUE, SecretStore
from denpex.control.signin_guard import SignInGuard, account_of, bearer_of, source_of
from denpex.control.store import NotFound, decode_cursor, encode_cursor
from denpex.enterprise import (
    ANONYMOUS,
    AuthError,
    OidcVerifier,
    PolicySet,
    Principal,
    Resource,
    TokenDirectory,
    authenticate,
    authorize,
    decide,
)


class AccessRuntime(Protocol):
    """What the access seam uses of the server's Runtime."""

    tokens: TokenDirectory
    policies: PolicySet
    denials: DenialStore
    oidc: OidcVerifier | None
    secrets: SecretStore
    signins: SignInGuard


class Decides:
    """The one auth dependency: authenticate (unless `public`), then ask the policy set
    whether the caller may do `action` (and each of `also`: a page that shows several kinds
    of data needs each) on the route's resource; a denial is recorded in the denial log and
    answered 403. The resource is the action's kind in the caller's tenant, with the
    `category` and `host` the request names."""

    def __init__(
        self, rt: AccessRuntime, action: str, *, public: bool = False, also: tuple[str, ...] = ()
    ) -> None:
        for name in (action, *also):
            if name not in rt.policies.actions:
                raise ValueError(f"route action {name!r} is not in the policy set's manifest")
        self.rt = rt
        self.action = action
        self.also = also
        self.public = public
        self.kind = action.partition(":")[0]

    def __call__(self, request: Request) -> Principal | None:
        if self.public:
            self.decide_public()
            return None
        credential = bearer_of(request.headers)
        if not credential:  # no sign-in attempt: a plain 401, not counted
            return self.decide(request, authenticate(request.headers, self.rt.tokens, self.rt.oidc))
        source = source_of(request.client.host if request.client else None)
        account = account_of(credential)
        self.rt.signins.check(source, account)  # SignInThrottled: 429 before any check
        try:
            found = authenticate(request.headers, self.rt.tokens, self.rt.oidc)
        except AuthError as exc:
            if exc.status == 401:
                self.rt.signins.refused("api", source, account, self._tenant_of(account))
            raise
        return self.decide(request, found)

    def _tenant_of(self, account: str | None) -> str | None:
        record = self.rt.tokens.find_token(account[6:]) if account else None
        return record.tenant if record is not None else None

    def decide_public(self) -> None:
        """No principal: the route serves no tenant's data."""
        rt = self.rt
        resource = Resource(self.kind, "")
        authorize(ANONYMOUS, self.action, resource, policies=rt.policies, denials=rt.denials)

    def decide(self, request: Request, found: Principal) -> Principal:
        """`found` (authenticated by the caller) when the policy set allows every action."""
        rt = self.rt
        attrs = {k: v for k in ("category", "host") if (v := request.query_params.get(k))}
        for action in (self.action, *self.also):
            resource = Resource(action.partition(":")[0], found.tenant, attrs)
            authorize(found, action, resource, policies=rt.policies, denials=rt.denials)
        return found


def allows(rt: AccessRuntime, principal: Principal, action: str) -> bool:
    """Whether the policy set would allow `action` in the principal's tenant: for showing or
    hiding a control, never for guarding a route (nothing is recorded)."""
    resource = Resource(action.partition(":")[0], principal.tenant)
    return decide(principal, action, resource, policies=rt.policies).allowed


class SecretValue(BaseModel):
    value: str = Field(min_length=1, max_length=MAX_VALUE)


def add_access_routes(app: FastAPI, rt: AccessRuntime) -> None:
    """The denial log (audit:read) and the tenant's secrets (tenant:admin)."""

    @app.get("/api/v1/denials", tags=["audit"], summary="requests the policy set refused")
    def list_denials(
        who: Annotated[Principal, Depends(Decides(rt, "audit:read"))],
        limit: Annotated[int, Query(ge=1, le=1000, description="items per page")] = 100,
        cursor: Annotated[
            str | None, Query(description="`next_cursor` of the previous page")
        ] = None,
    ) -> Response:
        try:
            before = decode_cursor(cursor, 1)[0] if cursor else None
        except ValueError as exc:
            raise AuthError(400, f"cursor: {exc}") from None
        items, last = rt.denials.list(who, limit=limit, before=before)
        next_cursor = encode_cursor((last,)) if last is not None else None
        return JSONResponse({"items": items, "next_cursor": next_cursor})

    @app.get("/api/v1/secrets", tags=["secrets"], summary="names of the tenant's secrets")
    def list_secrets(who: Annotated[Principal, Depends(Decides(rt, "tenant:admin"))]) -> Response:
        return JSONResponse({"items": rt.secrets.names(who)})

    @app.put("/api/v1/secrets/{name}", tags=["secrets"], summary="store a secret, sealed")
    def put_secret(
        who: Annotated[Principal, Depends(Decides(rt, "tenant:admin"))],
        name: str,
        body: SecretValue,
    ) -> Response:
        return JSONResponse(rt.secrets.put(who, name, body.value, time.time_ns()))

    @app.delete("/api/v1/secrets/{name}", tags=["secrets"], status_code=204)
    def delete_secret(
        who: Annotated[Principal, Depends(Decides(rt, "tenant:admin"))], name: str
    ) -> Response:
        if not rt.secrets.delete(who, name):
            raise NotFound(f"no secret {name!r}")
        return Response(status_code=204)
