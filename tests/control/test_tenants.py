"""Tenant isolation: two tenants with the same kinds of data; every endpoint, asked with
one tenant's token, shows none of the other's (the same suite on both engines). In
PostgreSQL, row-level security holds even for a query that forgets its tenant filter."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.control.helpers import evidence, logs_body, report

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def populate(api, tenant: str) -> dict:
    """Data for `tenant` on hosts and jobs whose names the other tenant uses too."""
    body = report(job="shared-job", user="shared-user", report_id=f"r-{tenant}")
    assert api.post("/api/v1/reports", json=body, tenant=tenant).status_code == 201
    items = evidence(4, host="node1", prefix=f"ev-{tenant}", job="shared-job")
    assert (
        api.post("/v1/logs", content=logs_body(items), headers=PROTOBUF, tenant=tenant).status_code
        == 200
    )
    api.tick()
    incidents = api.get("/api/v1/incidents", tenant=tenant).json()["items"]
    # the job's own incident, and the fleet rules' for the GPU the agent saw fall off the bus
    by_kind = {i["component"]["kind"]: i["id"] for i in incidents}
    assert len(incidents) == 2 and set(by_kind) == {"job", "gpu"}
    return {"report": body["id"], "evidence": items[0].id, "incident": by_kind["job"]}


def walk(api, tenant: str, own: dict) -> str:
    """Every GET endpoint as `tenant`; returns all the text they answered."""
    paths = [
        "/api/v1/incidents",
        f"/api/v1/incidents/{own['incident']}",
        "/api/v1/hosts",
        "/api/v1/hosts/node1",
        "/api/v1/hosts/node0",
        "/api/v1/jobs",
        "/api/v1/jobs?host=node1",
        "/api/v1/jobs/shared-job",
        f"/api/v1/reports/{own['report']}",
        "/api/v1/evidence",
        "/api/v1/evidence?host=node1",
        f"/api/v1/evidence/{own['evidence']}",
    ]
    texts = []
    for path in paths:
        reply = api.get(path, tenant=tenant)
        assert reply.status_code == 200, (path, reply.text)
        texts.append(reply.text)
    return "\n".join(texts)


def test_tenant_matrix(api):
    mine = populate(api, "red")
    theirs = populate(api, "blue")
    for tenant, own, other, other_name in (
        ("red", mine, theirs, "blue"),
        ("blue", theirs, mine, "red"),
    ):
        text = walk(api, tenant, own)
        assert f"ev-{other_name}" not in text and f"r-{other_name}" not in text
        assert f"ev-{tenant}" in text
        # the other tenant's ids answer 404 (not 403: their existence is not told)
        for path in (f"/api/v1/reports/{other['report']}", f"/api/v1/evidence/{other['evidence']}"):
            assert api.get(path, tenant=tenant).status_code == 404
        if other["incident"] != own["incident"]:
            path = f"/api/v1/incidents/{other['incident']}"
            assert api.get(path, tenant=tenant).status_code == 404
            assert api.post(path + "/acknowledge", tenant=tenant).status_code == 404
            assert api.post(path + "/resolve", tenant=tenant).status_code == 404
    # and the other tenant's incident is still open
    incident = api.get(f"/api/v1/incidents/{theirs['incident']}", tenant="blue").json()
    assert incident["status"] == "open"


def test_a_store_handle_needs_an_authenticated_principal(api):
    from denpex.enterprise import Principal

    forged = Principal("red", "admin", "0" * 16)
    with pytest.raises(PermissionError):
        api.runtime.store.scoped(forged)


def test_row_level_security_without_a_tenant_filter(pg_url):
    """A query that forgets `WHERE tenant = …` still sees only the bound tenant's rows."""
    from tests.control.conftest import Api

    api = Api(pg_url)
    try:
        populate(api, "red")
        populate(api, "blue")
        db = api.runtime.db
        tables = ("evidence", "hosts", "reports", "report_hosts", "incidents", "incident_links")
        for table in tables:
            with db.tenant_tx("red") as conn:
                tenants = set(conn.execute(sa.text(f"SELECT tenant FROM {table}")).scalars())
            assert tenants == {"red"}, table
        with db.tenant_tx("red") as conn:
            assert conn.execute(sa.text("SELECT current_user")).scalar() == "denpex_tenant"
            # nor can it write a row of another tenant, or move one there
            with (
                pytest.raises(sa.exc.DBAPIError, match="row-level security"),
                conn.begin_nested(),
            ):
                conn.execute(sa.text("UPDATE incidents SET tenant = 'blue'"))
        with db.tenant_tx("red") as conn, pytest.raises(sa.exc.DBAPIError):
            conn.execute(sa.text("INSERT INTO tenants (name, created_ns) VALUES ('x', 0)"))
        # the tenant role bound to no tenant sees nothing at all
        with db.engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL ROLE denpex_tenant"))
            assert conn.execute(sa.text("SELECT count(*) FROM evidence")).scalar() == 0
        # and the owner itself is subject to the policies (FORCE)
        with db.engine.begin() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM reports")).scalar() == 0
    finally:
        api.close()
