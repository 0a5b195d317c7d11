"""SCIM 2.0 provisioning (`/scim/v2`): scim2-tester's conformance checks against a real
`denpex server` process, then what provisioning means for denpex: group membership gives the
role the identity mappings name (sessions follow it at once), deactivation and deletion
revoke every session and token standing for the person at once, each step in the audit
chain; `userName eq` filters, pagination, ETags, no password stored, and the tenant of the
token as the only tenant."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.control import audit_log
from denpex.control.sso import open_session_token
from denpex.core import audit
from denpex.enterprise import OidcConfig
from tests.control.conftest import Api, ServerProcess, mint

USER_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP_SCHEMA = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH_SCHEMA = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


@pytest.mark.slow  # a real server and 135 checks over HTTP: about a minute on 2 cores
def test_scim2_tester_finds_the_endpoint_conformant(tmp_path: Path, server_processes) -> None:
    import httpx2
    from scim2_client.engines.httpx2 import SyncSCIMClient
    from scim2_tester import Status, check_server

    url = f"sqlite:///{tmp_path / 'control.db'}"
    token = mint(url, "acme", "provisioner")
    server = ServerProcess(url, tmp_path / "server.log").start()
    server_processes.append(server)
    http = httpx2.Client(
        base_url=f"{server.base}/scim/v2", headers={"Authorization": f"Bearer {token}"}
    )
    client = SyncSCIMClient(http)
    client.discover()
    results = check_server(client)
    failed = [f"{r.title}: {r.reason}" for r in results if r.status != Status.SUCCESS]
    print(f"scim2-tester: {len(results)} checks, {len(failed)} not passed")
    assert len(results) >= 100
    assert not failed, failed[:20]
    refused = httpx2.get(f"{server.base}/scim/v2/Users")  # no token
    assert refused.status_code == 401


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    oidc = OidcConfig.from_dict(
        {
            "issuer": "http://127.0.0.1:9",
            "audiences": ["denpex"],
            "mappings": [
                {"group": "admins", "tenant": "acme", "role": "admin"},
                {"group": "sre", "tenant": "acme", "role": "operator"},
            ],
        }
    )
    app = Api(db_url, oidc=oidc)
    yield app
    app.close()


class Scim:
    def __init__(self, api: Api, tenant: str = "acme") -> None:
        self.api = api
        self.headers = {
            "Authorization": f"Bearer {api.token(tenant, 'provisioner')}",
            "Content-Type": "application/scim+json",
        }

    def call(self, method: str, path: str, body: dict | None = None, **headers: str):
        return self.api.client.request(
            method,
            f"/scim/v2{path}",
            headers={**self.headers, **headers},
            content=json.dumps(body) if body is not None else None,
        )

    def user(self, name: str, **extra) -> str:
        reply = self.call("POST", "/Users", {"schemas": [USER_SCHEMA], "userName": name, **extra})
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def group(self, name: str, *members: str) -> str:
        body = {"schemas": [GROUP_SCHEMA], "displayName": name,
                "members": [{"value": m} for m in members]}  # fmt: skip
        reply = self.call("POST", "/Groups", body)
        assert reply.status_code == 201, reply.text
        return reply.json()["id"]

    def patch(self, path: str, *operations: dict, **headers: str):
        return self.call(
            "PATCH", path, {"schemas": [PATCH_SCHEMA], "Operations": list(operations)}, **headers
        )


def records(api: Api, kind: str) -> list[dict]:
    lines = audit_log.export_lines(api.runtime.db)
    return [r for r in map(audit.loads_record, lines) if r["kind"] == kind]


def test_membership_drives_roles_and_deprovisioning_revokes(api: Api) -> None:
    scim = Scim(api)
    bob = scim.user("bob@corp.test", password="never-stored-7")
    now = time.time_ns()
    session = open_session_token(api.runtime.store, "acme", "viewer", "saml:bob@corp.test",
                                 now, 3600, "saml")  # fmt: skip
    own = open_session_token(api.runtime.store, "acme", "viewer", f"scim:{bob}", now, 3600, "scim")
    whoami = {"Authorization": f"Bearer {session}"}
    assert api.client.get("/api/v1/incidents", headers=whoami).status_code == 200

    sre = scim.group("sre", bob)
    [change] = records(api, "role.changed")
    assert change["tenant"] == "acme" and change["subject"] == "scim:bob@corp.test"
    assert change["result"] == {"old": None, "new": "operator"}
    assert change["actor"].startswith("token:")
    assert api.runtime.store.find_token(session.split("_")[1]).role == "operator"

    admins = scim.group("admins")
    reply = scim.patch(f"/Groups/{admins}", {"op": "add", "path": "members",
                                             "value": [{"value": bob}]})  # fmt: skip
    assert reply.status_code in (200, 204), reply.text
    assert records(api, "role.changed")[-1]["result"] == {"old": "operator", "new": "admin"}
    reply = scim.patch(f"/Groups/{admins}", {"op": "remove", "path": f'members[value eq "{bob}"]'})
    assert reply.status_code in (200, 204), reply.text
    assert records(api, "role.changed")[-1]["result"] == {"old": "admin", "new": "operator"}
    assert sre

    reply = scim.patch(f"/Users/{bob}", {"op": "replace", "path": "active", "value": False})
    assert reply.status_code in (200, 204), reply.text
    assert api.client.get("/api/v1/incidents", headers=whoami).status_code == 401  # at once
    assert api.client.get("/api/v1/incidents",
                          headers={"Authorization": f"Bearer {own}"}).status_code == 401  # fmt: skip
    last = records(api, "role.changed")[-1]
    assert last["result"] == {"old": "operator", "new": None}
    assert last["why"] == {"deprovisioned": True, "tokens_revoked": 2}
    assert {r["subject"] for r in records(api, "token.revoked")} == {
        f"token {session.split('_')[1]}",
        f"token {own.split('_')[1]}",
    }

    lines = list(audit_log.export_lines(api.runtime.db))
    assert not any(b"never-stored-7" in line for line in lines)
    head = audit.head_of(audit.loads_record(lines[-1]))
    assert audit.verify_lines([*lines, audit.anchor_line(head, None)]).ok
    with api.runtime.db.tenant_tx("acme") as conn:
        stored = conn.exec_driver_sql("SELECT resource FROM scim_users").scalars().all()
    assert stored and not any("never-stored-7" in r for r in stored)

    carol = scim.user("carol@corp.test")
    scim.patch(f"/Groups/{sre}", {"op": "add", "path": "members", "value": [{"value": carol}]})
    mine = open_session_token(api.runtime.store, "acme", "operator", "saml:carol@corp.test",
                              time.time_ns(), 3600, "saml")  # fmt: skip
    assert scim.call("DELETE", f"/Users/{carol}").status_code == 204
    assert api.client.get("/api/v1/incidents",
                          headers={"Authorization": f"Bearer {mine}"}).status_code == 401  # fmt: skip


def test_filters_pages_etags_and_tenants(api: Api) -> None:
    scim = Scim(api)
    ids = [scim.user(f"user{n}@corp.test") for n in range(5)]
    found = scim.call("GET", '/Users?filter=userName eq "user3@corp.test"').json()
    assert found["totalResults"] == 1 and found["Resources"][0]["id"] == ids[3]
    page = scim.call("GET", "/Users?startIndex=2&count=2&sortBy=userName").json()
    assert page["totalResults"] == 5 and page["startIndex"] == 2
    assert [r["userName"] for r in page["Resources"]] == ["user1@corp.test", "user2@corp.test"]

    current = scim.call("GET", f"/Users/{ids[0]}")
    etag = current.headers["etag"]
    stale = scim.patch(f"/Users/{ids[0]}", {"op": "replace", "path": "displayName",
                                            "value": "U0"}, **{"If-Match": 'W/"99"'})  # fmt: skip
    assert stale.status_code == 412
    fresh = scim.patch(f"/Users/{ids[0]}", {"op": "replace", "path": "displayName",
                                            "value": "U0"}, **{"If-Match": etag})  # fmt: skip
    assert fresh.status_code in (200, 204), fresh.text
    assert scim.call("GET", f"/Users/{ids[0]}").headers["etag"] != etag
    taken = scim.call("POST", "/Users", {"schemas": [USER_SCHEMA], "userName": "user1@corp.test"})
    assert taken.status_code == 409 and taken.json()["scimType"] == "uniqueness"

    other = Scim(api, "globex")
    assert other.call("GET", f"/Users/{ids[0]}").status_code == 404
    assert (
        other.call("GET", '/Users?filter=userName eq "user3@corp.test"').json()["totalResults"] == 0
    )
    assert other.call("DELETE", f"/Users/{ids[1]}").status_code == 404
    assert scim.call("GET", f"/Users/{ids[1]}").status_code == 200
    admin = {"Authorization": f"Bearer {api.token('acme', 'admin')}"}
    assert api.client.get("/scim/v2/Users", headers=admin).status_code == 403
    assert api.client.get("/scim/v2/ServiceProviderConfig").status_code == 200  # public
