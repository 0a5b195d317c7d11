"""The pre-stop checkpoint: SIGUSR1 raises a flag, the next Guard.step() dx.saves model and
optimizer state and reports completion; under a real Slurm cluster the backend's checkpoint
step signals a real torch CPU job and reads its completion back within the budget."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the pre-stop checkpoint test trains a torch model")

import denpex.sdk as dx  # noqa: E402
from denpex.remediation.backend import Target, TargetKind  # noqa: E402
from denpex.remediation.slurm import SlurmBackend  # noqa: E402
from denpex.sdk.checkpoint import verify  # noqa: E402
from tests.remediation.test_slurm import wait_for  # noqa: E402

TRAIN = Path(__file__).with_name("prestop_train.py")


def test_signal_then_step_saves_a_verified_checkpoint(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DENPEX_PRESTOP_DIR", str(tmp_path))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "ckpt.pt"
    guard = dx.watch(model, optimizer, prestop_path=path, progress=False, emit=lambda e: None)
    try:
        guard.step(torch.tensor(1.0))
        assert not path.exists()
        os.kill(os.getpid(), signal.SIGUSR1)  # only raises the flag
        assert guard.prestop.pending and not path.exists()
        guard.step(torch.tensor(1.0))
        assert verify(path).ok
        state = dx.load(path)
        assert state["step"] == 2 and "optimizer" in state
        assert guard.prestop.completed[0]["ok"]
        assert list(tmp_path.glob("prestop-*.json"))
    finally:
        guard.close()
    assert signal.getsignal(signal.SIGUSR1) != guard.prestop._on_signal  # removed on close


def test_a_failing_hook_is_reported_not_raised(capsys) -> None:
    def hook(step: int) -> None:
        raise OSError("disk full")

    model = torch.nn.Linear(2, 1)
    guard = dx.watch(model, prestop=hook, progress=False, emit=lambda e: None)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        guard.step(torch.tensor(0.5))
        assert not guard.prestop.completed[0]["ok"]
        assert "disk full" in capsys.readouterr().err
    finally:
        guard.close()


def test_torch_job_checkpoints_before_eviction_under_slurm(slurm, tmp_path: Path) -> None:
    ckpt = tmp_path / "job.pt"
    job = slurm.sbatch(
        f"#!/bin/sh\nexec {sys.executable} {TRAIN} {ckpt}\n", "--requeue", "-J", "torch"
    )
    host = wait_for(
        lambda: slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip(), 60
    )
    # the SDK itself opts the job in (its Comment) once dx.watch is running
    wait_for(lambda: "denpex:checkpoint" in slurm.scontrol("show", "job", job).stdout, 120)
    backend = SlurmBackend(env=slurm.env)
    target = Target(TargetKind.HOST, host)
    result = backend.checkpoint(target, budget_s=120)
    assert result.ok, result.record
    assert result.record["completed"][job]
    assert verify(ckpt).ok
    print(f"pre-stop checkpoint of a torch job: {result.record['seconds']} s")
    evict = backend.evict(target, reason="denpex: test", timeout_s=30)
    assert evict.record["evicted"] == [job]
    slurm.run("scancel", job)
