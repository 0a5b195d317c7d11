"""The tenant's warm-spare pool kept from the control plane, against a real slurmctld and three
slurmd and the control plane serving HTTP on loopback: `denpex remediate spares add|list|
remove` asks, the leader's pass holds each spare out of service with a denpex reason and runs
its preflight (one spare fails it and goes to diagnostics), a plan's reroute takes the
validated spare (the requeued job lands on it), and a removed spare is resumed by the leader.
Another tenant sees none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from denpex.remediation.spares import Check
from tests.control.conftest import mint
from tests.control.helpers import report
from tests.control.ui.live import LiveServer
from tests.remediation.test_remediation_flow import LOOP_JOB, node
from tests.remediation.test_slurm import wait_for

CHECKS = [
    Check("dcgm_diag", ("sh", "-c", "echo diag level 1 on {host}")),
    Check("ib_ports", ("sh", "-c", "echo {host}: Active; test {host} != n2")),  # n2 fails
]


@pytest.fixture
def server(slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    live = LiveServer(
        url,
        remediation_backend="slurm",
        diagnostics_command=("sh", "-c", "echo diag {host} level {level}"),
        spare_checks=tuple(CHECKS),  # as `denpex server --spare-checks FILE` gives them
    )
    live.tokens = {r: mint(url, "acme", r) for r in ("viewer", "approver", "operator", "admin")}
    live.tokens["globex"] = mint(url, "globex", "admin")
    live.start()
    try:
        yield live
    finally:
        live.stop()
        slurm.run("scancel", "--user=root")
        for host in slurm.nodes:
            slurm.scontrol("update", f"nodename={host}", "state=resume")
        wait_for(slurm._all_idle, 60)


def cli(server: LiveServer, role: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DENPEX_SERVER_URL=server.base, DENPEX_TOKEN=server.tokens[role])
    return subprocess.run(
        [sys.executable, "-m", "denpex", "remediate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def spares(server: LiveServer, role: str = "viewer") -> dict[str, dict]:
    out = cli(server, role, "--json", "spares", "list")
    assert out.returncode == 0, out.stderr
    return {s["host"]: s for s in json.loads(out.stdout)["items"]}


@pytest.mark.slow  # a Slurm plan run to its end and two resumes: ≈ 30 s here
def test_spares_from_the_cli_are_held_checked_taken_by_reroute_and_given_back(server, slurm):
    refused = cli(server, "operator", "spares", "add", "n3", "--pool", "gpu")
    assert refused.returncode == 1 and "403" in refused.stderr
    for host in ("n2", "n3"):
        added = cli(server, "approver", "spares", "add", host, "--pool", "gpu", "--by", "alice")
        assert added.returncode == 0, added.stderr
        assert "requested" in added.stdout
    again = cli(server, "approver", "spares", "add", "n3")
    assert again.returncode == 1 and "409" in again.stderr

    def checked() -> dict[str, dict] | None:
        found = spares(server)
        return found if all(found[h]["checked_ns"] for h in ("n2", "n3")) else None

    held = wait_for(checked, 30)
    assert held["n3"]["status"] == "validated" and held["n3"]["preflight"]["passed"] is True
    assert held["n2"]["status"] == "failed" and held["n2"]["preflight"]["passed"] is False
    assert [c["check"] for c in held["n2"]["results"]][-1] == "diagnostics"
    assert "denpex: warm spare" in node(slurm, "n3")
    assert "denpex: spare failed preflight" in node(slurm, "n2")
    listed = cli(server, "viewer", "spares", "list")
    assert "n3" in listed.stdout and "validated" in listed.stdout
    assert "failed: ib_ports" in listed.stdout
    other = cli(server, "globex", "--json", "spares", "list")
    assert other.returncode == 0 and '"items": []' in other.stdout.replace("\n", "")

    # a job on n1 (the only node in service) fails; AutoRemediate reroutes it onto n3
    headers = {"Authorization": f"Bearer {server.tokens['admin']}"}
    policy = {"categories": {"gpu.fallen_off_bus": "autoremediate"}}
    put = httpx.put(f"{server.base}/api/v1/remediation/policy", json=policy, headers=headers)
    assert put.status_code == 200, put.text
    job = slurm.sbatch(LOOP_JOB, "--requeue", "--comment=denpex:checkpoint")
    running = wait_for(
        lambda: slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip()
    )
    assert running == "n1"
    body = report(host="n1", job=job)
    body["diagnosis"]["actions"] = [{"action": "drain_node", "target": "n1", "reason": "Xid 79"}]
    assert (
        httpx.post(f"{server.base}/api/v1/reports", json=body, headers=headers).status_code == 201
    )

    def finished() -> dict | None:
        items = httpx.get(f"{server.base}/api/v1/remediation/plans", headers=headers).json()
        done = [p for p in items["items"] if p["status"] in ("done", "failed")]
        return done[0] if done else None

    plan = wait_for(finished, 90)
    assert plan["status"] == "done", plan
    full = httpx.get(f"{server.base}/api/v1/remediation/plans/{plan['id']}", headers=headers)
    [reroute] = [
        s for s in full.json()["steps"] if s["state"] == "reroute" and s["phase"] == "finished"
    ]
    assert reroute["result"]["spare"]["host"] == "n3"
    assert spares(server)["n3"]["status"] == "taken"
    moved = wait_for(
        lambda: slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip(),
        60,
    )
    assert moved == "n3"  # the requeued job landed on the spare

    # n2 is given back: the leader resumes it and drops it from the pool
    removed = cli(server, "approver", "spares", "remove", "n2", "--by", "alice")
    assert removed.returncode == 0 and "removing" in removed.stdout
    wait_for(lambda: "n2" not in spares(server), 30)
    assert node(slurm, "n2").startswith("idle")
    missing = cli(server, "approver", "spares", "remove", "n2")
    assert missing.returncode == 1 and "404" in missing.stderr
