"""The UI's session: a sealed cookie (Fernet: AES + HMAC, keyed by a secret every replica
reads from the store) carrying the visitor's bearer token and CSRF token, and PageDecides,
the pages' form of the API's one auth dependency (control/access.Decides).

Every request re-authenticates the token through denpex.enterprise (a revoked token ends its
sessions) and asks the policy set, exactly as an API request with that token would, so the
session adds no second way in. It must never put the key or a token in a page, and never
accept a state-changing form whose CSRF token is not the session's.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken
from fastapi import Request

from denpex.control.access import AccessRuntime, Decides
from denpex.control.signin_guard import SignInThrottled, source_of
from denpex.control.store import Store
from denpex.core import jsonio
from denpex.enterprise import AuthError, Principal, authenticate

COOKIE = "denpex_session"
MAX_AGE_S = 12 * 3600  # a session outlives no working day; the token itself may live longer
SECRET_NAME = "ui_session_key"


class LoginRequired(Exception):
    """No session, an expired one, or a token the directory no longer accepts."""


class MfaPending(Exception):
    """A session whose second factor is still to be given (`/login/mfa`) or enrolled (`/mfa`)."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class CsrfRefused(Exception):
    """A state-changing request without the session's CSRF token."""


class UiError(Exception):
    """An error page: its status and the sentence it shows."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass(frozen=True, slots=True)
class Session:
    csrf: str
    token: str | None = None  # None: a visitor who has not logged in yet
    mfa: str | None = None  # "verify" or "enrol": the token is good, its second factor owed
    challenge: str | None = None  # the WebAuthn challenge this session was given (base64url)


class SessionCodec:
    """Seals and opens session cookies with the store's shared key (fetched once, lazily:
    the API alone never needs it)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._fernet: Fernet | None = None
        self._lock = threading.Lock()

    def _key(self) -> Fernet:
        with self._lock:
            if self._fernet is None:
                key = self._store.server_secret(
                    SECRET_NAME, lambda: Fernet.generate_key().decode(), time.time_ns()
                )
                self._fernet = Fernet(key.encode())
            return self._fernet

    def seal(self, session: Session) -> str:
        body = jsonio.dumps(
            {"c": session.csrf, "t": session.token, "m": session.mfa, "w": session.challenge}
        )
        return self._key().encrypt(body).decode()

    def seal_data(self, data: dict[str, Any]) -> str:
        """Seal any small JSON object with the same key (the SSO login's pending state)."""
        return self._key().encrypt(jsonio.dumps(data)).decode()

    def open_data(self, cookie: str | None, ttl_s: int) -> dict[str, Any] | None:
        if not cookie:
            return None
        try:
            raw: Any = jsonio.loads(self._key().decrypt(cookie.encode(), ttl=ttl_s))
        except (InvalidToken, ValueError):
            return None
        return raw if isinstance(raw, dict) else None

    def open(self, cookie: str | None) -> Session | None:
        """The session in `cookie`, or None when it is absent, forged or older than MAX_AGE_S."""
        if not cookie:
            return None
        try:
            raw: Any = jsonio.loads(self._key().decrypt(cookie.encode(), ttl=MAX_AGE_S))
        except (InvalidToken, ValueError):
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("c"), str):
            return None
        token, owed, challenge = raw.get("t"), raw.get("m"), raw.get("w")
        return Session(
            raw["c"],
            token if isinstance(token, str) else None,
            owed if owed in ("verify", "enrol") else None,
            challenge if isinstance(challenge, str) else None,
        )


def new_session(token: str | None = None, mfa: str | None = None) -> Session:
    return Session(secrets.token_urlsafe(32), token, mfa)


class PageDecides(Decides):
    """Decides for a page: the token comes from the session cookie rather than a header (no
    session, or a token no longer accepted: LoginRequired), and a refusal is an error page.
    The session is left on `request.state.session` for the page."""

    def __init__(
        self,
        rt: AccessRuntime,
        codec: SessionCodec,
        action: str,
        *,
        public: bool = False,
        also: tuple[str, ...] = (),
        enrolling: bool = False,
    ) -> None:
        super().__init__(rt, action, public=public, also=also)
        self.codec = codec
        self.enrolling = enrolling  # a page a session owing its enrolment may see

    def __call__(self, request: Request) -> Principal | None:
        session = self.codec.open(request.cookies.get(COOKIE))
        request.state.session = session
        try:
            if self.public:
                self.decide_public()
                return None
            if session is None or session.token is None:
                raise LoginRequired()
            if session.mfa == "verify":
                raise MfaPending("/login/mfa")
            if session.mfa == "enrol" and not self.enrolling:
                raise MfaPending("/mfa")
            try:
                found = authenticate(
                    {"authorization": f"Bearer {session.token}"}, self.rt.tokens, self.rt.oidc
                )
            except AuthError:
                raise LoginRequired() from None
            return self.decide(request, found)
        except AuthError as exc:
            raise UiError(exc.status, exc.message) from None


def check_csrf(session: Session | None, submitted: str | None) -> None:
    """Raise CsrfRefused unless `submitted` is the session's CSRF token."""
    if session is None or not submitted:
        raise CsrfRefused()
    if not hmac.compare_digest(session.csrf.encode(), submitted.encode()):
        raise CsrfRefused()


def safe_next(target: str) -> str:
    """Only a path on this server (never `//host` or a scheme): no open redirect."""
    parts = urlsplit(target or "/")
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


def client_source(request: Request) -> str:
    """The address a refused sign-in counts against (denpex.control.signin_guard)."""
    return source_of(request.client.host if request.client else None)


def throttle_check(rt: Any, source: str, account: str | None = None) -> None:
    """UiError 429 (with Retry-After) when the source or account has had too many refused
    sign-ins: the credential is not even looked at."""
    try:
        rt.signins.check(source, account)
    except SignInThrottled as exc:
        raise UiError(429, str(exc), exc.headers) from None
