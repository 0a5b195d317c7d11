"""`denpex run` and `denpex scan` ship their report when DENPEX_SERVER_URL is set: a dead
server never delays the job's exit, and the report arrives once the server is back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from denpex.control.client import ReportShipper, job_fields
from denpex.control.db import Database
from tests.control.conftest import ServerProcess, mint
from tests.control.pg import free_port

JOB = "echo 'RuntimeError: CUDA error: an illegal memory access was encountered'; exit 3"


def reports(url: str, tenant: str) -> list[tuple]:
    db = Database(url)
    try:
        with db.tenant_tx(tenant) as conn:
            return list(conn.execute(sa.text("SELECT job, status, diagnosis FROM reports")))
    finally:
        db.dispose()


def run_job(env: dict) -> tuple[int, float, str]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "denpex", "run", "--no-pty", "--", "sh", "-c", JOB],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, time.monotonic() - start, done.stderr


def test_job_fields_from_the_scheduler_environment():
    diagnosis = {"timeline": [{"host": "n7", "rank": 3}, {"host": None, "rank": None}]}
    fields = job_fields(diagnosis, {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"})
    assert fields["job"] == "42"
    assert fields["scheduler"] == {"slurm_job_id": "42", "slurm_step_id": "0"}
    assert "n7" in fields["hosts"] and fields["ranks"] == [3]
    assert job_fields({}, {"DENPEX_JOB": "mine", "SLURM_JOB_ID": "42"})["job"] == "mine"


def test_a_refused_connection_queues_at_once(tmp_path):
    shipper = ReportShipper(f"http://127.0.0.1:{free_port()}", "t", outbox=tmp_path / "out")
    start = time.monotonic()
    result = shipper.ship({"schema": "denpex.diagnosis/v1"})
    assert time.monotonic() - start < 1.0
    assert result.delivered == 0 and result.pending == 1
    assert "cannot reach" in result.message


@pytest.mark.slow
def test_run_with_a_dead_server_then_the_report_arrives(tmp_path, server_processes):
    url = f"sqlite:///{tmp_path / 'control.db'}"
    token = mint(url, "red", "operator")
    port = free_port()
    env = {
        **os.environ,
        "DENPEX_AGENT_URL": "off",
        "DENPEX_OUTBOX": str(tmp_path / "outbox"),
        "DENPEX_TOKEN": token,
        "DENPEX_JOB": "job-dead",
    }
    code, baseline_s, _ = run_job(env)  # no DENPEX_SERVER_URL: the time a run takes anyway
    assert code == 3
    env["DENPEX_SERVER_URL"] = f"http://127.0.0.1:{port}"
    # a shipper that waited for the dead server would take its whole 10 s timeout; one that
    # queues at once stays near the baseline (a wide margin: these cores are shared)
    env["DENPEX_SERVER_TIMEOUT"] = "10"
    code, took_s, stderr = run_job(env)
    assert code == 3  # the job's own status
    assert took_s < baseline_s + 5.0, (took_s, baseline_s)
    assert "wait in" in stderr and "they go with the next report" in stderr
    assert len(list((tmp_path / "outbox").glob("*.json"))) == 1

    server = ServerProcess(url, tmp_path / "server.log", port=port).start()
    server_processes.append(server)
    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\nValueError: bad shard\n")
    env["DENPEX_JOB"] = "job-scan"
    scanned = subprocess.run(
        [sys.executable, "-m", "denpex", "scan", "--quiet", str(log)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert scanned.returncode == 1, scanned.stderr
    got = {job: status for job, status, _ in reports(url, "red")}
    assert got == {"job-dead": "failed", "job-scan": "failed"}
    assert list((tmp_path / "outbox").glob("*.json")) == []
