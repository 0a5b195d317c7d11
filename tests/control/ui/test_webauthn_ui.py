"""Security keys through the UI's WebAuthn routes, with soft-webauthn's software
authenticator answering as a browser would: registration, a sign-in that owes its second
factor completed by the key, and refusals (no CSRF header, an answer to an old challenge, a
cloned key whose counter lags)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.control import audit_log
from denpex.core import audit
from tests.control.conftest import Api
from tests.enterprise.webauthn_device import Authenticator

ORIGIN = "http://testserver"


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Api]:
    app = Api(f"sqlite:///{tmp_path / 'control.db'}", kms_url=f"file://{tmp_path / 'kek.json'}")
    yield app
    app.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html) or re.search(
        r'data-csrf="([^"]+)"', html
    )
    assert found, html[:400]
    return found.group(1)


def sign_in(ui: Api):
    ui.client.cookies.clear()
    page = ui.client.get("/login")
    return ui.client.post("/login", data={"token": ui.token("acme", "operator"),
                                          "csrf": csrf_of(page.text), "next": "/jobs"},
                          follow_redirects=False)  # fmt: skip


def post(ui: Api, path: str, csrf: str, body: dict | None = None):
    return ui.client.post(path, content=json.dumps(body or {}),
                          headers={"Content-Type": "application/json", "X-Denpex-CSRF": csrf,
                                   "Origin": ORIGIN})  # fmt: skip


def kinds(ui: Api, kind: str) -> list[dict]:
    return [r for r in map(audit.loads_record, audit_log.export_lines(ui.runtime.db))
            if r["kind"] == kind]  # fmt: skip


def key_sign_in(ui: Api, device: Authenticator):
    assert sign_in(ui).headers["location"].startswith("/login/mfa")
    page = ui.client.get("/login/mfa?next=/jobs")
    assert "Use a security key" in page.text and 'src="/static/webauthn.js"' in page.text
    csrf = csrf_of(page.text)
    options = post(ui, "/login/webauthn/options", csrf)
    assert options.status_code == 200, options.text
    return csrf, device.get(options.text, ORIGIN)


def test_register_a_key_and_sign_in_with_it(ui: Api) -> None:
    assert sign_in(ui).headers["location"] == "/jobs"
    page = ui.client.get("/mfa")
    csrf = csrf_of(page.text)
    assert "0 registered" in page.text
    assert post(ui, "/mfa/webauthn/register", csrf, {}).status_code == 409  # no options yet
    refused = ui.client.post("/mfa/webauthn/options", content="{}")  # no CSRF header
    assert refused.status_code == 403
    options = post(ui, "/mfa/webauthn/options", csrf)
    assert options.status_code == 200 and json.loads(options.text)["rp"]["id"] == "testserver"
    device = Authenticator()
    done = post(ui, "/mfa/webauthn/register", csrf, device.create(options.text, ORIGIN))
    assert done.status_code == 200 and done.json() == {"registered": True}
    [enrolled] = kinds(ui, "mfa.enrolled")
    assert enrolled["result"]["factor"] == "webauthn"
    assert "1 registered" in ui.client.get("/mfa").text

    clone = copy.deepcopy(device)  # a copy of the key, made before it is used
    csrf, answer = key_sign_in(ui, device)
    assert ui.client.get("/jobs", follow_redirects=False).status_code == 303  # still owed
    good = post(ui, "/login/webauthn", csrf, {**answer, "next": "/jobs"})
    assert good.status_code == 200 and good.json() == {"next": "/jobs"}
    assert ui.client.get("/jobs").status_code == 200
    assert kinds(ui, "login.succeeded")[-1]["result"]["mfa"] == "webauthn"

    csrf, _fresh = key_sign_in(ui, device)  # a new challenge: the old answer is refused
    assert post(ui, "/login/webauthn", csrf, answer).status_code == 401
    csrf, cloned = key_sign_in(ui, clone)  # its counter says 1, which the server has seen
    assert post(ui, "/login/webauthn", csrf, cloned).status_code == 401
    assert [r["result"]["method"] for r in kinds(ui, "login.failed")] == ["webauthn", "webauthn"]
    csrf, again = key_sign_in(ui, device)
    assert post(ui, "/login/webauthn", csrf, again).status_code == 200
