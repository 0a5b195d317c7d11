"""TOTP second factors for token sign-ins to the web UI: enrolment (key shown once, confirmed
by a first code, recovery codes shown once), a sign-in that owes its code until given, a
code good once, recovery codes spent once, a tenant that requires a second factor sending a
person without one to enrolment first; each act in the audit chain, nothing in clear in the
store."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pyotp
import pytest

from denpex.control import audit_log
from denpex.core import audit
from tests.control.conftest import Api


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Api]:
    app = Api(f"sqlite:///{tmp_path / 'control.db'}", kms_url=f"file://{tmp_path / 'kek.json'}")
    yield app
    app.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def sign_in(ui: Api, role: str = "operator"):
    ui.client.cookies.clear()
    page = ui.client.get("/login")
    return ui.client.post(
        "/login",
        data={"token": ui.token("acme", role), "csrf": csrf_of(page.text), "next": "/jobs"},
        follow_redirects=False,
    )


def kinds(ui: Api, kind: str) -> list[dict]:
    return [r for r in map(audit.loads_record, audit_log.export_lines(ui.runtime.db))
            if r["kind"] == kind]  # fmt: skip


def enrol(ui: Api) -> tuple[str, list[str]]:
    page = ui.client.get("/mfa")
    assert page.status_code == 200 and "Set up an authenticator app" in page.text
    shown = ui.client.post("/mfa/enrol", data={"csrf": csrf_of(page.text)})
    assert shown.status_code == 200
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', shown.text).group(1)
    assert "otpauth://totp/" in shown.text
    wrong = ui.client.post("/mfa/confirm", data={"csrf": csrf_of(shown.text), "code": "000000"})
    assert wrong.status_code == 400
    shown = ui.client.post("/mfa/enrol", data={"csrf": csrf_of(shown.text)})  # a fresh key
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', shown.text).group(1)
    code = pyotp.TOTP(secret).now()
    done = ui.client.post("/mfa/confirm", data={"csrf": csrf_of(shown.text), "code": code})
    assert done.status_code == 200, done.text[:300]
    codes = re.findall(r"<li><code>([a-z2-9]{5}-[a-z2-9]{5})</code></li>", done.text)
    assert len(codes) == 10
    return secret, codes


def test_enrol_then_every_sign_in_owes_its_code(ui: Api) -> None:
    assert sign_in(ui).headers["location"] == "/jobs"  # no factor yet: signed in at once
    secret, codes = enrol(ui)
    assert len(kinds(ui, "mfa.enrolled")) == 1
    assert "Your second factor is on." in ui.client.get("/mfa").text

    owed = sign_in(ui)
    assert owed.status_code == 303 and owed.headers["location"].startswith("/login/mfa")
    assert (
        ui.client.get("/jobs", follow_redirects=False).headers["location"].startswith("/login/mfa")
    )  # no page before the code
    form = ui.client.get("/login/mfa?next=/jobs")
    bad = ui.client.post("/login/mfa", data={"csrf": csrf_of(form.text), "code": "123456",
                                             "next": "/jobs"})  # fmt: skip
    assert bad.status_code == 401 and kinds(ui, "login.failed")[-1]["result"]["method"] == "totp"
    code = pyotp.TOTP(secret).at(time.time() + 30)  # the next step: the enrolment spent this one
    good = ui.client.post("/login/mfa", data={"csrf": csrf_of(form.text), "code": code,
                                              "next": "/jobs"}, follow_redirects=False)  # fmt: skip
    assert good.status_code == 303 and good.headers["location"] == "/jobs"
    assert ui.client.get("/jobs").status_code == 200
    assert kinds(ui, "login.succeeded")[-1]["result"]["mfa"] == "totp"

    sign_in(ui)  # the same code again, in a new sign-in: spent
    form = ui.client.get("/login/mfa")
    again = ui.client.post("/login/mfa", data={"csrf": csrf_of(form.text), "code": code})
    assert again.status_code == 401
    used = ui.client.post("/login/mfa", data={"csrf": csrf_of(form.text), "code": codes[3]},
                          follow_redirects=False)  # fmt: skip
    assert used.status_code == 303
    assert kinds(ui, "mfa.recovery_used")[-1]["result"] == {"left": 9}
    sign_in(ui)
    form = ui.client.get("/login/mfa")
    spent = ui.client.post("/login/mfa", data={"csrf": csrf_of(form.text), "code": codes[3]})
    assert spent.status_code == 401

    with ui.runtime.db.tenant_tx("acme") as conn:
        stored = " ".join(
            str(v)
            for table in ("mfa_totp", "mfa_recovery")
            for row in conn.exec_driver_sql(f"SELECT * FROM {table}").all()
            for v in row
        )
    assert secret not in stored and not any(c in stored or c.replace("-", "") in stored
                                            for c in codes)  # fmt: skip
    lines = list(audit_log.export_lines(ui.runtime.db))
    assert not any(secret.encode() in line or codes[0].encode() in line for line in lines)
    head = audit.head_of(audit.loads_record(lines[-1]))
    assert audit.verify_lines([*lines, audit.anchor_line(head, None)]).ok


def test_a_tenant_that_requires_a_factor_sends_people_to_enrol_first(ui: Api) -> None:
    admin = {"Authorization": f"Bearer {ui.token('acme', 'admin')}"}
    assert ui.client.get("/api/v1/tenant/mfa", headers=admin).json() == {"required": False}
    viewer = {"Authorization": f"Bearer {ui.token('acme', 'viewer')}"}
    assert ui.client.put("/api/v1/tenant/mfa", headers=viewer,
                         json={"required": True}).status_code == 403  # fmt: skip
    assert ui.client.put("/api/v1/tenant/mfa", headers=admin,
                         json={"required": True}).status_code == 200  # fmt: skip
    [changed] = kinds(ui, "mfa.required_changed")
    assert changed["tenant"] == "acme" and changed["result"] == {"required": True}

    owed = sign_in(ui, "viewer")
    assert owed.headers["location"].startswith("/mfa")
    assert ui.client.get("/jobs", follow_redirects=False).headers["location"].startswith("/mfa")
    assert "asks every token sign-in for a second factor" in ui.client.get("/mfa").text
    before = len(kinds(ui, "login.succeeded"))
    enrol(ui)
    assert len(kinds(ui, "login.succeeded")) == before + 1
    assert ui.client.get("/jobs").status_code == 200
    # the API is not a sign-in: bearer tokens owe no second factor
    assert ui.client.get("/api/v1/incidents", headers=viewer).status_code == 200


def test_a_code_guesser_is_throttled_per_account(tmp_path: Path) -> None:
    from denpex.enterprise.signin_limits import Limit, SignInLimits

    limits = SignInLimits(per_source=Limit(50, 60), per_account=Limit(3, 300))
    ui = Api(f"sqlite:///{tmp_path / 'guess.db'}", signin_limits=limits)
    try:
        sign_in(ui)
        secret, _ = enrol(ui)
        sign_in(ui)
        form = ui.client.get("/login/mfa?next=/jobs")
        csrf = csrf_of(form.text)
        guesses = [
            ui.client.post("/login/mfa", data={"csrf": csrf, "code": f"{n:06d}"}).status_code
            for n in range(8)
        ]
        assert guesses[:3] == [401] * 3 and set(guesses[3:]) == {429}
        # the right code waits too: the account is held for the window
        code = pyotp.TOTP(secret).at(time.time() + 30)
        held = ui.client.post("/login/mfa", data={"csrf": csrf, "code": code})
        assert held.status_code == 429 and "Retry-After" in held.headers
        [throttled] = kinds(ui, "login.throttled")
        assert throttled["result"]["scope"] == "account" and throttled["result"]["method"] == "totp"
        assert len(kinds(ui, "login.failed")) == 3
    finally:
        ui.close()
