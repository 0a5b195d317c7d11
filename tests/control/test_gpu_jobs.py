"""A GPU's job history: reports naming a GPU (by serial or UUID) are listed under
`/api/v1/gpus/{gpu}/jobs` and `/api/v1/jobs?gpu=`, whichever host the board sat in, and
never for another tenant; `denpex run`'s shipper puts the run's facts into its report, the
boards' NVML serials among them."""

from __future__ import annotations

from denpex.control.client import ReportShipper
from denpex.core import jsonio
from denpex.core.roots import Roots
from denpex.lite.job_processes import JobProcesses
from denpex.lite.run_facts import run_facts
from tests.control.helpers import T0, report
from tests.control.pg import free_port
from tests.lite.test_run_facts import fake_proc

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


def test_a_runs_gpus_are_found_by_the_serial_nvml_gave(api, tmp_path):
    roots = Roots(procfs=str(fake_proc(tmp_path)))
    job = JobProcesses(roots, 100)
    job.poll()
    boards = {"00000000:3B:00.0": {"serial": SERIAL}}  # BoardLookup's answer for rank 0's GPU
    facts = run_facts(roots=roots, env={}, host="node7", started_ns=1, processes=job, boards=boards)
    body = {**report(job="run-with-serials", host="node7"), "gpus": facts["gpus"]}
    assert api.post("/api/v1/reports", json=body).status_code == 201
    assert [j["id"] for j in api.get(f"/api/v1/gpus/{SERIAL}/jobs").json()["items"]] == [body["id"]]
    stored = api.get(f"/api/v1/reports/{body['id']}").json()["gpus"]
    assert [(g["rank"], g.get("serial")) for g in stored] == [(0, SERIAL), (1, None)]
