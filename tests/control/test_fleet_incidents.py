"""The fleet rules in the server: the leader's pass over the store opens, grows and resolves
fleet incidents (behind its epoch fence) that the API shows with their rules, component,
proposed action and resolution — the same suite on SQLite and on PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import denpex.control
from denpex.control.fleet.model import Incident, MergeResult
from denpex.control.fleet_store import FleetStore
from denpex.control.store import Fence, Fenced
from denpex.core.events import metric
from tests.control.conftest import Api
from tests.control.helpers import T0, evidence, logs_body, report

PROTOBUF = {"Content-Type": "application/x-protobuf"}
S = 1_000_000_000
GPU = "node5/0000:3b:00"


@pytest.fixture
def replay(db_url: str):
    app = Api(db_url, replay=True)
    yield app
    app.close()


def tick(api: Api, at_ns: int) -> dict:
    reply = api.post("/api/v1/replay/tick", role="admin", params={"now_ns": at_ns})
    assert reply.status_code == 200, reply.text
    return reply.json()["tenants"]["acme"]


def fleet_incidents(api: Api, **params) -> list[dict]:
    items = api.get("/api/v1/incidents", params=params).json()["items"]
    return [i for i in items if i["component"]["kind"] != "job"]


def diagnostics_passed(host: str, at_ns: int) -> bytes:
    from denpex.agent.otlp import encode_metrics, serialise

    point = metric(
        "diagnostics_last_pass_timestamp_seconds", at_ns / S, source="dcgm", host=host, ts_ns=at_ns
    )
    return serialise(encode_metrics([point], now_ns=at_ns), "http/protobuf")


def clean_job(n: int, host: str, started_ns: int) -> dict:
    body = report(job=f"clean-{n}", status="ok", host=host, ended_ns=started_ns + 600 * S)
    body["started_ns"] = started_ns
    body["hosts"] = [host]
    return body


def test_a_gpu_incident_opens_grows_and_resolves_by_rule(replay):
    api = replay
    first = evidence(1, host="node5", prefix="x1", ts=T0)
    assert api.post("/v1/logs", content=logs_body(first), headers=PROTOBUF).status_code == 200
    done = tick(api, T0 + 60 * S)
    assert len(done["opened"]) == 1 and not done["updated"]
    incident = api.get(f"/api/v1/incidents/{done['opened'][0]}").json()
    assert incident["component"] == {"kind": "gpu", "id": GPU}
    assert incident["rule"] == "hardware_in_job" and incident["rules"] == ["hardware_in_job"]
    assert incident["action"] == "drain_node" and incident["status"] == "open"
    assert incident["category"] == "gpu.fallen_off_bus"
    assert 0.5 < incident["confidence"] <= 1.0 and incident["score"] > 0
    assert incident["evidence"] == ["x1-node5-0"] and incident["hosts"] == ["node5"]
    assert incident["opened_ns"] == T0 + 60 * S
    assert tick(api, T0 + 90 * S) == {"opened": [], "updated": [], "resolved": []}

    # the same GPU again: the incident grows, no twin
    again = evidence(1, host="node5", prefix="x2", ts=T0 + 120 * S)
    api.post("/v1/logs", content=logs_body(again), headers=PROTOBUF)
    done = tick(api, T0 + 180 * S)
    assert done["updated"] == [incident["id"]] and not done["opened"]
    grown = api.get(f"/api/v1/incidents/{incident['id']}").json()
    assert grown["evidence"] == ["x1-node5-0", "x2-node5-0"]
    assert len(fleet_incidents(api)) == 1
    history = api.get("/api/v1/hosts/node5").json()
    assert [i["id"] for i in history["incidents"]] == [incident["id"]]
    of_gpu = fleet_incidents(api, kind="gpu", component=GPU)
    assert [i["id"] for i in of_gpu] == [incident["id"]]
    assert fleet_incidents(api, kind="gpu", component="node5/0000:aa:00") == []

    # diagnostics pass and three clean jobs: the rule `recovered` resolves it
    passed = T0 + 3600 * S
    api.post("/v1/metrics", content=diagnostics_passed("node5", passed), headers=PROTOBUF)
    for n in range(3):
        reply = api.post("/api/v1/reports", json=clean_job(n, "node5", passed + (n + 1) * 60 * S))
        assert reply.status_code == 201, reply.text
    done = tick(api, passed + 7200 * S)
    assert done["resolved"] == [incident["id"]]
    resolved = api.get(f"/api/v1/incidents/{incident['id']}").json()
    assert resolved["status"] == "resolved" and resolved["resolved"]["by"] == "rule:recovered"
    assert resolved["resolved"]["ns"] == passed + 7200 * S and resolved["resolved"]["note"]
    assert fleet_incidents(api, status="open") == []

    # it fails again later: a new incident, not the resolved one reopened
    later = evidence(1, host="node5", prefix="x3", ts=passed + 9000 * S)
    api.post("/v1/logs", content=logs_body(later), headers=PROTOBUF)
    done = tick(api, passed + 9060 * S)
    assert len(done["opened"]) == 1 and done["opened"][0] != incident["id"]


def test_a_stale_leaders_fleet_write_is_refused(replay):
    api = replay
    api.post("/v1/logs", content=logs_body(evidence(1, host="node5")), headers=PROTOBUF)
    tick(api, T0 + 60 * S)
    runtime = api.runtime
    epoch = runtime.leadership.state.epoch
    stale = FleetStore(runtime.store.for_leader("acme", Fence(runtime.leadership.name, epoch - 1)))
    twin = Incident(
        id=None,
        kind="host",
        component="node9",
        category="host.kernel_fault",
        confidence=0.9,
        rules=("repeat_offender",),
        evidence=(),
        jobs=(),
        hosts=("node9",),
        first_ns=T0,
        last_ns=T0,
        explanation="late",
    )
    with pytest.raises(Fenced):
        stale.apply(MergeResult(opened=[twin]), T0 + 120 * S)
    assert [i["component"]["id"] for i in fleet_incidents(api)] == [GPU]


def test_report_placement_is_stored_and_checked(replay):
    api = replay
    body = report(job="placed")
    body.update(
        started_ns=T0 - 3600 * S,
        name="llama-70b",
        gpus=[{"host": "node1", "pci": "0000:3b:00.0", "serial": "1650", "rank": 3}],
        labels={"driver": "550.54.15", "image": "train:42"},
    )
    assert api.post("/api/v1/reports", json=body).status_code == 201
    stored = api.get(f"/api/v1/reports/{body['id']}").json()
    assert stored["started_ns"] == T0 - 3600 * S and stored["name"] == "llama-70b"
    assert stored["gpus"] == body["gpus"] and stored["labels"] == body["labels"]
    for bad in ({"gpus": [{"pci": "x"}]}, {"gpus": [{"host": "a", "rank": "3"}]}, {"labels": []}):
        reply = api.post("/api/v1/reports", json={**report(job="bad"), **bad})
        assert reply.status_code == 400, (bad, reply.text)


def _latest_revision() -> str:
    versions = Path(denpex.control.__file__).parent / "migrations" / "versions"
    return sorted(p.name for p in versions.glob("[0-9]*.py"))[-1].split("_")[0]


def test_replay_ticks_need_a_replay_server_and_an_admin(replay, db_url):
    assert (
        replay.post("/api/v1/replay/tick", role="operator", params={"now_ns": T0}).status_code
        == 403
    )
    live = Api(db_url)
    try:
        reply = live.post("/api/v1/replay/tick", role="admin", params={"now_ns": time.time_ns()})
        assert reply.status_code == 404
        assert replay.get("/healthz").json()["schema"] == _latest_revision()
    finally:
        live.close()


def test_a_jobs_incident_is_a_child_of_the_fleet_incident_for_its_hardware(replay):
    from denpex.control.remediation_store import RemediationStore

    api = replay
    body = report(job="train-x", host="node5", category="gpu.fallen_off_bus")
    body["gpus"] = [{"host": "node5", "pci": "0000:3b:00", "serial": "1650", "rank": 0}]
    assert api.post("/api/v1/reports", json=body).status_code == 201
    done = tick(api, T0 + 60 * S)
    [fleet] = [api.get(f"/api/v1/incidents/{i}").json() for i in done["opened"]]
    [own] = [i for i in api.get("/api/v1/incidents", params={"kind": "job"}).json()["items"]]
    assert fleet["component"]["kind"] in ("gpu", "host") and fleet["jobs"] == ["train-x"]
    assert fleet["children"] == [own["id"]] and fleet["parents"] == []
    assert [c["id"] for c in fleet["child_incidents"]] == [own["id"]]
    assert fleet["child_incidents"][0]["job"] == "train-x"
    mine = api.get(f"/api/v1/incidents/{own['id']}").json()
    assert mine["parents"] == [fleet["id"]] and mine["children"] == []
    roots = api.get("/api/v1/incidents", params={"roots": "true"}).json()["items"]
    assert [i["id"] for i in roots] == [fleet["id"]]  # one story, told by its root
    assert len(api.get("/api/v1/incidents").json()["items"]) == 2
    # remediation plans once, for the root: the job's own incident is superseded by it
    plans = RemediationStore(api.runtime.db, "acme", None)
    assert plans.superseded_by(own["id"]) == fleet["id"]
    assert plans.superseded_by(fleet["id"]) is None
    # another rank's report of the same job comes in later: its incident joins the story
    late = report(job="train-x", host="node6", category="net.socket_error")
    assert api.post("/api/v1/reports", json=late).status_code == 201
    tick(api, T0 + 120 * S)
    again = api.get(f"/api/v1/incidents/{fleet['id']}").json()
    [later] = [
        i["id"]
        for i in api.get("/api/v1/incidents", params={"kind": "job"}).json()["items"]
        if i["id"] != own["id"]
    ]
    assert again["children"] == sorted([own["id"], later])  # each linked once
    assert api.get(f"/api/v1/incidents/{later}").json()["parents"] == [fleet["id"]]
    # the UI tells the same story: the root lists the child, the child names its root
    from tests.control.ui.test_ui_pages import login

    login(api)
    root_page = api.client.get(f"/incidents/{fleet['id']}").text
    assert f'href="/incidents/{own["id"]}"' in root_page.split('id="children"')[1]
    child_page = api.client.get(f"/incidents/{own['id']}").text
    assert f'href="/incidents/{fleet["id"]}"' in child_page.split('id="parents"')[1]
