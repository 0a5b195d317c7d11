"""Every route of the control plane is decided by the policy set: the route table is walked
(a route without the one auth dependency fails), every route is refused under a policy set
that forbids everything, and each refusal of an authenticated caller lands in its tenant's
denial log, which only audit:read roles can read (both engines)."""

from __future__ import annotations

import re
import shutil
from importlib import resources
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from denpex.control.access import Decides
from tests.control.conftest import Api

BUNDLED = Path(str(resources.files("denpex.enterprise").joinpath("policies")))


def decisions_of(route: APIRoute) -> list[Decides]:
    found = []
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        if isinstance(dependant.call, Decides):
            found.append(dependant.call)
        pending.extend(dependant.dependencies)
    return found


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: "1" if m.group(1).endswith("_id") else "x", path)


def test_every_route_names_one_policy_decision(api):
    app = api.client.app
    routes = list(app.routes)
    assert routes
    seen = set()
    for route in routes:
        if isinstance(route, Mount) and isinstance(route.app, StaticFiles):
            continue  # packaged static assets (the UI's CSS, JS): no tenant's data, no decision
        assert isinstance(route, APIRoute), f"{route!r} bypasses FastAPI's dependencies"
        decides = decisions_of(route)
        assert len(decides) == 1, f"{route.path}: {len(decides)} policy decisions"
        assert decides[0].action in api.runtime.policies.actions
        seen.add(decides[0].action)
        if decides[0].public:
            assert decides[0].action == "service:read", route.path
    assert {"service:read", "incidents:read", "incidents:write", "audit:read"} <= seen


@pytest.fixture
def forbid_all(tmp_path: Path, db_url: str):
    folder = tmp_path / "policies"
    shutil.copytree(BUNDLED, folder)
    (folder / "lockdown.cedar").write_text(
        '@id("lockdown")\nforbid (principal, action, resource);\n'
    )
    manifest = (folder / "manifest.yaml").read_text()
    manifest = re.sub(r"(?m)^version: .*$", "version: 1-lockdown", manifest)
    (folder / "manifest.yaml").write_text(manifest.replace("files: [", "files: [lockdown.cedar, "))
    app = Api(db_url, policy_dir=str(folder))
    yield app
    app.close()


def test_every_route_is_refused_when_the_policy_set_says_no(forbid_all):
    from denpex.control.ui.session import COOKIE, SessionCodec, new_session

    api = forbid_all
    headers = api.headers("acme", "admin")
    # the UI's pages take the same token from a session cookie (logging in is refused too)
    session = SessionCodec(api.runtime.store).seal(new_session(api.token("acme", "admin")))
    authenticated = pages = 0
    for route in api.client.app.routes:
        if not isinstance(route, APIRoute):
            continue  # static assets (checked by the route walk above)
        for method in sorted(route.methods):
            api.client.cookies.set(COOKIE, session)
            reply = api.client.request(method, concrete(route.path), headers=headers)
            assert reply.status_code == 403, (method, route.path, reply.text)
            if reply.headers["content-type"].startswith("text/html"):
                pages += 1
                assert "denied by policy lockdown" in reply.text, (method, route.path)
            else:
                assert "lockdown" in reply.json()["error"]["message"]
            authenticated += not decisions_of(route)[0].public
    assert pages >= 8  # login, logout, fleet, incident, its forms, evidence, host, jobs
    from denpex.enterprise import authenticate

    admin = authenticate(headers, api.runtime.tokens)
    items, _ = api.runtime.denials.list(admin, limit=1000)
    assert len(items) == authenticated
    assert {i["policy_version"] for i in items} == {"1-lockdown"}
    assert all(i["policies"] == ["lockdown"] for i in items)
    assert all(i["principal"] == f"token:{admin.token_id}" for i in items)


def test_denials_are_logged_per_tenant_and_read_only_by_auditors(api):
    viewer = api.token("red", "viewer")
    refused = api.client.post(
        "/api/v1/incidents/7/resolve", headers={"Authorization": f"Bearer {viewer}"}
    )
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == (
        "viewer may not incidents:write: no policy permits it"
    )
    # a viewer cannot read the log; its own attempt is logged too
    assert api.get("/api/v1/denials", tenant="red", role="viewer").status_code == 403
    log = api.get("/api/v1/denials", tenant="red", role="auditor")
    assert log.status_code == 200, log.text
    items = log.json()["items"]
    assert [(i["action"], i["role"]) for i in items] == [
        ("audit:read", "viewer"),
        ("incidents:write", "viewer"),
    ]
    assert viewer.split("_", 2)[2] not in log.text  # the secret is never stored
    assert api.get("/api/v1/denials", tenant="red", role="admin").json()["items"] == items
    # another tenant's auditor sees none of it
    assert api.get("/api/v1/denials", tenant="blue", role="auditor").json()["items"] == []
    # paging, newest first
    first = api.get("/api/v1/denials?limit=1", tenant="red", role="auditor").json()
    assert first["items"] == items[:1] and first["next_cursor"]
    rest = api.get(
        f"/api/v1/denials?limit=1&cursor={first['next_cursor']}", tenant="red", role="auditor"
    ).json()
    assert rest["items"] == items[1:2]


def test_a_request_attribute_reaches_the_policy(tmp_path, db_url):
    folder = tmp_path / "policies"
    shutil.copytree(BUNDLED, folder)
    (folder / "nonet.cedar").write_text(
        '@id("no-network-reads")\n'
        'forbid (principal, action == Denpex::Action::"incidents:read", resource)\n'
        'when { resource has category && resource.category like "network.*" };\n'
    )
    manifest = (folder / "manifest.yaml").read_text()
    (folder / "manifest.yaml").write_text(manifest.replace("files: [", "files: [nonet.cedar, "))
    api = Api(db_url, policy_dir=str(folder))
    try:
        assert api.get("/api/v1/incidents?category=gpu.ecc").status_code == 200
        refused = api.get("/api/v1/incidents?category=network.ib_link_down")
        assert refused.status_code == 403 and "no-network-reads" in refused.text
    finally:
        api.close()


def test_a_server_refuses_to_start_on_a_broken_policy_folder(tmp_path, db_url):
    from denpex.enterprise import PolicyError

    folder = tmp_path / "policies"
    shutil.copytree(BUNDLED, folder)
    (folder / "viewer.cedar").write_text("permit (principal, action, resource);\n")
    with pytest.raises(PolicyError, match="@id"):
        Api(db_url, policy_dir=str(folder))
