"""Multi-region: `denpex server --region` refuses (and audits) at ingest a tenant not resident
in its region and a payload naming another region's host or another tenant; the global read
view gathers the regions' incidents and audit log by PostgreSQL logical replication, between
real local PostgreSQL clusters (two regions and the global site): an incident of region A is
there within seconds, a tenant not resident at the global site never reaches it, and region
A keeps working while the global site is down, which catches up once it is back."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from denpex.control.db import Database
from denpex.control.global_view import GlobalView
from denpex.control.residency import parse_residency
from denpex.core.events import Event
from tests.control.conftest import Api
from tests.control.helpers import evidence, logs_body, metrics_body, report
from tests.control.pg import PgCluster, pg_bindir

REGIONS = {
    "regions": {"eu": {"hosts": ["node*", "eu-*"]}, "us": {"hosts": ["us-*"]}},
    "tenants": {"acme": ["eu", "us"], "euonly": ["eu"], "usonly": ["us"]},
    "global": {"region": "us"},
}
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def refusals(url: str) -> list[str]:
    db = Database(url)
    try:
        with db.system_tx() as conn:
            query = sa.text("SELECT line FROM audit WHERE kind = 'ingest.refused' ORDER BY seq")
            return list(conn.execute(query).scalars())
    finally:
        db.dispose()


def test_residency_file():
    eu = parse_residency("eu", REGIONS)
    assert eu.region_of("node7") == "eu" and eu.region_of("us-3") == "us"
    assert eu.region_of("elsewhere") is None
    assert eu.resident_here("euonly") and not eu.resident_here("usonly")
    assert not eu.resident_here("unlisted")  # default residency: nowhere
    assert eu.global_tenants() == ["acme", "usonly"]
    with pytest.raises(ValueError, match="not in the regions file"):
        parse_residency("ap", REGIONS)
    with pytest.raises(ValueError, match=r"tenants\.x"):
        parse_residency("eu", {**REGIONS, "tenants": {"x": ["mars"]}})


@pytest.fixture
def eu_api(tmp_path):
    app = Api(f"sqlite:///{tmp_path / 'eu.db'}", residency=parse_residency("eu", REGIONS))
    yield app
    app.close()


def test_ingest_refuses_and_audits_other_regions_and_tenants(eu_api):
    api = eu_api
    ok = api.post("/v1/logs", content=logs_body(evidence(2, host="eu-1")), headers=PROTOBUF)
    assert ok.status_code == 200
    assert api.post("/api/v1/reports", json=report(host="node1")).status_code == 201

    # a host of another region, in logs, metrics and a report: refused whole
    us_logs = logs_body(evidence(2, host="us-1") + evidence(1, host="eu-2"))
    reply = api.post("/v1/logs", content=us_logs, headers=PROTOBUF)
    assert reply.status_code == 403 and "belongs to region 'us'" in reply.text
    reply = api.post("/v1/metrics", content=metrics_body(host="us-9"), headers=PROTOBUF)
    assert reply.status_code == 403
    assert api.post("/api/v1/reports", json=report(host="us-2")).status_code == 403
    # a host no region is the authority for
    reply = api.post("/v1/logs", content=logs_body(evidence(1, host="mars")), headers=PROTOBUF)
    assert reply.status_code == 403 and "no region" in reply.text
    # a tenant not resident in this region, whatever its hosts
    reply = api.post("/v1/logs", "usonly", content=logs_body(evidence(1)), headers=PROTOBUF)
    assert reply.status_code == 403 and "may not store data in region 'eu'" in reply.text
    # a payload naming another tenant than the token's
    other = logs_body([Event(body="x", host="node1", source="kmsg", tenant="euonly", ts_ns=1)])
    assert api.post("/v1/logs", content=other, headers=PROTOBUF).status_code == 403

    evidence_ids = [e["id"] for e in api.get("/api/v1/evidence").json()["items"]]
    assert not any("us-" in i for i in evidence_ids)
    lines = refusals(api.url)
    assert len(lines) == 6
    assert sum('"tenant":"usonly"' in line for line in lines) == 1
    assert all("/v1/" in line or "/api/v1/reports" in line for line in lines)


# --- logical replication between real clusters ----------------------------------------------


@pytest.fixture
def clusters():
    bindir = pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries not found: apt-get install postgresql")
    started: dict[str, PgCluster] = {}
    try:
        for name in ("eu", "us", "global"):
            started[name] = PgCluster(bindir, settings="-c wal_level=logical")
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()


def us_report(job: str) -> dict:
    """A report of a job on region us's hosts only."""
    body = report(job=job, host="us-1")
    return json.loads(json.dumps(body).replace('"node0"', '"us-0"'))


def wait_for(predicate, timeout_s: float = 20.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.1)
    return time.monotonic() - start


@pytest.mark.slow
def test_global_view_by_logical_replication(clusters):
    regions = {}
    for name in ("eu", "us"):
        url = clusters[name].create_database("denpex")
        regions[name] = Api(url, residency=parse_residency(name, REGIONS))
    eu, us = regions["eu"], regions["us"]
    global_url = clusters["global"].url("postgres", user="postgres")
    view = GlobalView(global_url)
    try:
        view.prepare()
        for name in ("eu", "us"):
            port = clusters[name].port
            view.subscribe(name, f"host=127.0.0.1 port={port} user=postgres dbname=denpex")

        # an incident of region eu, for a tenant resident at the global site (us)
        assert eu.post("/api/v1/reports", json=report(job="a1")).status_code == 201
        eu.tick()
        mine = eu.get("/api/v1/incidents").json()["items"]
        assert mine
        took = wait_for(lambda: len(view.incidents(tenant="acme")) >= len(mine))
        assert {(i["region"], i["id"]) for i in view.incidents(tenant="acme")} == {
            ("eu", i["id"]) for i in mine
        }
        print(f"incident of region eu in the global view after {took:.2f} s")
        # us's incidents arrive beside them, keyed by region (ids overlap across regions)
        assert us.post("/api/v1/reports", json=us_report("b1")).status_code == 201
        us.tick()
        wait_for(lambda: any(i["region"] == "us" for i in view.incidents(tenant="acme")))

        # a tenant resident in eu only: stored in eu, never replicated to the global site
        assert eu.post("/api/v1/reports", "euonly", json=report(job="c1")).status_code == 201
        eu.tick()
        assert eu.get("/api/v1/incidents", "euonly").json()["items"]
        assert eu.post("/api/v1/reports", json=report(job="a2", host="node2")).status_code == 201
        eu.tick()  # a later acme incident: the link is up, so euonly's rows had their chance
        wait_for(lambda: len(view.incidents(tenant="acme")) > len(mine) + 1)
        assert view.incidents(tenant="euonly") == []
        assert view.audit(tenant="euonly") == []

        # the link is down: eu keeps ingesting and correlating; the view catches up after
        clusters["global"].pause()
        before = len(eu.get("/api/v1/incidents").json()["items"])
        for n in range(3):
            body = report(job=f"down{n}", host=f"node{10 + n}", category="nccl.timeout")
            assert eu.post("/api/v1/reports", json=body).status_code == 201
        eu.tick()
        during = eu.get("/api/v1/incidents").json()["items"]
        assert len(during) > before
        clusters["global"].resume()
        view.dispose()
        view = GlobalView(global_url)
        eu_ids = {i["id"] for i in during}
        took = wait_for(
            lambda: (
                eu_ids
                <= {
                    i["id"]
                    for i in view.incidents(tenant="acme", limit=1000)
                    if i["region"] == "eu"
                }
            ),
            timeout_s=60,
        )
        print(f"global view caught up {took:.2f} s after the link came back")
        assert view.incidents(tenant="euonly") == []
    finally:
        view.dispose()
        for app in regions.values():
            app.close()


def test_global_view_command_and_region_options(tmp_path, pg_cluster):
    from tests.control.test_server_cli import denpex

    pg_cluster.admin(f"CREATE DATABASE g{tmp_path.name.replace('-', '_')[-20:]}")
    url = pg_cluster.url(f"g{tmp_path.name.replace('-', '_')[-20:]}", user="postgres")
    listed = denpex("global-view", "--db", url, "--list", "incidents")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    bad = denpex("global-view", "--db", f"sqlite:///{tmp_path / 'x.db'}", "--list", "audit")
    assert bad.returncode != 0 and "PostgreSQL" in bad.stderr
    regions = tmp_path / "regions.yaml"
    regions.write_text(json.dumps(REGIONS))
    alone = denpex("--db", f"sqlite:///{tmp_path / 'y.db'}", "--region", "eu")
    assert alone.returncode != 0 and "--region and --regions go together" in alone.stderr
    wrong = denpex(
        "--db", f"sqlite:///{tmp_path / 'y.db'}", "--region", "ap", "--regions", str(regions)
    )
    assert wrong.returncode != 0 and "not in the regions file" in wrong.stderr
