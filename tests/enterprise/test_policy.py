"""The Cedar policy set: the bundled cases decide as stated, `denpex policy test` exits 1 on
a mismatch, a broken policy folder is refused at load, and authorize() records every denial
before it raises."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from denpex.enterprise import (
    ANONYMOUS,
    AuthError,
    Denial,
    PolicyError,
    Principal,
    Resource,
    authenticate,
    authorize,
    decide,
    load_policies,
)
from denpex.enterprise.policy_cases import load_cases, run_cases
from denpex.enterprise.tokens import mint_token

BUNDLED = Path(str(resources.files("denpex.enterprise").joinpath("policies")))
CASES = BUNDLED / "cases.yaml"


def denpex(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", "policy", *args], capture_output=True, text=True
    )


def copy_policies(tmp_path: Path) -> Path:
    folder = tmp_path / "policies"
    shutil.copytree(BUNDLED, folder)
    return folder


class Directory:
    def __init__(self, *records):
        self.records = {r.token_id: r for r in records}

    def find_token(self, token_id):
        return self.records.get(token_id)


def authenticated(tenant: str, role: str) -> Principal:
    from denpex.enterprise import TokenRecord

    minted = mint_token()
    directory = Directory(TokenRecord(minted.token_id, tenant, role, minted.secret_hash))
    return authenticate({"Authorization": f"Bearer {minted.token}"}, directory)


class Log:
    def __init__(self) -> None:
        self.denials: list[Denial] = []

    def record_denial(self, denial: Denial) -> None:
        self.denials.append(denial)


def test_the_bundled_cases_decide_as_stated():
    policies = load_policies()
    outcomes = run_cases(load_cases(CASES), policies)
    failed = [o.describe() for o in outcomes if not o.passed]
    assert not failed, failed
    # every role and every policy of the set is exercised by some case
    assert {
        o.case.principal.role for o in outcomes if isinstance(o.case.principal, Principal)
    } >= set(policies.roles)
    deciding = {p for o in outcomes for p in o.decision.policies}
    assert deciding == set(policies.policy_ids)


def test_policy_test_command_exits_1_on_a_mismatch(tmp_path):
    ok = denpex("test", str(CASES))
    assert ok.returncode == 0, ok.stderr
    assert "0 failed" in ok.stdout and f"version {load_policies().version}" in ok.stdout
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        "cases:\n"
        "  - name: a viewer resolves incidents\n"
        "    principal: {tenant: acme, role: viewer}\n"
        "    action: incidents:write\n"
        "    resource: {kind: incidents, tenant: acme}\n"
        "    expect: allow\n"
        "  - name: allowed, but by the wrong policy\n"
        "    principal: {tenant: acme, role: admin}\n"
        "    action: incidents:read\n"
        "    resource: {kind: incidents, tenant: acme}\n"
        "    expect: allow\n"
        "    policy: admin-manage\n"
    )
    bad = denpex("test", str(wrong))
    assert bad.returncode == 1
    assert "FAIL a viewer resolves incidents: expected allow, got deny" in bad.stderr
    assert "FAIL allowed, but by the wrong policy" in bad.stderr
    assert "0 passed, 2 failed" in bad.stdout


def test_policy_test_command_refuses_malformed_cases(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases:\n  - principal: {tenant: a, role: viewer}\n    action: x\n")
    result = denpex("test", str(bad))
    assert result.returncode == 2 and "case 1" in result.stderr
    assert "Traceback" not in result.stderr
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "cases:\n  - principal: {tenant: a, role: viewer}\n    action: incidents:read\n"
        "    resource: {kind: incidents, tenant: a, nodepool: x}\n    expect: allow\n"
    )
    result = denpex("test", str(typo))
    assert result.returncode == 2 and "nodepool" in result.stderr


def test_policy_show_lists_the_set():
    shown = denpex("show")
    assert shown.returncode == 0
    for word in ("approver (extends operator)", "remediation:approve", "change-window"):
        assert word in shown.stdout


@pytest.mark.parametrize(
    "damage, message",
    [
        (("viewer.cedar", '@id("viewer-read")\n', ""), "every policy needs an @id"),
        (("viewer.cedar", "permit (", "permit ((("), "do not"),
        (("viewer.cedar", '"hosts:read"', '"hosts:reed"'), "do not validate"),
        (("tenancy.cedar", "resource.tenant", "resource.tennant"), "do not validate"),
        (
            ("manifest.yaml", "  hosts:read:", "  hosts:delete: x\n  hosts:read:"),
            "manifest actions",
        ),
        (
            ("manifest.yaml", "extends: [viewer]\n  approver", "extends: [root]\n  approver"),
            "unknown",
        ),
        (("auditor.cedar", '@id("auditor-read")', '@id("viewer-read")'), "used twice"),
    ],
)
def test_a_broken_policy_folder_is_refused(tmp_path, damage, message):
    folder = copy_policies(tmp_path)
    name, old, new = damage
    text = (folder / name).read_text()
    assert old in text
    (folder / name).write_text(text.replace(old, new, 1))
    with pytest.raises(PolicyError, match=message):
        load_policies(folder)


def test_a_folder_of_its_own_decides(tmp_path):
    folder = copy_policies(tmp_path)
    (folder / "viewer.cedar").write_text(
        (folder / "viewer.cedar").read_text().replace('Denpex::Action::"hosts:read",\n', "")
    )
    (folder / "manifest.yaml").write_text(
        re.sub(r"(?m)^version: .*$", "version: 2-site", (folder / "manifest.yaml").read_text())
    )
    mine = load_policies(folder)
    viewer = authenticated("acme", "viewer")
    assert decide(viewer, "hosts:read", Resource("hosts", "acme")).allowed
    refused = decide(viewer, "hosts:read", Resource("hosts", "acme"), policies=mine)
    assert not refused.allowed and refused.version == "2-site"


def test_authorize_records_each_denial_before_it_raises():
    log = Log()
    viewer = authenticated("acme", "viewer")
    ok = authorize(viewer, "incidents:read", denials=log)
    assert ok.allowed and ok.policies == ("viewer-read",) and not log.denials
    with pytest.raises(AuthError) as refused:
        authorize(viewer, "incidents:write", denials=log)
    assert refused.value.status == 403
    assert "viewer may not incidents:write: no policy permits it" in refused.value.message
    with pytest.raises(AuthError) as crossed:
        authorize(viewer, "incidents:read", Resource("incidents", "globex"), denials=log)
    assert "tenant-boundary" in crossed.value.message
    assert [(d.action, d.policies, d.tenant) for d in log.denials] == [
        ("incidents:write", (), "acme"),
        ("incidents:read", ("tenant-boundary",), "acme"),
    ]
    denial = log.denials[1]
    assert denial.principal == f"token:{viewer.token_id}"
    assert denial.version == load_policies().version
    assert denial.attrs == {"tenant": "globex"}


def test_a_principal_not_from_authenticate_is_refused():
    forged = Principal("acme", "admin", "0123456789abcdef")
    with pytest.raises(AuthError) as refused:
        authorize(forged, "incidents:read")
    assert refused.value.status == 401


def test_an_evaluation_error_denies():
    admin = authenticated("acme", "admin")
    log = Log()
    # an attribute the schema does not name makes the request invalid: deny, never allow
    with pytest.raises(AuthError):
        authorize(
            admin, "incidents:read", Resource("incidents", "acme", {"rack": "r1"}), denials=log
        )
    assert log.denials and log.denials[0].action == "incidents:read"
    wrong_type = decide(
        admin, "remediation:execute", Resource("nodes", "acme", {"blast_radius": "2"})
    )
    assert not wrong_type.allowed
    assert decide(ANONYMOUS, "service:read", Resource("service", "")).allowed
    assert not decide(ANONYMOUS, "incidents:read", Resource("incidents", "acme")).allowed


def test_time_of_day_comes_from_the_clock_unless_given():
    import datetime as dt

    from denpex.enterprise import request_context

    assert request_context(dt.datetime(2026, 12, 5, 23, 30, tzinfo=dt.UTC)) == {
        "hour": 23,
        "weekday": 6,
    }
    approver = authenticated("acme", "approver")
    step = Resource("nodes", "acme", {"blast_radius": 16})
    night = decide(approver, "remediation:execute", step, {"hour": 2, "weekday": 3})
    day = decide(approver, "remediation:execute", step, {"hour": 9, "weekday": 3})
    assert (night.allowed, night.policies, day.allowed) == (False, ("change-window",), True)
