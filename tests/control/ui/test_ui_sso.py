"""Single sign-on for the web UI against a real OpenID provider (node-oidc-provider on
loopback, tests/enterprise/conftest.py) and the app in-process: the login page's button, the
authorization code flow with PKCE as the provider runs it, the groups mapped to a tenant and
role, the same sealed session a token login opens; a callback with another state, a replayed
one and an identity no mapping places are refused; logout ends the session."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from denpex.enterprise import OidcConfig, OidcConfigError
from tests.control.conftest import Api
from tests.control.ui.test_ui_pages import csrf_of
from tests.enterprise.conftest import HERE, Provider, sign_in

CALLBACK = "http://testserver/login/oidc/callback"  # the TestClient's own origin


def web_config(provider: Provider, **web: str) -> OidcConfig:
    return OidcConfig.from_dict(
        {
            "issuer": provider.issuer,
            "audiences": ["urn:denpex:api", "denpex-web"],
            "mappings": [
                {"group": "gpu-sre", "tenant": "acme", "role": "operator"},
                {"group": "ml-research", "tenant": "research", "role": "viewer"},
            ],
            "web": {
                "client_id": "denpex-web",
                "client_secret": "web-secret-for-tests",
                "name": "Test IdP",
                **web,
            },
        }
    )


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("oidc-provider is not installed: npm ci --prefix tests/enterprise/oidc")
    started = Provider(tmp_path, web_redirect=CALLBACK).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def ui(tmp_path: Path, provider: Provider) -> Iterator[Api]:
    app = Api(f"sqlite:///{tmp_path / 'control.db'}", oidc=web_config(provider))
    yield app
    app.close()


def start(ui: Api, next_path: str = "/jobs") -> str:
    """Press "Sign in with …": the provider's authorization URL the browser is sent to."""
    reply = ui.client.get(
        f"/login/oidc?next={urllib.parse.quote(next_path)}", follow_redirects=False
    )
    assert reply.status_code == 303
    return reply.headers["location"]


def back(ui: Api, redirect: str) -> httpx.Response:
    """The provider's redirect arriving at the callback."""
    parts = urllib.parse.urlsplit(redirect)
    return ui.client.get(f"{parts.path}?{parts.query}", follow_redirects=False)


def test_the_login_page_offers_the_provider(ui: Api) -> None:
    page = ui.client.get("/login?next=/jobs").text
    assert re.search(r'<a [^>]*id="sso" href="/login/oidc\?next=/jobs">Sign in with Test IdP', page)


def test_sign_in_with_the_provider_opens_a_session(ui: Api, provider: Provider) -> None:
    auth = start(ui)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(auth).query))
    assert auth.startswith(provider.issuer + "/auth?")
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["state"] and query["nonce"] and query["redirect_uri"] == CALLBACK
    landed = back(ui, sign_in(auth, "alice", CALLBACK))
    assert landed.status_code == 200
    assert 'http-equiv="refresh" content="0;url=/jobs"' in landed.text
    assert "Signed in as <strong>alice</strong>" in landed.text
    assert "denpex_sso" not in ui.client.cookies  # one use
    jobs = ui.client.get("/jobs")
    assert jobs.status_code == 200
    assert re.search(r'class="tenant"[^>]*>acme<', jobs.text)
    assert re.search(r'class="role">operator<', jobs.text)
    cookie = ui.client.cookies["denpex_session"]
    assert "eyJ" not in cookie  # the ID token is sealed in it, not readable
    csrf = csrf_of(jobs.text)
    out = ui.client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    assert ui.client.get("/jobs", follow_redirects=False).status_code == 303  # logged out


def test_a_callback_with_another_state_or_replayed_is_refused(ui: Api) -> None:
    redirect = sign_in(start(ui), "alice", CALLBACK)
    forged = re.sub(r"state=[^&]+", "state=forged", redirect)
    refused = back(ui, forged)
    assert refused.status_code == 400 and "did not match" in refused.text
    assert ui.client.get("/", follow_redirects=False).status_code == 303
    fresh = sign_in(start(ui), "alice", CALLBACK)
    assert back(ui, fresh).status_code == 200
    ui.client.cookies.delete("denpex_session")
    replayed = back(ui, fresh)  # the pending login was used up
    assert replayed.status_code == 400 and "expired or was not started here" in replayed.text
    third = sign_in(start(ui), "alice", CALLBACK)
    assert "iss=" in third  # the provider names itself (RFC 9207)
    other = re.sub(r"iss=[^&]+", "iss=" + urllib.parse.quote("http://evil.example", ""), third)
    wrong = back(ui, other)
    assert wrong.status_code == 400 and "another provider" in wrong.text


def test_an_identity_no_mapping_places_gets_no_session(ui: Api) -> None:
    refused = back(ui, sign_in(start(ui), "carol", CALLBACK))  # carol is in no group
    assert refused.status_code == 403 and "does not accept that identity" in refused.text
    assert ui.client.get("/", follow_redirects=False).status_code == 303


def test_without_a_web_client_there_is_no_button(tmp_path: Path, provider: Provider) -> None:
    raw = web_config(provider)
    plain = OidcConfig.from_dict({"issuer": raw.issuer, "audiences": ["urn:denpex:api"]})
    app = Api(f"sqlite:///{tmp_path / 'plain.db'}", oidc=plain)
    try:
        assert 'id="sso"' not in app.client.get("/login").text
        assert app.client.get("/login/oidc").status_code == 404
    finally:
        app.close()
    with pytest.raises(OidcConfigError, match="must be one of the audiences"):
        OidcConfig.from_dict(
            {"issuer": raw.issuer, "audiences": ["x"], "web": {"client_id": "denpex-web"}}
        )


def test_a_flood_of_forged_callbacks_is_throttled(tmp_path: Path, provider: Provider) -> None:
    from denpex.control import audit_log
    from denpex.core import audit
    from denpex.enterprise.signin_limits import Limit, SignInLimits

    limits = SignInLimits(per_source=Limit(5, 60), per_account=Limit(3, 300))
    app = Api(f"sqlite:///{tmp_path / 'flood.db'}", oidc=web_config(provider), signin_limits=limits)
    try:
        statuses = [
            app.client.get(
                f"/login/oidc/callback?state=forged-{n}&code=x", follow_redirects=False
            ).status_code
            for n in range(12)
        ]
        assert statuses[:5] == [400] * 5 and set(statuses[5:]) == {429}
        # a genuine answer from the provider waits out the window too: nothing is checked
        held = back(app, sign_in(start(app), "alice", CALLBACK))
        assert held.status_code == 429 and "Retry-After" in held.headers
        records = [audit.loads_record(line) for line in audit_log.export_lines(app.runtime.db)]
        throttled = [r for r in records if r["kind"] == "login.throttled"]
        assert len(throttled) == 1 and throttled[0]["result"]["method"] == "oidc"
        assert not [r for r in records if r["kind"] == "login.succeeded"]
    finally:
        app.close()
