"""Security keys in a real browser: Debian's chromium driven by Playwright, a virtual
authenticator added through the DevTools protocol (WebAuthn.addVirtualAuthenticator), the
page's own static/webauthn.js doing the ceremonies against a real `denpex server` reached
as http://localhost (a secure context with a valid RP id): register a key, then sign in
with it, and no CSP violation on the way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from playwright import sync_api as playwright_sync

from tests.control.conftest import ServerProcess, mint

pytestmark = pytest.mark.slow  # a server and one chromium: past the 30 s line


def test_register_and_sign_in_with_a_virtual_security_key(tmp_path: Path, server_processes):
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("chromium not found on PATH: apt-get install chromium")
    url = f"sqlite:///{tmp_path / 'control.db'}"
    token = mint(url, "acme", "operator")
    server = ServerProcess(url, tmp_path / "server.log",
                           "--kms", f"file://{tmp_path / 'kek.json'}").start()  # fmt: skip
    server_processes.append(server)
    base = f"http://localhost:{server.port}"
    console: list[str] = []
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            context = browser.new_context(base_url=base)
            page = context.new_page()
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            cdp = context.new_cdp_session(page)
            cdp.send("WebAuthn.enable")
            cdp.send(
                "WebAuthn.addVirtualAuthenticator",
                {
                    "options": {
                        "protocol": "ctap2",
                        "transport": "usb",
                        "hasResidentKey": False,
                        "hasUserVerification": True,
                        "isUserVerified": True,
                        "automaticPresenceSimulation": True,
                    }
                },
            )

            def login() -> None:
                page.goto("/login?next=/jobs")
                page.fill("#token", token)
                page.click("button[type=submit]")

            login()
            page.wait_for_url("**/jobs")
            page.goto("/mfa")
            page.click("#webauthn-register")
            page.wait_for_selector("#webauthn-status:has-text('Security key registered')")
            page.goto("/mfa")
            assert "1 registered" in page.inner_text("#webauthn-keys")

            context.clear_cookies()
            login()
            page.wait_for_url("**/login/mfa**")
            page.click("#webauthn-login")
            page.wait_for_url("**/jobs")
            assert page.locator("h1").first.is_visible()
        finally:
            browser.close()
    problems = [m for m in console if "Content Security Policy" in m or "pageerror" in m]
    assert not problems, problems
