"""OpenID Connect for the control plane: the provider's discovery document and signing keys
(JWKS, cached, fetched again when a token names a key id it does not know: key rotation),
verification of ID tokens and JWT access tokens (joserfc), and the mapping of a verified
token's groups or client id to one tenant and role (configuration, not code).

It must never accept a token whose algorithm is not an asymmetric one the configuration
allows (`alg: none` and HS/RS confusion are refused before any key is used), nor one whose
iss, aud, exp, nbf (or, when the caller expects one, nonce) do not check out, and never say
which check failed to the caller (the reason goes to the log; a 401 is a 401).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("denpex.enterprise")

ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)


class OidcError(Exception):
    """A token refused (the reason is for the log, never for the caller)."""


class OidcConfigError(ValueError):
    """An OIDC configuration that cannot be used: says which field and why."""


@dataclass(frozen=True, slots=True)
class Mapping_:
    """One rule: a member of `group` (or the client `client`) is `role` in `tenant`."""

    tenant: str
    role: str
    group: str | None = None
    client: str | None = None


def parse_mappings(raw: Any, where: str) -> tuple[Mapping_, ...]:
    """The `mappings:` list of an identity provider's configuration (OIDC, SAML)."""
    mappings = tuple(
        Mapping_(
            tenant=str(m["tenant"]),
            role=str(m["role"]),
            group=str(m["group"]) if m.get("group") else None,
            client=str(m["client"]) if m.get("client") else None,
        )
        for m in raw
    )
    if any((m.group is None) == (m.client is None) for m in mappings):
        raise OidcConfigError(f"{where}: each mapping names a group or a client (one)")
    return mappings


def bind(
    mappings: tuple[Mapping_, ...],
    subject: str,
    groups: tuple[str, ...],
    client: str | None = None,
    tenant: str | None = None,
) -> tuple[str, str]:
    """(tenant, role) of the first mapping `groups` (or, for a client acting for itself,
    `client`) match, in `tenant` when the caller names one; OidcError when none or when
    several tenants match and none is named."""
    matches = [
        m
        for m in mappings
        if (m.group is not None and m.group in groups)
        or (m.client is not None and m.client == client and client == subject)
    ]
    if tenant is not None:
        matches = [m for m in matches if m.tenant == tenant]
    tenants = {m.tenant for m in matches}
    if not matches:
        raise OidcError(f"{subject}: no mapping gives it a tenant and role")
    if len(tenants) > 1:
        raise OidcError(f"{subject}: maps to tenants {sorted(tenants)}: name one (X-Denpex-Tenant)")
    return matches[0].tenant, matches[0].role


def rules_by_tenant(mappings: tuple[Mapping_, ...]) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for m in mappings:
        rule = {"group": m.group} if m.group is not None else {"client": m.client or ""}
        found.setdefault(m.tenant, []).append({**rule, "role": m.role})
    return found


@dataclass(frozen=True)
class OidcConfig:
    issuer: str
    audiences: tuple[str, ...]
    mappings: tuple[Mapping_, ...]
    algorithms: tuple[str, ...] = ("RS256", "ES256", "PS256")
    groups_claim: str = "groups"
    leeway_s: int = 30
    jwks_cache_s: float = 300.0
    jwks_refetch_s: float = 10.0  # an unknown kid fetches the JWKS again at most this often
    login_client_id: str | None = None
    login_scopes: tuple[str, ...] = ("openid", "groups")
    login_resource: str | None = None
    # the web UI's "Sign in with <web_name>" (authorization code + PKCE, a confidential client
    # when it has a secret); its session carries the ID token, so web_client_id is an audience
    web_client_id: str | None = None
    web_client_secret: str | None = field(default=None, repr=False)
    web_name: str = "single sign-on"
    web_scopes: tuple[str, ...] = ("openid", "groups")

    def rules_by_tenant(self) -> dict[str, list[dict[str, str]]]:
        """The mapping rules per tenant, as the audit records them."""
        return rules_by_tenant(self.mappings)

    @classmethod
    def load(cls, path: str | Path) -> OidcConfig:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise OidcConfigError(f"{path}: {exc}") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "oidc") -> OidcConfig:
        try:
            algorithms = tuple(str(a) for a in raw.get("algorithms") or cls.algorithms)
            bad = [a for a in algorithms if a not in ASYMMETRIC]
            if bad:
                raise OidcConfigError(
                    f"{where}: algorithms {bad} refused: only asymmetric ones ({', '.join(sorted(ASYMMETRIC))})"
                )
            mappings = parse_mappings(raw.get("mappings") or (), where)
            login = raw.get("login") or {}
            issuer = str(raw["issuer"]).rstrip("/")
            audiences = tuple(str(a) for a in raw["audiences"])
        except (KeyError, TypeError) as exc:
            raise OidcConfigError(f"{where}: missing or malformed {exc}") from None
        if not audiences:
            raise OidcConfigError(f"{where}: audiences: name at least one")
        web = raw.get("web") or {}
        web_client = str(web["client_id"]) if web.get("client_id") else None
        if web_client is not None and web_client not in audiences:
            raise OidcConfigError(
                f"{where}: web.client_id {web_client!r} must be one of the audiences: the UI's "
                "session carries the provider's ID token, whose audience is that client"
            )
        secret = web.get("client_secret")
        if web.get("client_secret_env"):
            secret = os.environ.get(str(web["client_secret_env"]))
            if not secret:
                raise OidcConfigError(
                    f"{where}: web.client_secret_env names {web['client_secret_env']}, "
                    "which is not set"
                )
        return cls(
            issuer=issuer,
            audiences=audiences,
            mappings=mappings,
            algorithms=algorithms,
            groups_claim=str(raw.get("groups_claim", "groups")),
            leeway_s=int(raw.get("leeway_s", 30)),
            jwks_cache_s=float(raw.get("jwks_cache_s", 300.0)),
            jwks_refetch_s=float(raw.get("jwks_refetch_s", 10.0)),
            login_client_id=str(login["client_id"]) if login.get("client_id") else None,
            login_scopes=tuple(str(s) for s in login.get("scopes") or ("openid", "groups")),
            login_resource=str(login["resource"]) if login.get("resource") else None,
            web_client_id=web_client,
            web_client_secret=str(secret) if secret else None,
            web_name=str(web.get("name") or "single sign-on"),
            web_scopes=tuple(str(s) for s in web.get("scopes") or ("openid", "groups")),
        )


def fetch_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            data = json.loads(reply.read())
    except (OSError, ValueError) as exc:
        raise OidcError(f"cannot fetch {url}: {exc}") from None
    if not isinstance(data, dict):
        raise OidcError(f"{url}: not a JSON object")
    return data


@dataclass
class Discovery:
    """The provider's metadata (/.well-known/openid-configuration), fetched once."""

    issuer: str
    fetch: Callable[[str], dict[str, Any]] = fetch_json
    _doc: dict[str, Any] | None = field(default=None, repr=False)

    def document(self) -> dict[str, Any]:
        if self._doc is None:
            doc = self.fetch(self.issuer + "/.well-known/openid-configuration")
            if str(doc.get("issuer", "")).rstrip("/") != self.issuer:
                raise OidcError(
                    f"discovery names issuer {doc.get('issuer')!r}, not {self.issuer!r}"
                )
            self._doc = doc
        return self._doc


class JwksCache:
    """The provider's public signing keys by kid, cached `ttl_s`; a kid it does not know
    fetches the set again (rotation), at most once per `refetch_s`."""

    def __init__(self, discovery: Discovery, ttl_s: float, refetch_s: float) -> None:
        self.discovery = discovery
        self.ttl_s = ttl_s
        self.refetch_s = refetch_s
        self.fetches = 0
        self._keys: dict[str, Any] = {}
        self._fetched = float("-inf")
        self._lock = threading.Lock()

    def key(self, kid: str | None) -> Any:
        now = time.monotonic()
        with self._lock:
            stale = now - self._fetched > self.ttl_s
            unknown = kid not in self._keys and now - self._fetched > self.refetch_s
            if stale or unknown:
                self._refresh(now)
            if kid is None and len(self._keys) == 1:
                return next(iter(self._keys.values()))
            found = self._keys.get(kid or "")
        if found is None:
            raise OidcError(f"no signing key {kid!r} in the provider's JWKS")
        return found

    def _refresh(self, now: float) -> None:
        from joserfc.jwk import ECKey, OKPKey, RSAKey

        uri = self.discovery.document()["jwks_uri"]
        keys: dict[str, Any] = {}
        for entry in self.discovery.fetch(uri).get("keys", []):
            if entry.get("use", "sig") != "sig" or "d" in entry:
                continue  # encryption keys, or a private key published by mistake
            kinds: dict[str, Any] = {"RSA": RSAKey, "EC": ECKey, "OKP": OKPKey}
            kind = kinds.get(entry.get("kty", ""))
            if kind is None:
                continue  # "oct" (symmetric) keys are never accepted for signatures
            keys[str(entry.get("kid", ""))] = kind.import_key(entry)
        self._keys = keys
        self._fetched = now
        self.fetches += 1


def _header(token: str) -> dict[str, Any]:
    parts = token.split(".")
    if len(parts) != 3:
        raise OidcError("not a compact JWS")
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (ValueError, TypeError):
        raise OidcError("unreadable JOSE header") from None
    if not isinstance(header, dict):
        raise OidcError("unreadable JOSE header")
    return header


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified token: who (sub), through which client, in which groups, and its claims."""

    subject: str
    client: str | None
    groups: tuple[str, ...]
    claims: dict[str, Any]


class OidcVerifier:
    def __init__(
        self,
        config: OidcConfig,
        *,
        fetch: Callable[[str], dict[str, Any]] = fetch_json,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.discovery = Discovery(config.issuer, fetch)
        self.jwks = JwksCache(self.discovery, config.jwks_cache_s, config.jwks_refetch_s)
        self.clock = clock

    def verify(self, token: str, *, nonce: str | None = None) -> Identity:
        """The Identity of a valid token, else OidcError (with the reason, for the log)."""
        from joserfc import jwt
        from joserfc.errors import JoseError

        header = _header(token)
        alg = header.get("alg")
        if alg not in self.config.algorithms:  # "none", HS256 … never reach a key
            raise OidcError(f"algorithm {alg!r} not allowed")
        key = self.jwks.key(header.get("kid"))
        family = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}[alg[:2]]
        if key.key_type != family:
            raise OidcError(f"algorithm {alg!r} does not fit a {key.key_type} key")
        try:
            decoded = jwt.decode(token, key, algorithms=[alg])
            now = int(self.clock())
            registry = jwt.JWTClaimsRegistry(
                now=now,
                leeway=self.config.leeway_s,
                iss={"essential": True, "value": self.config.issuer},
                exp={"essential": True},
                sub={"essential": True},
            )
            registry.validate(decoded.claims)
        except JoseError as exc:
            raise OidcError(f"token refused: {type(exc).__name__}: {exc}") from None
        claims = dict(decoded.claims)
        audiences = claims.get("aud")
        audiences = [audiences] if isinstance(audiences, str) else list(audiences or [])
        if not set(audiences) & set(self.config.audiences):
            raise OidcError(f"audience {audiences} is none of {list(self.config.audiences)}")
        if len(audiences) > 1 and claims.get("azp") not in (None, *self.config.audiences):
            raise OidcError("several audiences and an authorised party that is not ours")
        if nonce is not None and claims.get("nonce") != nonce:
            raise OidcError("nonce does not match")
        groups = claims.get(self.config.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return Identity(
            subject=str(claims["sub"]),
            client=str(claims.get("client_id") or claims.get("azp") or "") or None,
            groups=tuple(str(g) for g in groups),
            claims=claims,
        )

    def binding(self, identity: Identity, tenant: str | None = None) -> tuple[str, str]:
        """(tenant, role) for `identity`: the first mapping its groups or client match, in
        `tenant` when the caller names one of the tenants it maps to; OidcError when none."""
        return bind(
            self.config.mappings, identity.subject, identity.groups, identity.client, tenant
        )
