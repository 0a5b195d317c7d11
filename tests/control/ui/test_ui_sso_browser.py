"""Single sign-on in a real browser: chromium (Playwright) presses "Sign in with Test IdP" on
a real `denpex server --oidc FILE`, signs in at a real OpenID provider (node-oidc-provider's
login and consent pages), comes back to the fleet as the tenant and role its groups map to,
and logs out; an identity no mapping places is told so and gets no session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.control.conftest import ServerProcess
from tests.control.pg import free_port
from tests.control.ui.test_ui_browser import Visit, browser  # noqa: F401  (a fixture)
from tests.enterprise.conftest import HERE, Provider

pytestmark = pytest.mark.slow  # a provider, a server and chromium: ≈ 30 s


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not (HERE / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("oidc-provider is not installed: npm ci --prefix tests/enterprise/oidc")
    root = tmp_path_factory.mktemp("sso")
    port = free_port()
    provider = Provider(root, web_redirect=f"http://127.0.0.1:{port}/login/oidc/callback")
    provider.start()
    config = root / "oidc.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "issuer": provider.issuer,
                "audiences": ["urn:denpex:api", "denpex-web"],
                "mappings": [{"group": "gpu-sre", "tenant": "acme", "role": "operator"}],
                "web": {
                    "client_id": "denpex-web",
                    "client_secret_env": "DENPEX_TEST_WEB_SECRET",
                    "name": "Test IdP",
                },
            }
        )
    )
    url = f"sqlite:///{root / 'control.db'}"
    server = ServerProcess(url, root / "server.log", "--oidc", str(config), port=port)
    os.environ["DENPEX_TEST_WEB_SECRET"] = "web-secret-for-tests"  # the child inherits it
    try:
        server.start()
    finally:
        del os.environ["DENPEX_TEST_WEB_SECRET"]
    try:
        yield server.base
    finally:
        server.stop()
        provider.stop()


def sign_in_at_provider(page: Any, user: str) -> None:
    page.click("#sso")
    page.wait_for_selector("input[name=login]")  # the provider's own login page
    page.fill("input[name=login]", user)
    page.fill("input[name=password]", "any")
    page.click("button[type=submit]")
    page.wait_for_load_state()
    if page.locator("input[name=prompt][value=consent], button:has-text('Continue')").count():
        page.click("button[type=submit]")


def test_sign_in_with_the_provider_and_log_out(browser: Any, site: str) -> None:  # noqa: F811
    visit = Visit(browser, site, viewport={"width": 1280, "height": 800})
    try:
        page = visit.page
        page.goto("/jobs")  # no session: the login page, with the provider's button
        assert "/login?next=" in page.url
        assert page.locator("#sso").inner_text() == "Sign in with Test IdP"
        sign_in_at_provider(page, "alice")
        page.wait_for_url(site + "/jobs")
        assert page.locator(".tenant").inner_text() == "acme"
        assert page.locator(".role").inner_text() == "operator"
        assert page.locator("h1").inner_text() == "Jobs"
        page.click("text=Log out")
        page.wait_for_url("**/login")
        page.goto("/")
        assert "/login?next=" in page.url  # the session is gone
        cookies = {c["name"]: c for c in visit.context.cookies()}
        assert "denpex_sso" not in cookies
        assert visit.csp_violations() == []
    finally:
        visit.close()


def test_an_unmapped_identity_is_told_and_gets_no_session(browser: Any, site: str) -> None:  # noqa: F811
    visit = Visit(browser, site, viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        page = visit.page
        page.goto("/login")
        sign_in_at_provider(page, "carol")  # in no group
        page.wait_for_url("**/login/oidc/callback**")
        assert "does not accept that identity" in page.locator("[role=alert]").inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.goto("/")
        assert "/login?next=" in page.url
    finally:
        visit.close()
