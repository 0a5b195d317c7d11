"""The REST API and the ingest endpoints, the same suite on SQLite and on PostgreSQL."""

from __future__ import annotations

import gzip

import orjson
import pytest

from tests.control.helpers import T0, evidence, logs_body, metrics_body, report

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def stored_ids(api, **params) -> list[str]:
    ids, cursor = [], None
    while True:
        query = {**params, "limit": 1000, **({"cursor": cursor} if cursor else {})}
        page = api.get("/api/v1/evidence", params=query).json()
        ids += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_otlp_logs_are_stored_once_per_event_id(api, protocol):
    items = evidence(20)
    headers = PROTOBUF if protocol == "http/protobuf" else JSON
    first = api.post("/v1/logs", content=logs_body(items, protocol), headers=headers)
    assert first.status_code == 200, first.text
    again = api.post("/v1/logs", content=logs_body(items[5:], protocol), headers=headers)
    assert again.status_code == 200
    assert sorted(stored_ids(api)) == sorted(e.id for e in items)
    one = api.get(f"/api/v1/evidence/{items[3].id}").json()
    assert one["host"] == "node1" and one["rank"] == 3 and one["pid"] == 1003
    assert one["category"] == "gpu.fallen_off_bus" and one["severity"] == "critical"
    assert one["source"] == "kmsg" and one["action"] == "drain_node"
    assert one["captures"] == {"pci": "0000:3b:00"}
    assert one["attrs"]["attribution"] == "host"
    assert one["ts_ns"] == T0 + 3_000_000
    metrics = api.client.get("/metrics").text
    assert 'denpex_server_duplicate_records_total{kind="evidence",tenant="acme"} 15.0' in metrics


def test_gzip_body_and_metrics(api):
    body = gzip.compress(logs_body(evidence(3)))
    reply = api.post("/v1/logs", content=body, headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert reply.status_code == 200
    assert api.post("/v1/metrics", content=metrics_body(), headers=PROTOBUF).status_code == 200
    host = api.get("/api/v1/hosts/node1").json()
    assert [(m["name"], m["value"]) for m in host["metrics"]] == [
        ("denpex_psi_some_avg10_ratio", 0.25)
    ]


@pytest.mark.parametrize(
    "body,headers,status,words",
    [
        (b"\xff\xff\xff not protobuf", PROTOBUF, 400, "OTLP protobuf"),
        (b"{not json", JSON, 400, "OTLP JSON"),
        (b"x", {"Content-Type": "text/plain"}, 415, "Content-Type"),
        (b"x", {**PROTOBUF, "Content-Encoding": "gzip"}, 400, "gzip"),
        (b"x", {**PROTOBUF, "Content-Encoding": "br"}, 415, "Content-Encoding"),
    ],
)
def test_malformed_otlp_is_refused_with_a_4xx(api, body, headers, status, words):
    reply = api.post("/v1/logs", content=body, headers=headers)
    assert reply.status_code == status
    assert words in reply.json()["error"]["message"]


def test_a_bad_record_refuses_the_whole_batch(api):
    items = evidence(5)
    items[4].event.attrs["x"] = 1
    request_body = orjson.loads(logs_body(items, "http/json"))
    record = request_body["resourceLogs"][0]["scopeLogs"][0]["logRecords"][4]
    for attr in record["attributes"]:
        if attr["key"] == "denpex.rank":
            attr["value"] = {"stringValue": "three"}
    reply = api.post("/v1/logs", content=orjson.dumps(request_body), headers=JSON)
    assert reply.status_code == 400 and "denpex.rank" in reply.json()["error"]["message"]
    assert stored_ids(api) == []


def test_another_tenants_resource_is_refused(api):
    items = evidence(2)
    for item in items:
        item.event.tenant = "other"
    reply = api.post("/v1/logs", content=logs_body(items), headers=PROTOBUF)
    assert reply.status_code == 403
    assert stored_ids(api) == []


def job_incidents(api, **params) -> list[dict]:
    """The per-job incidents (the fleet rules' own are tested in test_fleet_incidents)."""
    items = api.get("/api/v1/incidents", params=params).json()["items"]
    return [i for i in items if i["component"]["kind"] == "job"]


def test_report_becomes_an_incident_with_its_lifecycle(api):
    body = report(job="job-7", user="bob")
    first = api.post("/api/v1/reports", json=body)
    assert first.status_code == 201 and first.json()["stored"] is True
    again = api.post("/api/v1/reports", json=body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    api.post("/api/v1/reports", json=report(job="job-8", status="ok"))
    api.tick()
    incidents = job_incidents(api)
    assert len(incidents) == 1  # the ok report opens none
    incident = api.get(f"/api/v1/incidents/{incidents[0]['id']}").json()
    assert incident["rule"] == "job_root_cause" and incident["status"] == "open"
    assert incident["category"] == "gpu.fallen_off_bus"
    assert incident["jobs"] == ["job-7"] and incident["reports"] == [body["id"]]
    assert sorted(incident["evidence"]) == [f"{body['id']}/e1", f"{body['id']}/e2"]
    assert sorted(incident["hosts"]) == ["node0", "node1"]
    cause = api.get(f"/api/v1/evidence/{body['id']}/e2").json()
    assert cause["host"] == "node1" and cause["rank"] == 3 and cause["job"] == "job-7"
    api.tick()  # a second pass opens nothing new
    assert len(job_incidents(api)) == 1

    path = f"/api/v1/incidents/{incident['id']}"
    assert api.post(path + "/acknowledge", role="viewer").status_code == 403
    acked = api.post(path + "/acknowledge").json()
    assert acked["status"] == "acknowledged"
    assert acked["acknowledged"]["by"].startswith("token:") and acked["acknowledged"]["ns"]
    assert api.post(path + "/acknowledge").status_code == 409
    resolved = api.post(path + "/resolve").json()
    assert resolved["status"] == "resolved" and resolved["resolved"]["ns"]
    assert job_incidents(api, status="open") == []
    listed = job_incidents(api, status="resolved", host="node1")
    assert [i["id"] for i in listed] == [incident["id"]]
    assert api.get("/api/v1/incidents", params={"job": "job-8"}).json()["items"] == []


def test_jobs_search_and_host_history(api):
    api.post("/api/v1/reports", json=report(job="j1", user="alice", host="node1"))
    api.post(
        "/api/v1/reports",
        json=report(job="j2", user="bob", host="node2", category="host.oom_killed"),
    )
    api.post("/v1/logs", content=logs_body(evidence(3, host="node2")), headers=PROTOBUF)
    api.tick()

    def jobs(**params):
        return sorted(i["job"] for i in api.get("/api/v1/jobs", params=params).json()["items"])

    assert jobs() == ["j1", "j2"]
    assert jobs(job="j1") == ["j1"]
    assert jobs(user="bob") == ["j2"]
    assert jobs(category="host.oom_killed") == ["j2"]
    assert jobs(host="node1") == ["j1"]
    assert jobs(host="node0") == ["j1", "j2"]
    assert jobs(status="ok") == []
    job = api.get("/api/v1/jobs/j2").json()
    assert job["reports"][0]["diagnosis"]["schema"] == "denpex.diagnosis/v1"
    assert job["reports"][0]["scheduler"] == {"slurm_job_id": "4242"}
    hosts = [h["name"] for h in api.get("/api/v1/hosts").json()["items"]]
    assert hosts == ["node0", "node1", "node2"]
    history = api.get("/api/v1/hosts/node2").json()
    assert {e["id"] for e in history["evidence"]} >= {"ev-node2-0", "ev-node2-2"}
    assert [j["job"] for j in history["jobs"]] == ["j2"]
    # j2's own incident, and the GPU the agent saw fall off the bus (the fleet rules)
    assert sorted(i["component"]["id"] for i in history["incidents"]) == ["j2", "node2/0000:3b:00"]
    windowed = api.get(
        "/api/v1/hosts/node2", params={"since": T0 + 1_000_000, "until": T0 + 2_000_000}
    ).json()
    assert [e["id"] for e in windowed["evidence"]] == ["ev-node2-1"]
    assert api.get("/api/v1/hosts/nowhere").status_code == 404
    assert api.get("/api/v1/jobs/nothing").status_code == 404


def test_pagination_filters_and_etags(api):
    api.post("/v1/logs", content=logs_body(evidence(25, host="a")), headers=PROTOBUF)
    api.post("/v1/logs", content=logs_body(evidence(5, host="b")), headers=PROTOBUF)
    pages, cursor = [], None
    while True:
        params = {"host": "a", "limit": 10, **({"cursor": cursor} if cursor else {})}
        page = api.get("/api/v1/evidence", params=params).json()
        pages.append([i["id"] for i in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    flat = [i for p in pages for i in p]
    assert len(set(flat)) == 25 and all(i.startswith("ev-a-") for i in flat)
    assert flat[0] == "ev-a-24"  # newest first
    since = api.get("/api/v1/evidence", params={"since": T0 + 20_000_000}).json()["items"]
    assert sorted(i["id"] for i in since) == [f"ev-a-{n}" for n in range(20, 25)]
    assert api.get("/api/v1/evidence", params={"category": "nope"}).json()["items"] == []
    assert api.get("/api/v1/evidence", params={"cursor": "garbage"}).status_code == 400
    assert api.get("/api/v1/evidence", params={"limit": 0}).status_code == 400
    assert api.get("/api/v1/evidence", params={"since": "yesterday"}).status_code == 400

    first = api.get("/api/v1/hosts")
    etag = first.headers["ETag"]
    cached = api.client.get(
        "/api/v1/hosts", headers={**api.headers(role="viewer"), "If-None-Match": etag}
    )
    assert cached.status_code == 304 and cached.content == b""
    api.post("/v1/logs", content=logs_body(evidence(1, host="c")), headers=PROTOBUF)
    changed = api.client.get(
        "/api/v1/hosts", headers={**api.headers(role="viewer"), "If-None-Match": etag}
    )
    assert changed.status_code == 200 and changed.headers["ETag"] != etag


@pytest.mark.parametrize(
    "body,words",
    [
        (b"[1]", "JSON object"),
        (b"{", "not JSON"),
        (b'{"job": "x"}', "'id'"),
        (b'{"id": "r", "diagnosis": {"schema": "other"}}', "schema"),
        (b'{"id": "r", "bogus": 1}', "unknown report field"),
        (b'{"id": "r", "ranks": ["a"], "diagnosis": {}}', "ranks"),
    ],
)
def test_malformed_reports_are_refused(api, body, words):
    reply = api.post("/api/v1/reports", content=body, headers=JSON)
    assert reply.status_code == 400 and words in reply.json()["error"]["message"]
    assert api.get("/api/v1/jobs").json()["items"] == []


def test_a_report_with_a_bad_timeline_entry_stores_nothing(api):
    body = report()
    body["diagnosis"]["timeline"][1]["ts"] = "not a time"
    assert api.post("/api/v1/reports", json=body).status_code == 400
    assert api.get("/api/v1/jobs").json()["items"] == []
    assert stored_ids(api) == []


def test_authentication_and_roles(api):
    assert api.client.get("/api/v1/incidents").status_code == 401
    bad = {"Authorization": "Bearer dpx_0000000000000000_" + "A" * 43}
    assert api.client.get("/api/v1/incidents", headers=bad).status_code == 401
    assert (
        api.client.get("/api/v1/incidents", headers={"Authorization": "Basic x"}).status_code == 401
    )
    viewer = api.headers(role="viewer")
    assert api.client.get("/api/v1/incidents", headers=viewer).status_code == 200
    denied = api.client.post(
        "/v1/logs", content=logs_body(evidence(1)), headers={**viewer, **PROTOBUF}
    )
    assert denied.status_code == 403
    token_id = api.token(role="viewer").split("_")[1]
    assert api.runtime.store.revoke_token(token_id, 1)
    assert api.client.get("/api/v1/incidents", headers=viewer).status_code == 401
    assert api.client.get("/healthz").json()["status"] == "ok"


def test_openapi_and_self_metrics(api):
    spec = api.client.get("/openapi.json").json()
    for path in (
        "/v1/logs",
        "/v1/metrics",
        "/api/v1/reports",
        "/api/v1/incidents",
        "/api/v1/incidents/{incident_id}/acknowledge",
        "/api/v1/hosts/{host}",
        "/api/v1/jobs",
        "/api/v1/evidence/{evidence_id}",
    ):
        assert path in spec["paths"], path
    api.get("/api/v1/incidents")
    text = api.client.get("/metrics").text
    assert 'denpex_server_requests_total{route="/api/v1/incidents",status="200"}' in text
    assert "denpex_server_leader " in text


def test_quota_refuses_with_retry_after(db_url):
    from denpex.control.quotas import QuotaPolicy
    from tests.control.conftest import Api

    api = Api(db_url, quotas=QuotaPolicy(records_per_s=1.0, burst=10.0))
    try:
        assert (
            api.post("/v1/logs", content=logs_body(evidence(8)), headers=PROTOBUF).status_code
            == 200
        )
        over = api.post("/v1/logs", content=logs_body(evidence(8, prefix="more")), headers=PROTOBUF)
        assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1
        assert len(stored_ids(api)) == 8
    finally:
        api.close()
