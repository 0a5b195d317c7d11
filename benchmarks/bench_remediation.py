"""Remediation drills on a real Slurm cluster (slurmctld + three slurmd on loopback, as the
tests start it) and a real `denpex server` process:
  detect -> cordon: a failed job report POSTed to the server -> incident -> plan (AutoSafe) ->
    the node drained in Slurm, as `sinfo` reads it (target: <= 60 s; EKS waits 10 minutes);
  pre-stop checkpoint: a torch CPU job under dx.watch(prestop_path=...) signalled by the Slurm
    backend's checkpoint step, 20 drills with a 120 s budget (target: >= 95 % complete).
Prints JSON. Needs Debian's slurmctld, slurmd, slurm-client, munge and torch.
Usage: python benchmarks/bench_remediation.py [--cordon-drills N] [--checkpoint-drills N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from denpex.remediation.backend import Target, TargetKind  # noqa: E402
from denpex.remediation.slurm import SlurmBackend  # noqa: E402
from tests.control.conftest import ServerProcess, mint  # noqa: E402
from tests.control.helpers import report  # noqa: E402
from tests.remediation.slurm_cluster import SlurmCluster  # noqa: E402

TRAIN = ROOT / "tests" / "remediation" / "prestop_train.py"


def wait(check, timeout: float, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError("drill did not finish")


def http(server: ServerProcess, token: str, method: str, path: str, body=None) -> dict:
    request = urllib.request.Request(
        server.base + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def running_on(cluster: SlurmCluster, job: str) -> str:
    return cluster.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip()


def cordon_drills(cluster: SlurmCluster, work: Path, n: int) -> list[float]:
    db = f"sqlite:///{work / 'cp.db'}"
    server = ServerProcess(
        db,
        work / "server.log",
        "--remediation-backend",
        "slurm",
        "--diagnostics-command",
        "sh -c 'exit 0'",
    ).start()
    admin, operator = mint(db, "acme", "admin"), mint(db, "acme", "operator")
    # AutoSafe; the blast radius opened wide so that drills on the same pool are not held
    policy = {
        "tier": "autosafe",
        "guards": {
            "blast_radius": {"max_nodes": 100, "max_percent": 100, "window_s": 1},
            "unhealthy_stop_percent": 101,
        },
    }
    http(server, admin, "PUT", "/api/v1/remediation/policy", policy)
    seconds = []
    try:
        for _ in range(n):
            job = cluster.sbatch("#!/bin/sh\nwhile true; do sleep 1; done\n", "--requeue")
            host = wait(lambda job=job: running_on(cluster, job), 60)
            body = report(host=host, job=job)
            body["diagnosis"]["actions"] = [{"action": "drain_node", "target": host}]
            t0 = time.monotonic()
            http(server, operator, "POST", "/api/v1/reports", body)
            wait(
                lambda host=host: (
                    "drain" in cluster.run("sinfo", "-h", "-n", host, "-o", "%T").stdout
                ),
                120,
            )
            seconds.append(time.monotonic() - t0)
            cluster.run("scancel", job)
            cluster.scontrol("update", f"nodename={host}", "state=resume")
            wait(cluster._all_idle, 60, 0.3)
    finally:
        server.stop()
    return seconds


def checkpoint_drills(cluster: SlurmCluster, work: Path, n: int, budget: float) -> list[dict]:
    ckpt = work / "job.pt"
    job = cluster.sbatch(f"#!/bin/sh\nexec {sys.executable} {TRAIN} {ckpt}\n", "--requeue")
    host = wait(lambda: running_on(cluster, job), 60)
    wait(lambda: "denpex:checkpoint" in cluster.scontrol("show", "job", job).stdout, 120)
    backend = SlurmBackend(env=cluster.env)
    results = []
    try:
        for _ in range(n):
            done = backend.checkpoint(Target(TargetKind.HOST, host), budget_s=budget)
            results.append({"ok": done.ok, "seconds": done.record["seconds"]})
    finally:
        cluster.run("scancel", job)
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cordon-drills", type=int, default=5)
    parser.add_argument("--checkpoint-drills", type=int, default=20)
    parser.add_argument("--budget", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="denpex-drill-") as tmp:
        work = Path(tmp)
        (work / "slurm").mkdir()
        cluster = SlurmCluster(work / "slurm").start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            cordon = cordon_drills(cluster, work, args.cordon_drills)
            checkpoints = checkpoint_drills(cluster, work, args.checkpoint_drills, args.budget)
        finally:
            cluster.stop()
    complete = [c for c in checkpoints if c["ok"] and c["seconds"] <= args.budget]
    result = {
        "detect_to_cordon_s": {
            "drills": len(cordon),
            "median": round(statistics.median(cordon), 2),
            "max": round(max(cordon), 2),
            "target_s": 60,
            "max_vs_target": round(max(cordon) / 60, 3),
        },
        "prestop_checkpoint": {
            "drills": len(checkpoints),
            "complete_within_budget": len(complete),
            "share": len(complete) / len(checkpoints),
            "median_s": round(statistics.median(c["seconds"] for c in checkpoints), 3),
            "max_s": round(max(c["seconds"] for c in checkpoints), 3),
            "budget_s": args.budget,
            "target_share": 0.95,
        },
    }
    print(json.dumps(result, indent=2))
    ok = max(cordon) <= 60 and result["prestop_checkpoint"]["share"] >= 0.95
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
