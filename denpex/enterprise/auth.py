"""Authentication of one request: `authenticate(headers, directory)` gives the Principal
(tenant, role, token id, scope) or raises AuthError. The control plane authenticates, then
authorises through denpex.enterprise.authz, before it touches any tenant's data, and obtains
its storage handle from the Principal.

It must never return a Principal for a request it could not tie to exactly one tenant, and
never say which part of a bad token was wrong (a 401 is a 401).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from denpex.core import bus
from denpex.enterprise.oidc import OidcError, OidcVerifier, looks_like_jwt
from denpex.enterprise.tokens import parse_token, secret_matches

log = logging.getLogger("denpex.enterprise")

_SEAL = object()  # only this module builds Principals that is_authentic() accepts


class AuthError(Exception):
    """A request refused: `status` is 401 (who are you?) or 403 (not allowed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What the store keeps of a token (never the secret)."""

    token_id: str
    tenant: str
    role: str
    secret_hash: str
    revoked: bool = False
    owner: str | None = None  # the person it stands for (an SSO session's, a SCIM user's)
    expires_ns: int | None = None  # None: until revoked


class TokenDirectory(Protocol):
    def find_token(self, token_id: str) -> TokenRecord | None: ...


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: bound to one tenant and one role, optionally scoped to node pools,
    partitions or failure categories (empty: all of them)."""

    tenant: str
    role: str
    token_id: str
    _seal: object = field(default=None, repr=False, compare=False)
    node_pools: frozenset[str] = frozenset()
    partitions: frozenset[str] = frozenset()
    categories: frozenset[str] = frozenset()
    kind: str = "token"  # token (a dpx_ bearer token) | oidc (a verified OIDC token)

    @property
    def label(self) -> str:
        """How logs, the denial log and incident actors name it: token:<id> or oidc:<sub>."""
        return f"{self.kind}:{self.token_id}"


def is_authentic(principal: object) -> bool:
    """Whether `principal` came out of authenticate() (storage handles check this)."""
    return isinstance(principal, Principal) and principal._seal is _SEAL


def bearer_token(headers: Mapping[str, str]) -> str:
    value = headers.get("authorization") or headers.get("Authorization") or ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
    return token.strip()


def authenticate(
    headers: Mapping[str, str], directory: TokenDirectory, oidc: OidcVerifier | None = None
) -> Principal:
    """The Principal of a request carrying `Authorization: Bearer dpx_…` or, when `oidc` is
    configured, an OIDC ID token or JWT access token; else AuthError 401."""
    token = bearer_token(headers)
    if oidc is not None and looks_like_jwt(token):
        return _from_oidc(token, headers, oidc)
    parsed = parse_token(token)
    if parsed is None:
        raise AuthError(401, "invalid bearer token")
    token_id, secret = parsed
    record = directory.find_token(token_id)
    if record is None or record.revoked or not secret_matches(secret, record.secret_hash):
        raise AuthError(401, "invalid bearer token")
    if not record.tenant or not record.role:
        raise AuthError(401, "invalid bearer token")
    if record.expires_ns is not None and record.expires_ns <= time.time_ns():
        raise AuthError(401, "invalid bearer token")
    return Principal(record.tenant, record.role, record.token_id, _SEAL)


def authenticate_bus_message(
    subject: str, headers: Mapping[str, str], payload: bytes, directory: TokenDirectory
) -> Principal:
    """The Principal of an ingest-bus message (denpex.core.bus): the token its subject names,
    when its signature verifies against that token's stored hash; else AuthError 401."""
    try:
        token_id, _kind = bus.parse_subject(subject)
    except bus.BusError:
        raise AuthError(401, "unsigned or badly addressed bus message") from None
    msg_id, signature = headers.get(bus.MSG_ID) or "", headers.get(bus.SIGNATURE) or ""
    record = directory.find_token(token_id)
    if (
        record is None
        or record.revoked
        or not msg_id
        or not bus.signature_matches(record.secret_hash, subject, msg_id, payload, signature)
    ):
        raise AuthError(401, "bus message signature does not verify")
    if not record.tenant or not record.role:
        raise AuthError(401, "bus message signature does not verify")
    return Principal(record.tenant, record.role, record.token_id, _SEAL)


def _from_oidc(token: str, headers: Mapping[str, str], oidc: OidcVerifier) -> Principal:
    wanted = headers.get("x-denpex-tenant") or headers.get("X-Denpex-Tenant") or None
    try:
        identity = oidc.verify(token)
        tenant, role = oidc.binding(identity, wanted)
    except OidcError as exc:
        log.info("OIDC token refused: %s", exc)
        raise AuthError(401, "invalid bearer token") from None
    return Principal(tenant, role, identity.subject, _SEAL, kind="oidc")
