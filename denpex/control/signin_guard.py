"""The server's guard on refused sign-ins (API bearer tokens, the web UI's token login, OIDC
callbacks, SAML responses, second-factor codes): before a sign-in it asks whether the source
or the account is over its limit (denpex.enterprise.signin_limits) and answers 429 with a
Retry-After if so; after a refusal it counts one and, when that brings a source or account to
its limit, writes one `login.throttled` record to the audit — once per window, not per attempt.

It must never count a request that presented no credential, never keep or audit a credential
(accounts are token ids and subjects), and never let a throttled request reach the check of
its credential.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

from denpex.control.identity_audit import IdentityAudit
from denpex.enterprise.signin_limits import Key, RefusedSignIns, SignInLimits
from denpex.enterprise.tokens import parse_token


class SignInThrottled(Exception):
    """Too many refused sign-ins from this source or for this account: try after `wait_s`."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(
            f"too many refused sign-ins from this address or for this account: "
            f"try again in {self.retry_after(wait_s)} s"
        )
        self.wait_s = wait_s

    @staticmethod
    def retry_after(wait_s: float) -> int:
        return max(1, math.ceil(wait_s))

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after(self.wait_s))}


def source_of(client_host: str | None) -> str:
    """The source a refusal counts against: the client's address as the server sees it
    (behind a reverse proxy, FORWARDED_ALLOW_IPS names the proxy, so uvicorn gives the
    client's own address from X-Forwarded-For)."""
    return client_host or "unknown"


def account_of(credential: str) -> str | None:
    """The account a presented credential names: a denpex token's id; None otherwise."""
    parsed = parse_token(credential) if credential else None
    return f"token:{parsed[0]}" if parsed is not None else None


def bearer_of(headers: Mapping[str, str]) -> str:
    value = headers.get("authorization") or ""
    scheme, _, credential = value.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


class SignInGuard:
    def __init__(
        self,
        limits: SignInLimits,
        identity: IdentityAudit,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counter = RefusedSignIns(limits, clock=clock)
        self.identity = identity
        self.throttled = 0  # requests answered 429 (for /metrics)

    @staticmethod
    def _keys(source: str, account: str | None) -> list[Key]:
        keys: list[Key] = [("source", source)]
        if account:
            keys.append(("account", account))
        return keys

    def check(self, source: str, account: str | None = None) -> None:
        """Raises SignInThrottled when the source or the account must wait."""
        wait = self.counter.wait_s(self._keys(source, account))
        if wait is not None:
            self.throttled += 1
            raise SignInThrottled(wait)

    def refused(
        self, method: str, source: str, account: str | None = None, tenant: str | None = None
    ) -> None:
        """Count a refused sign-in; audit each source or account it brought to its limit."""
        for crossed in self.counter.refuse(self._keys(source, account)):
            self.identity.login_throttled(
                method,
                time.time_ns(),
                scope=crossed.scope,
                subject=crossed.value,
                refusals=crossed.refusals,
                window_s=crossed.window_s,
                tenant=tenant,
            )
