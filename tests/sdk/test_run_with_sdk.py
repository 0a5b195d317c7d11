"""End to end: a job reports SDC on rank 2 through the SDK, other ranks time out in NCCL, the
job exits 1; `denpex run` (socket) and `denpex scan` (stderr lines) both blame train.sdc on
rank 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.core.sdk_wire import SOCKET_ENV

CHILDREN = Path(__file__).parent / "children"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (SOCKET_ENV, "RANK")}


def run_denpex(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """`denpex <args>` in a fresh interpreter, without the caller's SDK socket or rank."""
    return subprocess.run(
        [sys.executable, "-m", "denpex", *args],
        env=clean_env(),
        capture_output=True,
        timeout=timeout,
        **kwargs,
    )


def denpex_run(tmp_path: Path, *cmd: str) -> tuple[int, dict, str]:
    report = tmp_path / "r.json"
    result = run_denpex(
        "run", "--no-pty", "--report", str(report), "--", *cmd, timeout=240, cwd=tmp_path
    )
    data = json.loads(report.read_text()) if report.exists() else {}
    return result.returncode, data, result.stderr.decode("utf-8", "replace")


def test_denpex_run_blames_sdc_reported_over_the_socket(tmp_path: Path) -> None:
    code, report, stderr = denpex_run(tmp_path, sys.executable, str(CHILDREN / "run_report_sdc.py"))
    assert code == 1, stderr
    assert "denpex-sdk:" not in stderr  # it went over the socket, not the log
    root = report["root_cause"]
    assert root["category"] == "train.sdc" and root["rank"] == 2, stderr
    assert root["signature"] == "train.sdc.replica_mismatch"
    symptoms = [c for c in report["contributing"] if c["category"] == "nccl.timeout"]
    assert symptoms and symptoms[0]["role"] == "symptom"
    assert report["stats"]["sdk_messages"] == 1


def test_denpex_scan_blames_sdc_from_the_stderr_fallback(tmp_path: Path) -> None:
    job = subprocess.run(
        [sys.executable, str(CHILDREN / "run_report_sdc.py")],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=120,
    )
    assert job.returncode == 1
    assert job.stdout.count(b"denpex-sdk: ") == 1
    log = tmp_path / "job.log"
    # as torchrun --tee would show it: behind the rank prefix
    log.write_bytes(job.stdout.replace(b"denpex-sdk: ", b"[rank2]:denpex-sdk: "))
    scan = run_denpex("scan", "--json", str(log), timeout=120)
    assert scan.returncode == 1, scan.stderr
    root = json.loads(scan.stdout)["root_cause"]
    assert root["category"] == "train.sdc" and root["rank"] == 2


def test_no_analysis_sets_no_sdk_socket(tmp_path: Path) -> None:
    probe = f"import os; print(os.environ.get({SOCKET_ENV!r}, 'unset'))"
    result = run_denpex("run", "--no-pty", "--no-analysis", "--", sys.executable, "-c", probe)
    assert result.stdout.strip() == b"unset"
    report = tmp_path / "r.json"
    result = run_denpex(
        "run", "--no-pty", "-q", "--report", str(report), "--", sys.executable, "-c", probe
    )
    path = result.stdout.strip().decode()
    assert path.endswith("/sdk.sock") and not os.path.exists(os.path.dirname(path))


@pytest.mark.slow
def test_bit_flip_in_one_ddp_rank_is_caught_by_watch(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the DDP job needs PyTorch")
    code, report, stderr = denpex_run(
        tmp_path, sys.executable, str(CHILDREN / "run_ddp_bitflip.py")
    )
    assert code == 1, stderr
    root = report["root_cause"]
    assert root["category"] == "train.sdc", stderr
    assert root["rank"] == 2, stderr


@pytest.mark.slow
def test_a_bit_flip_on_a_job_that_exits_0_reaches_the_report(tmp_path: Path) -> None:
    # two replicas: they disagree and no majority can name the corrupted one (replica_split)
    pytest.importorskip("torch", reason="the DDP job needs PyTorch")
    code, report, stderr = denpex_run(
        tmp_path, sys.executable, str(CHILDREN / "run_ddp_bitflip.py"),
        "--ranks", "2", "--flip-rank", "1", "--exit-code", "0",
    )  # fmt: skip
    assert code == 0, stderr  # denpex exits with the job's status
    assert report["exit"]["code"] == 0
    sdc = [row for row in report["timeline"] if row["category"] == "train.sdc"]
    assert sdc and sdc[0]["signature"] == "train.sdc.replica_split", stderr


@pytest.mark.slow
def test_a_bit_flip_on_a_job_that_exits_0_fails_the_run(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the DDP job needs PyTorch")
    code, report, _ = denpex_run(
        tmp_path, sys.executable, str(CHILDREN / "run_ddp_bitflip.py"),
        "--ranks", "2", "--flip-rank", "1", "--exit-code", "0",
    )  # fmt: skip
    assert code == 0 and report["exit"]["code"] == 0
    assert report["status"] == "failed", report["summary"]
    assert report["root_cause"]["category"] == "train.sdc", report["summary"]
