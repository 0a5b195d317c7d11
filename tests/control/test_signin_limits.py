"""Refused sign-ins are rate-limited per source and per account: a flood of bad bearer
tokens to the API, of bad tokens to the web UI's login form and of forged SAML responses is
answered 429 with a Retry-After once the source's (or the account's) limit is reached — the
credential is not even checked then, a good one included — and the audit gets one
`login.throttled` record per window, not one per attempt. The counter itself is checked on a
clock the test moves."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from denpex.control import audit_log
from denpex.control.api import create_app
from denpex.core import audit
from denpex.enterprise.signin_limits import Limit, RefusedSignIns, SignInLimits
from tests.control.conftest import Api

LIMITS = SignInLimits(per_source=Limit(5, 60), per_account=Limit(3, 300), max_tracked=1000)


def records(api: Api, kind: str) -> list[dict]:
    lines = audit_log.export_lines(api.runtime.db)
    return [r for r in map(audit.loads_record, lines) if r["kind"] == kind]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    made = Api(f"sqlite:///{tmp_path / 'control.db'}", signin_limits=LIMITS)
    yield made
    made.close()


def client_from(api: Api, address: str) -> TestClient:
    return TestClient(create_app(api.runtime), client=(address, 40000))


def test_the_counter_on_a_moving_clock() -> None:
    now = [1000.0]
    counter = RefusedSignIns(LIMITS, clock=lambda: now[0])
    key = [("source", "10.0.0.1")]
    crossed = [counter.refuse(key) for _ in range(5)]
    assert [len(c) for c in crossed] == [0, 0, 0, 0, 1]  # reported once, at the limit
    assert crossed[-1][0].scope == "source" and crossed[-1][0].refusals == 5
    assert counter.wait_s(key) == pytest.approx(60)
    assert counter.refuse(key) == []  # past the limit: not reported again this window
    now[0] += 59.5
    assert counter.wait_s(key) == pytest.approx(0.5)
    assert counter.wait_s([("source", "10.0.0.2")]) is None  # another source is not held
    now[0] += 1  # a new window
    assert counter.wait_s(key) is None
    assert [len(counter.refuse(key)) for _ in range(5)] == [0, 0, 0, 0, 1]  # and one report
    # spoofed sources cannot grow the table past max_tracked
    for n in range(5000):
        counter.refuse([("source", f"198.51.{n // 256}.{n % 256}")])
    assert len(counter._windows) == LIMITS.max_tracked


def test_the_packaged_limits_load() -> None:
    packaged = SignInLimits.load()
    assert packaged.per_source.refusals >= 1 and packaged.per_account.window_s > 0
    with pytest.raises(ValueError, match="refusals"):
        SignInLimits.from_dict(
            {
                "per_source": {"refusals": 0, "window_s": 1},
                "per_account": {"refusals": 1, "window_s": 1},
            }
        )


def test_a_flood_of_bad_bearer_tokens_gets_429_and_one_record(api: Api) -> None:
    good = api.headers("acme", "viewer")
    flood = client_from(api, "203.0.113.7")
    answers = []
    for _ in range(50):
        bad = {"Authorization": f"Bearer dpx_{secrets.token_hex(8)}_{secrets.token_urlsafe(24)}"}
        answers.append(flood.get("/api/v1/incidents", headers=bad))
    statuses = [a.status_code for a in answers]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}
    retry = int(answers[-1].headers["Retry-After"])
    assert 1 <= retry <= 60
    assert "too many refused sign-ins" in answers[-1].json()["error"]["message"]
    # a good token from the flooding source waits too; from elsewhere it works
    assert flood.get("/api/v1/incidents", headers=good).status_code == 429
    assert api.client.get("/api/v1/incidents", headers=good).status_code == 200
    # no credential at all is not a sign-in attempt: a plain 401
    assert client_from(api, "203.0.113.8").get("/api/v1/incidents").status_code == 401
    [throttled] = records(api, "login.throttled")
    assert throttled["subject"] == "203.0.113.7"
    assert throttled["result"] == {
        "method": "api",
        "scope": "source",
        "refusals": 5,
        "window_s": 60.0,
    }
    assert api.runtime.signins.throttled == 46


def test_one_account_guessed_from_many_sources_is_held(api: Api) -> None:
    token = api.token("acme", "viewer")
    token_id = token.split("_")[1]
    wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    statuses = []
    for n in range(6):  # each source stays under its own limit
        client = client_from(api, f"192.0.2.{n}")
        statuses.append(
            client.get(
                "/api/v1/incidents", headers={"Authorization": f"Bearer {wrong}"}
            ).status_code
        )
    assert statuses == [401, 401, 401, 429, 429, 429]
    # the right secret for that account waits as well, from any source
    assert (
        api.client.get("/api/v1/incidents", headers=api.headers("acme", "viewer")).status_code
        == 429
    )
    [throttled] = records(api, "login.throttled")
    assert throttled["subject"] == f"token:{token_id}" and throttled["tenant"] == "acme"
    assert throttled["result"]["scope"] == "account"
    assert wrong not in str(records(api, "login.throttled"))


def test_a_flood_of_bad_tokens_at_the_login_form(api: Api) -> None:
    from tests.control.ui.test_ui_pages import csrf_of

    flood = client_from(api, "203.0.113.9")
    csrf = csrf_of(flood.get("/login").text)
    replies = [
        flood.post(
            "/login",
            data={"token": f"dpx_{secrets.token_hex(8)}_x{n}", "next": "/", "csrf": csrf},
            follow_redirects=False,
        )
        for n in range(20)
    ]
    statuses = [r.status_code for r in replies]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}
    assert "Retry-After" in replies[-1].headers and "too many refused sign-ins" in replies[-1].text
    assert len(records(api, "login.failed")) == 5  # the refusals before the limit, one each
    assert len(records(api, "login.throttled")) == 1


def test_a_flood_of_forged_saml_responses(tmp_path: Path) -> None:
    from tests.enterprise.test_saml import BASE, make_sso

    sso = make_sso(tmp_path, signin_limits=LIMITS)
    try:
        flood = TestClient(create_app(sso.api.runtime), base_url=BASE, client=("203.0.113.10", 1))
        statuses = [
            flood.post(
                "/saml/acs", data={"SAMLResponse": "PGZvcmdlZC8+"}, follow_redirects=False
            ).status_code
            for _ in range(12)
        ]
        assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}
        assert len(records(sso.api, "login.throttled")) == 1
    finally:
        sso.api.close()
        sso.idp.stop()
