"""The Slurm backend against a real slurmctld and three slurmd: cordon with a denpex reason,
the pre-stop signal, eviction as requeue-hold, requeue with --exclude, diagnostics, resume, and
every operation idempotent; a node someone else drained is left alone."""

from __future__ import annotations

import time

import pytest

from denpex.remediation.backend import BackendError, Operation, Target, TargetKind
from denpex.remediation.slurm import SlurmBackend

TRAP_JOB = """#!/bin/sh
trap 'echo checkpoint >> ckpt-$SLURM_JOB_ID.txt; scontrol update jobid=$SLURM_JOB_ID \
  "Comment=denpex:checkpoint saved=1@$(date +%s%N)"' USR1
while true; do sleep 1; done
"""


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("condition not reached")


def job_node(slurm, job: str) -> str | None:
    out = slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip()
    return out or None


@pytest.fixture
def backend(slurm) -> SlurmBackend:
    return SlurmBackend(
        env=slurm.env, diagnostics_command=["sh", "-c", "echo level {level} on {host}"]
    )


def test_full_path_on_a_real_cluster(slurm, backend) -> None:
    assert backend.available() is None
    job = slurm.sbatch(TRAP_JOB, "--requeue", "-J", "train", "--comment=denpex:checkpoint")
    plain = slurm.sbatch(TRAP_JOB.replace("trap", "# no trap:"), "--requeue", "-J", "plain")
    host = wait_for(lambda: job_node(slurm, job))
    wait_for(lambda: job_node(slurm, plain))
    if job_node(slurm, plain) == host:  # one CPU per node: never on the same one
        raise AssertionError("two jobs on one single-CPU node")
    target = Target(TargetKind.HOST, host, None, "gpu")
    reason = "denpex: incident 7 gpu.fallen_off_bus"

    assert backend.pool_of(host, timeout_s=10) == "gpu"
    assert backend.pool_hosts("gpu", timeout_s=10) == ("n1", "n2", "n3")
    state = backend.state(target, timeout_s=10)
    assert state.schedulable and state.jobs == (job,)

    cordon = backend.cordon(target, reason=reason, timeout_s=10)
    assert cordon.ok and cordon.changed
    assert cordon.record["node"]["reason"] == reason
    assert "DRAIN" in cordon.record["node"]["raw"]["state_flags"]
    again = backend.perform(Operation.DRAIN, target, {"reason": reason, "timeout_s": 10})
    assert again.ok and not again.changed  # idempotent: already drained with our reason

    checkpoint = backend.checkpoint(target, budget_s=10)
    assert checkpoint.ok and checkpoint.record["signalled"] == [job]
    assert checkpoint.record["completed"][job].startswith("1@")
    assert checkpoint.record["not_opted_in"] == []
    wait_for(lambda: (slurm.root / f"ckpt-{job}.txt").exists())

    evict = backend.evict(target, reason=reason, timeout_s=10)
    assert evict.ok and evict.record["evicted"] == [job] and evict.record["held"] == [job]
    assert not backend.evict(target, reason=reason, timeout_s=10).changed

    requeue = backend.requeue(target, exclude=[host], timeout_s=10)
    assert requeue.record["requeued"] == [job] and host in requeue.record["exclude"]
    assert not backend.requeue(target, exclude=[host], timeout_s=10).changed
    elsewhere = wait_for(lambda: job_node(slurm, job), timeout=60)
    assert elsewhere != host  # rerouted: --exclude held
    shown = slurm.scontrol("show", "job", job).stdout
    assert f"ExcNodeList={host}" in shown
    assert "Comment=denpex:checkpoint" in shown  # the job's own comment, restored

    diag = backend.run_diagnostics(target, level=3, timeout_s=10)
    assert diag.ok and f"level 3 on {host}" in diag.record["output"]

    t0 = time.monotonic()
    resume = backend.resume(target, reason=reason, timeout_s=60)
    print(f"resume read back schedulable after {time.monotonic() - t0:.1f} s")
    assert resume.ok and resume.changed
    assert backend.state(target, timeout_s=10).schedulable
    assert not backend.resume(target, reason=reason, timeout_s=10).changed
    # a job that did not opt in is never sent SIGUSR1 (it would kill it)
    other = Target(TargetKind.HOST, job_node(slurm, plain) or "", None, "gpu")
    skipped = backend.checkpoint(other, budget_s=10)
    assert skipped.record["signalled"] == [] and skipped.record["not_opted_in"] == [plain]
    assert job_node(slurm, plain)
    slurm.run("scancel", job, plain)


def test_a_node_drained_by_someone_else_is_left_alone(slurm, backend) -> None:
    target = Target(TargetKind.HOST, "n3")
    slurm.scontrol("update", "nodename=n3", "state=drain", "reason=bad fan (ops)")
    try:
        with pytest.raises(BackendError, match="someone else"):
            backend.resume(target, reason="denpex: x", timeout_s=10)
        with pytest.raises(BackendError, match="someone else"):
            backend.cordon(target, reason="denpex: incident 1", timeout_s=10)
        assert backend.state(target, timeout_s=10).reason == "bad fan (ops)"
    finally:
        slurm.scontrol("update", "nodename=n3", "state=resume")


def test_failed_diagnostics_and_unknown_nodes(slurm) -> None:
    failing = SlurmBackend(env=slurm.env, diagnostics_command=["sh", "-c", "echo fault; exit 3"])
    diag = failing.run_diagnostics(Target(TargetKind.HOST, "n1"), level=3, timeout_s=10)
    assert not diag.ok and diag.record["returncode"] == 3
    with pytest.raises(BackendError, match="no node"):
        failing.state(Target(TargetKind.HOST, "n9"), timeout_s=10)
    missing = SlurmBackend(env=slurm.env)  # dcgmi is not installed here
    with pytest.raises(BackendError, match="dcgmi not found"):
        missing.run_diagnostics(Target(TargetKind.HOST, "n1"), level=3, timeout_s=10)
