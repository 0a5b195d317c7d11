"""Warm spares against a real slurmctld and three slurmd: spares are held out with a denpex
reason, validated by a preflight that includes a real gloo all-reduce across one process per
spare (as `srun --nodelist SPARES --ntasks-per-node 1` starts it), a spare that fails goes to
diagnostics and stays out, and a plan's reroute takes a validated spare (checked again and
resumed before the job lands)."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from denpex.remediation.backend import Target, TargetKind
from denpex.remediation.executor import ACTIVE, Executor, PlanRecord
from denpex.remediation.machine import State, plan_steps
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Tier, parse_policy
from denpex.remediation.slurm import SlurmBackend
from denpex.remediation.spares import FAILED, TAKEN, VALIDATED, Check, SparePool
from tests.remediation.test_executor import MemoryLog

# one probe per spare host, as srun would start them; fails when any rank fails
LAUNCH = """
import os, subprocess, sys
hosts = sys.argv[1].split(",")
env = dict(os.environ, WORLD_SIZE=str(len(hosts)), MASTER_ADDR="127.0.0.1",
           MASTER_PORT=sys.argv[2])
procs = [subprocess.Popen([sys.executable, "-m", "denpex.remediation.allreduce_probe"],
                          env=dict(env, RANK=str(r))) for r in range(len(hosts))]
sys.exit(max(p.wait(timeout=120) for p in procs))
"""


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def checks(fail_on: str = "none") -> list[Check]:
    return [
        Check("dcgm_diag", ("sh", "-c", "echo diag level 1 on {host}")),
        Check("allreduce", (sys.executable, "-c", LAUNCH, "{spares}", free_port())),
        Check("ib_ports", ("sh", "-c", f"echo {{host}}: Active; test {{host}} != {fail_on}")),
    ]


def node(slurm, host: str) -> tuple[str, str]:
    out = slurm.run("sinfo", "-h", "-N", "-n", host, "-o", "%t|%E").stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


@pytest.mark.slow  # two real all-reduces (torch imported by two processes each): ~60 s here
def test_spares_are_validated_failed_ones_go_to_diagnostics_and_reroute_takes_one(slurm):
    backend = SlurmBackend(env=slurm.env, diagnostics_command=["sh", "-c", "echo diag {host}"])
    pool = SparePool(backend, checks=checks(fail_on="n2"), timeout_s=120)
    pool.enroll("n2", "gpu")
    pool.enroll("n3", "gpu")
    assert node(slurm, "n3")[1] == "denpex: warm spare"
    assert node(slurm, "n3")[0] in ("drain", "drng", "drained")

    verdict = pool.validate_all()
    assert verdict == {"n2": False, "n3": True}
    n3 = pool.spares["n3"]
    assert n3.status == VALIDATED
    (reduce,) = [r for r in n3.results if r["check"] == "allreduce"]
    assert reduce["passed"], reduce["output"]
    n2 = pool.spares["n2"]
    assert n2.status == FAILED
    assert node(slurm, "n2")[1] == "denpex: spare failed preflight"
    assert [r["check"] for r in n2.results][-1] == "diagnostics"  # sent to diagnostics

    # a plan on n1 reroutes: it takes n3 (preflight again, then resumed), never n2
    target = Target(TargetKind.HOST, "n1", None, "gpu")
    plan = Plan(
        5,
        "gpu.fallen_off_bus",
        "job_root_cause",
        target,
        ("retry_job",),
        plan_steps(["retry_job"]),
        "",
    )
    record = PlanRecord(1, "t", plan, Tier.AUTOREMEDIATE, State.REROUTE, ACTIVE, None, None)
    log = MemoryLog()
    before = time.monotonic()
    Executor(backend, log, parse_policy({"tier": "autoremediate"}), spares=pool).run(
        record, time.time_ns()
    )
    assert pool.spares["n3"].validated_at >= before  # checked again right before resume
    assert pool.spares["n3"].status == TAKEN
    assert node(slurm, "n3")[0] in ("idle", "mix", "alloc")
    assert node(slurm, "n2")[1] == "denpex: spare failed preflight"  # it stays out
    assert log.events[-1][:2] == ("finish", State.REROUTE)
    backend.resume(Target(TargetKind.HOST, "n2"), reason="test cleanup", timeout_s=30)


def test_no_spare_passes_and_a_stale_one_is_checked_before_it_is_offered(slurm):
    backend = SlurmBackend(env=slurm.env, diagnostics_command=["sh", "-c", "echo diag {host}"])
    quick = [c for c in checks() if c.name != "allreduce"]
    now = [1000.0]
    pool = SparePool(backend, checks=quick, max_age_s=60, timeout_s=60, clock=lambda: now[0])
    pool.enroll("n2", "gpu")
    assert pool.validate_all() == {"n2": True}
    now[0] += 120  # the validation went stale: take() runs the preflight again
    pool.checks = tuple(c if c.name != "ib_ports" else checks(fail_on="n2")[2] for c in quick)
    assert not pool.fresh(pool.spares["n2"])
    assert pool.take("gpu", exclude=["n1"], reason="denpex: test") is None
    assert pool.spares["n2"].status == FAILED
    assert node(slurm, "n2")[1] == "denpex: spare failed preflight"
    backend.resume(Target(TargetKind.HOST, "n2"), reason="test cleanup", timeout_s=30)
    pool = SparePool(backend, checks=checks(fail_on="n3"), timeout_s=120)
    pool.checks = tuple(c for c in pool.checks if c.name != "allreduce")
    pool.enroll("n3", "gpu")
    assert pool.take("gpu", exclude=["n1"], reason="denpex: test") is None
    assert node(slurm, "n3")[1] == "denpex: spare failed preflight"
    backend.resume(Target(TargetKind.HOST, "n3"), reason="test cleanup", timeout_s=30)
