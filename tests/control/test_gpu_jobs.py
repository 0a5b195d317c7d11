"""A GPU's job history: reports naming a GPU (by serial or UUID) are listed under
`/api/v1/gpus/{gpu}/jobs` and `/api/v1/jobs?gpu=`, whichever host the board sat in, and
never for another tenant; `denpex run`'s shipper puts the run's facts into its report."""

from __future__ import annotations

from denpex.control.client import ReportShipper
from denpex.core import jsonio
from tests.control.helpers import T0, report
from tests.control.pg import free_port

SERIAL, UUID = "1652923012345", "GPU-5f0e3a1c-92d4-4e56-8d2f-3a7c1b2e9d40"


def test_a_boards_jobs_follow_it_across_hosts(api):
    moved = []
    for n, host in enumerate(("node1", "node2")):  # the board was moved to node2
        body = report(job=f"train-{n}", host=host, ended_ns=T0 + n * 1_000_000_000)
        body["gpus"] = [
            {"host": host, "pci": "0000:3b:00", "serial": SERIAL, "uuid": UUID, "rank": 0}
        ]
        assert api.post("/api/v1/reports", json=body).status_code == 201
        moved.append(body["id"])
    other = report(job="elsewhere")
    other["gpus"] = [{"host": "node3", "serial": "9999", "rank": 0}]
    assert api.post("/api/v1/reports", json=other).status_code == 201
    assert (
        api.post(
            "/api/v1/reports", json={**other, "id": "x", "gpus": [{"host": "n", "uuid": 7}]}
        ).status_code
        == 400
    )

    for gpu in (SERIAL, UUID):
        reply = api.get(f"/api/v1/gpus/{gpu}/jobs")
        assert reply.status_code == 200
        assert [j["id"] for j in reply.json()["items"]] == moved[::-1]  # newest first
    assert [
        j["id"] for j in api.get("/api/v1/jobs", params={"gpu": SERIAL}).json()["items"]
    ] == moved[::-1]
    page = api.get(f"/api/v1/gpus/{SERIAL}/jobs", params={"limit": 1}).json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    stored = api.get(f"/api/v1/reports/{moved[0]}").json()
    assert stored["gpus"][0]["uuid"] == UUID
    assert api.get(f"/api/v1/gpus/{SERIAL}/jobs", tenant="other").json()["items"] == []


def test_the_shipper_adds_the_runs_facts(tmp_path):
    outbox = tmp_path / "out"
    shipper = ReportShipper(f"http://127.0.0.1:{free_port()}", "t", outbox=outbox)
    facts = {
        "started_ns": 5,
        "name": "llama",
        "gpus": [{"host": "h", "uuid": UUID}],
        "labels": {"driver": "550.54.15"},
        "unknown": "dropped",
    }
    shipper.ship({"schema": "denpex.diagnosis/v1"}, facts)
    [queued] = list(outbox.glob("*.json"))
    sent = jsonio.loads(queued.read_bytes())
    assert sent["started_ns"] == 5 and sent["name"] == "llama"
    assert sent["gpus"] == facts["gpus"] and sent["labels"] == facts["labels"]
    assert "unknown" not in sent
