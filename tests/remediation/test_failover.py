"""kill -9 of the leader mid-plan: two real `denpex server` replicas on PostgreSQL drive a
real Slurm cluster; the leader dies during the diagnostics step, the other takes over and
continues from the last recorded step: no step before it runs twice, the interrupted
(idempotent) diagnostics runs again under the new epoch, and the plan ends with the host back
in service. The CLI is driven as a person would (`denpex remediate ...`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from denpex.control import audit_log
from denpex.control.db import Database
from denpex.core import audit
from tests.control.conftest import ServerProcess, mint
from tests.control.helpers import report
from tests.remediation.test_remediation_flow import LOOP_JOB
from tests.remediation.test_slurm import wait_for


def call(server: ServerProcess, token: str, method: str, path: str, body=None) -> dict:
    request = urllib.request.Request(
        server.base + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def remediate(server: ServerProcess, token: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "denpex",
            "remediate",
            "--server",
            server.base,
            "--token",
            token,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_kill_the_leader_mid_plan(slurm, pg_url, tmp_path, server_processes, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    lease = 3.0
    admin, operator = mint(pg_url, "acme", "admin"), mint(pg_url, "acme", "operator")
    extra = (
        "--lease",
        str(lease),
        "--remediation-backend",
        "slurm",
        "--diagnostics-command",
        "sh -c 'sleep 6; echo diag {host} level {level}'",
    )
    replicas = [ServerProcess(pg_url, tmp_path / f"s{i}.log", *extra) for i in (0, 1)]
    server_processes.extend(replicas)
    for replica in replicas:
        replica.start()
    leader = wait_for(lambda: next((r for r in replicas if r.health()["leader"]), None), 15)
    other = replicas[1 - replicas.index(leader)]
    call(other, admin, "PUT", "/api/v1/remediation/policy", {"tier": "approve"})

    job = slurm.sbatch(LOOP_JOB, "--requeue", "--comment=denpex:checkpoint")
    host = wait_for(
        lambda: slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip()
    )
    body = report(host=host, job=job)
    body["diagnosis"]["actions"] = [{"action": "drain_node", "target": host, "reason": "Xid 79"}]
    call(other, operator, "POST", "/api/v1/reports", body)

    plan = wait_for(lambda: call(other, operator, "GET", "/api/v1/remediation/plans")["items"])[0]
    dry = remediate(other, operator, "dry-run", str(plan["incident"]))
    assert dry.returncode == 0 and "cordon       wait" in dry.stdout, dry.stdout
    # approve each step as it comes up until the diagnostics step starts
    while True:
        current = call(other, operator, "GET", f"/api/v1/remediation/plans/{plan['id']}")
        started = [s["state"] for s in current["steps"] if s["phase"] == "started"]
        if started and started[-1] == "diagnostics":
            break
        if current["status"] == "waiting":
            done = remediate(other, operator, "approve", str(plan["id"]), "--by", "alice")
            assert done.returncode == 0, done.stderr
        time.sleep(0.2)
    first_epoch = leader.health()["epoch"]
    leader.kill(signal.SIGKILL)  # mid-diagnostics: started, never finished
    wait_for(lambda: other.health()["leader"], lease + 5)
    assert other.health()["epoch"] > first_epoch

    def finished() -> dict | None:
        p = call(other, operator, "GET", f"/api/v1/remediation/plans/{plan['id']}")
        if p["status"] == "waiting":
            remediate(other, operator, "approve", str(plan["id"]), "--by", "alice")
        return p if p["status"] in ("done", "failed", "held") else None

    final = wait_for(finished, 90)
    assert final["status"] == "done", final
    started = [(s["state"], s["epoch"]) for s in final["steps"] if s["phase"] == "started"]
    names = [name for name, _ in started]
    for once in ("cordon", "drain", "checkpoint", "evict", "reroute", "resume"):
        assert names.count(once) == 1, names
    diagnostics = [epoch for name, epoch in started if name == "diagnostics"]
    assert len(diagnostics) == 2 and diagnostics[0] < diagnostics[1]  # re-run by the new leader
    status = remediate(other, operator, "status", str(plan["id"]))
    assert "diagnostics" in status.stdout and "alice" in status.stdout, status.stdout
    assert slurm.run("sinfo", "-h", "-n", host, "-o", "%T").stdout.strip() == "idle"

    db = Database(pg_url)
    try:
        lines = list(audit_log.export_lines(db))
    finally:
        db.dispose()
    head = audit.head_of(audit.loads_record(lines[-1]))
    assert audit.verify_lines([*lines, audit.anchor_line(head, None)]).ok
    slurm.run("scancel", job)
