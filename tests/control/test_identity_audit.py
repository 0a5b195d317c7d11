"""Identity acts in the hash-chained audit: UI sign-ins (and refused ones), sign-outs, token
revocation under its tenant and changes of the identity-provider mappings are records of the
chain `denpex audit verify` checks; a changed record is detected, and no credential is in it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from denpex.control import audit_log
from denpex.core import audit
from denpex.enterprise import OidcConfig
from denpex.enterprise.tokens import parse_token
from tests.control.conftest import Api


@pytest.fixture
def ui(db_url: str) -> Iterator[Api]:
    app = Api(db_url)
    yield app
    app.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found
    return found.group(1)


def records(api: Api, kind: str | None = None) -> list[dict]:
    found = [audit.loads_record(line) for line in audit_log.export_lines(api.runtime.db)]
    return [r for r in found if kind is None or r["kind"] == kind]


def sign_in(api: Api, token: str) -> int:
    page = api.client.get("/login")
    reply = api.client.post(
        "/login", data={"token": token, "csrf": csrf_of(page.text)}, follow_redirects=False
    )
    return reply.status_code


def test_sign_ins_sign_outs_and_refusals_are_chained(ui: Api) -> None:
    token = ui.token("acme", "operator")
    token_id, secret = parse_token(token) or ("", "")
    assert sign_in(ui, token) == 303
    [ok] = records(ui, "login.succeeded")
    assert ok["tenant"] == "acme" and ok["actor"] == f"token:{token_id}"
    assert ok["result"] == {"method": "token", "role": "operator"}

    csrf = csrf_of(ui.client.get("/jobs").text)
    assert ui.client.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    [out] = records(ui, "logout")
    assert out["tenant"] == "acme" and out["subject"] == f"token:{token_id}"

    ui.client.cookies.clear()
    wrong_secret = f"dpx_{token_id}_{'A' * 43}"
    assert sign_in(ui, wrong_secret) == 401
    assert sign_in(ui, "not-a-token") == 401
    named, unnamed = records(ui, "login.failed")
    assert named["tenant"] == "acme" and named["subject"] == f"token:{token_id}"
    assert unnamed["tenant"] is None and unnamed["subject"] == "unknown"

    assert ui.runtime.store.revoke_token(token_id, 1, actor="cli")
    [revoked] = records(ui, "token.revoked")
    assert revoked["tenant"] == "acme" and revoked["actor"] == "cli"
    assert sign_in(ui, token) == 401  # a revoked token: refused, and recorded as refused
    assert len(records(ui, "login.failed")) == 3

    lines = list(audit_log.export_lines(ui.runtime.db))
    assert not any(secret.encode() in line or b"AAAAAAAA" in line for line in lines)
    head = audit.head_of(audit.loads_record(lines[-1]))
    export = [*lines, audit.anchor_line(head, None)]
    assert audit.verify_lines(export).ok

    at = next(i for i, line in enumerate(lines) if b'"login.succeeded"' in line)
    forged = [*export]
    forged[at] = forged[at].replace(b'"role":"operator"', b'"role":"admin"')
    verdict = audit.verify_lines(forged)
    assert not verdict.ok and verdict.line == at + 1 and "changed" in verdict.reason
    dropped = export[:at] + export[at + 1 :]
    assert not audit.verify_lines(dropped).ok


def oidc_config(*rules: dict) -> OidcConfig:
    return OidcConfig.from_dict(
        {"issuer": "http://127.0.0.1:9", "audiences": ["denpex"], "mappings": list(rules)}
    )


def test_mapping_changes_are_recorded_once_per_change(db_url: str) -> None:
    first = oidc_config(
        {"group": "sre", "tenant": "acme", "role": "operator"},
        {"group": "ops", "tenant": "blue", "role": "viewer"},
    )
    api = Api(db_url, oidc=first)
    try:
        recorded = records(api, "identity.mappings")
        assert [r["tenant"] for r in recorded] == ["acme", "blue"]
        assert recorded[0]["result"]["rules"] == [{"group": "sre", "role": "operator"}]
        assert recorded[0]["result"]["old"] is None
    finally:
        api.close()
    again = Api(db_url, oidc=first)  # a restart with the same rules: nothing new
    again.close()
    changed = oidc_config({"group": "sre", "tenant": "acme", "role": "admin"})
    later = Api(db_url, oidc=changed)
    try:
        recorded = records(later, "identity.mappings")
        assert [r["tenant"] for r in recorded] == ["acme", "blue", "acme", "blue"]
        acme, blue = recorded[2:]
        assert acme["result"]["old"] == recorded[0]["result"]["new"]
        assert acme["result"]["rules"] == [{"group": "sre", "role": "admin"}]
        assert blue["result"]["rules"] == []  # blue lost its only rule
        lines = list(audit_log.export_lines(later.runtime.db))
        head = audit.head_of(audit.loads_record(lines[-1]))
        assert audit.verify_lines([*lines, audit.anchor_line(head, None)]).ok
    finally:
        later.close()
