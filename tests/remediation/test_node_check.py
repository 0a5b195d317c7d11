"""The bundle's node hooks through the remediation engine, against a real slurmctld and three
slurmd: a critical finding cordons the node only when the policy's tier allows it, a guard
holds it when the pool already has its share out, and every decision is in a local audit
file that `denpex.core.audit` verifies; the HealthCheckProgram script drives the same path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from denpex.core import audit
from denpex.remediation import node_check
from denpex.remediation.backend import Target, TargetKind
from denpex.remediation.policy import default_policy, parse_policy
from denpex.remediation.slurm import SlurmBackend

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "dist_scripts" / "bundle" / "slurm" / "healthcheck.sh"
REPORT = {
    "host": "n1",
    "evidence": [
        {"body": "NVRM: Xid 79", "category": "gpu.fallen_off_bus", "severity": "critical"}
    ],
}
AUTOSAFE = {"tier": "observe", "categories": {"gpu.fallen_off_bus": "autosafe"}}


def reason(slurm, host: str) -> str:
    return slurm.run("sinfo", "-h", "-N", "-n", host, "-o", "%E").stdout.strip()


def kinds(path: Path) -> list[str]:
    lines = path.read_bytes().splitlines()
    verdict = audit.verify_lines(lines, require_anchor=False)
    assert verdict.ok, verdict.describe()
    return [audit.loads_record(line)["kind"] for line in lines]


def resume(backend, host):
    backend.resume(Target(TargetKind.HOST, host), reason="test cleanup", timeout_s=30)


def test_observe_records_autosafe_cordons_and_the_audit_verifies(slurm, tmp_path):
    backend = SlurmBackend(env=slurm.env)
    log = tmp_path / "audit.jsonl"
    healthy = node_check.run(
        {"evidence": []}, host="n1", backend=backend, policy=default_policy(), audit_path=log
    )
    assert healthy == {"healthy": True} and not log.exists()
    observed = node_check.run(
        REPORT, host="n1", backend=backend, policy=default_policy(), audit_path=log
    )
    assert observed["tier"] == "observe" and observed["status"] == "observed"
    assert reason(slurm, "n1") == "none"  # nothing done
    acted = node_check.run(
        REPORT, host="n1", backend=backend, policy=parse_policy(AUTOSAFE), audit_path=log
    )
    assert acted["cordoned"] and acted["tier"] == "autosafe"
    assert reason(slurm, "n1") == "denpex: gpu.fallen_off_bus"
    assert kinds(log) == ["plan.proposed", "plan.proposed", "step.started", "step.finished"]
    resume(backend, "n1")


def test_a_guard_holds_the_cordon_when_the_pool_has_its_share_out(slurm, tmp_path):
    backend = SlurmBackend(env=slurm.env)
    backend.cordon(Target(TargetKind.HOST, "n2"), reason="denpex: earlier", timeout_s=30)
    log = tmp_path / "audit.jsonl"
    held = node_check.run(
        REPORT, host="n1", backend=backend, policy=parse_policy(AUTOSAFE), audit_path=log
    )
    assert not held["cordoned"] and held["status"] == "active"
    assert reason(slurm, "n1") == "none"
    assert kinds(log)[-1] == "plan.held"
    resume(backend, "n2")


def test_the_healthcheck_script_goes_through_the_engine(slurm, tmp_path):
    report = tmp_path / "r.json"
    report.write_text(json.dumps(REPORT, indent=2))  # pretty, as `agent --once --json` prints
    policy = tmp_path / "remediation.yaml"
    policy.write_text(yaml.safe_dump(AUTOSAFE))
    log = tmp_path / "node-audit.jsonl"
    env = {
        **os.environ,
        **slurm.env,
        "SLURMD_NODENAME": "n1",
        "DENPEX": str(Path(sys.executable).with_name("denpex")),
        "DENPEX_REMEDIATION_POLICY": str(policy),
        "DENPEX_NODE_AUDIT": str(log),
    }
    dry = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--input", str(report)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert dry.returncode == 1, dry.stderr
    assert "n1 gpu.fallen_off_bus under tier autosafe: cordon: run" in dry.stderr
    assert reason(slurm, "n1") == "none" and not log.exists()
    done = subprocess.run(
        ["bash", str(SCRIPT), "--input", str(report)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    assert "tier autosafe: done (cordoned)" in done.stderr
    assert reason(slurm, "n1") == "denpex: gpu.fallen_off_bus"
    assert kinds(log)[-1] == "step.finished"
    resume(SlurmBackend(env=slurm.env), "n1")
