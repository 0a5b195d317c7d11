"""`denpex login`: the OAuth 2.0 authorization code flow with PKCE (RFC 7636) for a person at
a terminal, as a native app does it (RFC 8252): a one-shot listener on a loopback port gets
the redirect, the code is exchanged for tokens, the ID token is verified (nonce included) and
the tokens are stored in the user's config dir, readable by the user alone (0600).

It must never store or print a token the verifier refused, never accept a redirect whose
state is not the one it sent, and never write the token file with wider permissions.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from denpex.enterprise.oidc import OidcConfig, OidcError, OidcVerifier


def credentials_path() -> Path:
    """DENPEX_CREDENTIALS, else $XDG_CONFIG_HOME/denpex/credentials.json."""
    env = os.environ.get("DENPEX_CREDENTIALS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "denpex" / "credentials.json"


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, S256 code_challenge)."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).decode().rstrip("=")


class _Callback(http.server.BaseHTTPRequestHandler):
    result: dict[str, str] | None = None

    def do_GET(self) -> None:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        type(self).result = query
        ok = "code" in query
        self.send_response(200 if ok else 400)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        message = "denpex: logged in; you can close this tab." if ok else "denpex: login failed."
        self.wfile.write(message.encode())

    def log_message(self, *_args: Any) -> None:  # no access log on the terminal
        pass


def login(
    config: OidcConfig,
    *,
    announce: Callable[[str], None],
    open_browser: bool = False,
    timeout_s: float = 300.0,
    store: Path | None = None,
) -> dict[str, Any]:
    """Run the flow; returns what was stored (tokens, expiry, subject). OidcError on failure."""
    if not config.login_client_id:
        raise OidcError("the OIDC configuration names no login.client_id")
    verifier = OidcVerifier(config)
    doc = verifier.discovery.document()
    code_verifier, challenge = pkce_pair()
    state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    server = http.server.HTTPServer(("127.0.0.1", 0), _Callback)
    _Callback.result = None
    redirect_uri = f"http://127.0.0.1:{server.server_address[1]}/callback"
    params = {
        "response_type": "code",
        "client_id": config.login_client_id,
        "redirect_uri": redirect_uri,
        "scope": " ".join(config.login_scopes),
        "state": state,
        "nonce": nonce,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    if config.login_resource:
        params["resource"] = config.login_resource
    url = doc["authorization_endpoint"] + "?" + urllib.parse.urlencode(params)
    announce(url)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    deadline = time.monotonic() + timeout_s
    try:
        while _Callback.result is None:
            if time.monotonic() > deadline:
                raise OidcError(f"no redirect came back within {timeout_s:.0f} s")
            server.timeout = max(0.1, min(1.0, deadline - time.monotonic()))
            server.handle_request()
    finally:
        server.server_close()
    result = _Callback.result
    if result.get("state") != state:
        raise OidcError("the redirect carried another state: refused (a forged login?)")
    if "code" not in result:
        raise OidcError(f"the provider refused: {result.get('error', 'no code')}")
    form = {
        "grant_type": "authorization_code",
        "code": result["code"],
        "redirect_uri": redirect_uri,
        "client_id": config.login_client_id,
        "code_verifier": code_verifier,
    }
    if config.login_resource:
        form["resource"] = config.login_resource
    tokens = _post_form(doc["token_endpoint"], form)
    identity = verifier.verify(str(tokens.get("id_token", "")), nonce=nonce)
    saved = {
        "issuer": config.issuer,
        "subject": identity.subject,
        "id_token": tokens["id_token"],
        "access_token": tokens.get("access_token"),
        "refresh_token": tokens.get("refresh_token"),
        "expires_at": int(time.time()) + int(tokens.get("expires_in", 0)),
    }
    write_private(store or credentials_path(), json.dumps(saved, indent=2).encode())
    return saved


def _post_form(url: str, form: dict[str, str]) -> dict[str, Any]:
    return token_request(url, form)


def token_request(
    url: str, form: dict[str, str], basic_auth: tuple[str, str] | None = None
) -> dict[str, Any]:
    """POST a form to the provider's token endpoint (HTTP Basic client authentication when
    `basic_auth` is given, RFC 6749 §2.3.1); its JSON answer, else OidcError."""
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/x-www-form-urlencoded")
    if basic_auth is not None:
        quoted = ":".join(urllib.parse.quote(part, safe="") for part in basic_auth)
        request.add_header("Authorization", "Basic " + base64.b64encode(quoted.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return dict(json.loads(reply.read()))
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise OidcError(f"the token endpoint answered {exc.code}: {detail}") from None
    except (OSError, ValueError) as exc:
        raise OidcError(f"cannot reach the token endpoint: {exc}") from None


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` as mode 0600 (the folder 0700), replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
