"""A real OpenID provider for the OIDC tests: node-oidc-provider (tests/enterprise/oidc/,
installed with `npm ci --prefix tests/enterprise/oidc`, which scripts/test-all.sh runs),
started on a free loopback port with signing keys the test made, and stopped after it.
`restart(keys)` brings it back on the same port with other keys (rotation)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.control.pg import free_port

HERE = Path(__file__).parent / "oidc"


def signing_key(kid: str):
    from joserfc.jwk import RSAKey

    return RSAKey.generate_key(
        2048, parameters={"kid": kid, "use": "sig", "alg": "RS256"}, private=True
    )


class Provider:
    def __init__(self, folder: Path, web_redirect: str | None = None) -> None:
        self.folder = folder
        self.web_redirect = web_redirect  # the web UI client's callback (client denpex-web)
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.keys = [signing_key("k1")]

    def start(self, keys=None) -> Provider:
        if keys is not None:
            self.keys = keys
        jwks = self.folder / "jwks.json"
        jwks.write_text(json.dumps({"keys": [k.as_dict(private=True) for k in self.keys]}))
        with open(self.folder / "provider.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *("node", str(HERE / "provider.mjs"), str(self.port), str(jwks)),
                    *([self.web_redirect] if self.web_redirect else []),
                ],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError((self.folder / "provider.log").read_text()[-2000:])
            try:
                urllib.request.urlopen(self.issuer + "/.well-known/openid-configuration", timeout=1)
                return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError("the OpenID provider did not answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self, keys) -> None:
        self.stop()
        self.start(keys)

    def client_credentials(self, secret: str = "agent-secret-for-tests") -> str:
        reply = httpx.post(
            self.issuer + "/token",
            auth=("denpex-agent", secret),
            data={"grant_type": "client_credentials", "resource": "urn:denpex:api"},
        )
        reply.raise_for_status()
        return reply.json()["access_token"]


def sign_in(auth_url: str, user: str, redirect_prefix: str) -> str:
    """Drive the provider's dev login and consent pages as `user`; returns the redirect URL
    (with code and state) the provider sends the browser to."""
    with httpx.Client(follow_redirects=False, timeout=30) as browser:
        url = auth_url
        for _ in range(20):
            if url.startswith(redirect_prefix):
                return url
            reply = browser.get(url)
            if reply.status_code in (302, 303):
                url = urllib.parse.urljoin(url, reply.headers["location"])
                continue
            assert reply.status_code == 200, (url, reply.status_code, reply.text[:500])
            form = {"prompt": "login", "login": user, "password": "x"}
            if 'name="prompt" value="consent"' in reply.text:
                form = {"prompt": "consent"}
            posted = browser.post(url, data=form)
            assert posted.status_code in (302, 303), posted.text[:500]
            url = urllib.parse.urljoin(url, posted.headers["location"])
    raise AssertionError("the login never redirected back")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    if shutil.which("node") is None:
        pytest.fail("node is not installed: apt-get install nodejs (scripts/system-packages.txt)")
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        pytest.fail(
            "oidc-provider is not installed: npm ci --prefix tests/enterprise/oidc "
            "(scripts/test-all.sh does it)"
        )
    started = Provider(tmp_path).start()
    try:
        yield started
    finally:
        started.stop()
