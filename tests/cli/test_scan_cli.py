"""`denpex scan` as a user runs it: real subprocesses, real files, JSON checked against the schema."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

OOM_RANK3 = """\
[rank0]:2026-11-30 04:50:00,100 - train - INFO - step 100 | loss 2.31
[rank3]:Traceback (most recent call last):
[rank3]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB of which 1.02 GiB is free.
[rank0]:[E1130 05:00:01.000000 4100 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds before timing out.
"""
XID_KERN = "Nov 30 04:49:58 node2 kernel: [12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"
HEALTHY = """\
node1:4100:4100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.11<0>
node1:4100:4100 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
/usr/lib/python3/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs have requires_grad=True. Gradients will be None
step 100 | loss 2.31
"""


def denpex(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", *args],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        timeout=120,
    )


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    (tmp_path / "node1").mkdir()
    (tmp_path / "node2").mkdir()
    (tmp_path / "node1" / "rank0.log").write_text(OOM_RANK3)
    (tmp_path / "node2" / "kern.log").write_text(XID_KERN)
    (tmp_path / "healthy.log").write_text(HEALTHY)
    return tmp_path


def test_json_validates_and_names_the_first_failing_rank(logs, validate_diagnosis):
    result = denpex("scan", "--json", "-q", str(logs / "node1" / "rank0.log"))
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    validate_diagnosis(data)
    assert data["root_cause"]["category"] == "cuda.oom"
    assert data["root_cause"]["rank"] == 3
    assert data["root_cause"]["host"] == "node1"  # from the folder name
    assert any(
        c["role"] == "symptom" and c["category"] == "nccl.timeout" for c in data["contributing"]
    )


def test_glob_of_mixed_sources_puts_hardware_first(logs, validate_diagnosis):
    result = denpex("scan", "--json", "-q", "node*/*.log", cwd=logs)
    data = json.loads(result.stdout)
    validate_diagnosis(data)
    assert result.returncode == 1
    assert data["root_cause"]["category"] == "gpu.fallen_off_bus"
    assert data["root_cause"]["host"] == "node2"
    assert data["root_cause"]["rule"] == "hardware_first"


def test_healthy_log_exits_0(logs, validate_diagnosis):
    result = denpex("scan", "--json", str(logs / "healthy.log"))
    assert result.returncode == 0
    data = json.loads(result.stdout)
    validate_diagnosis(data)
    assert data["status"] == "ok" and data["root_cause"]["category"] == "unknown"
    assert "no failure" in result.stderr.decode().lower()


def test_stdin_and_overrides(validate_diagnosis):
    result = denpex(
        "scan",
        "--json",
        "--host",
        "gpu-07",
        "--rank",
        "5",
        "-q",
        stdin=b"RuntimeError: CUDA error: an illegal memory access was encountered\n",
    )
    data = json.loads(result.stdout)
    validate_diagnosis(data)
    assert (
        data["root_cause"]["category"],
        data["root_cause"]["host"],
        data["root_cause"]["rank"],
    ) == ("cuda.illegal_address", "gpu-07", 5)


def test_exit_code_zero_means_no_root_cause(logs):
    result = denpex("scan", "--json", "-q", "--exit-code", "0", str(logs / "node1" / "rank0.log"))
    assert result.returncode == 0
    assert json.loads(result.stdout)["status"] == "ok"


def test_reports_are_written(logs, validate_diagnosis):
    report, html = logs / "d.json", logs / "d.html"
    result = denpex(
        "scan",
        "-q",
        "--report",
        str(report),
        "--html",
        str(html),
        str(logs / "node1" / "rank0.log"),
    )
    assert result.returncode == 1
    validate_diagnosis(json.loads(report.read_text()))
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "cuda.oom" in page


@pytest.mark.parametrize(
    "args,message",
    [
        (["missing.log"], "does not exist"),
        (["nomatch*.log"], "no file matches"),
        (["--tee", "--json"], "--tee"),
        (["--follow", "a", "b"], "--follow"),
        (["--report", "/nonexistent-dir/x.json", "-"], "does not exist"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    result = denpex("scan", *args, cwd=tmp_path, stdin=b"")
    assert result.returncode == 2
    err = result.stderr.decode()
    assert message in err and "Traceback" not in err


def test_help_teaches():
    result = denpex("scan", "--help")
    assert result.returncode == 0
    text = result.stdout.decode()
    assert "--tee" in text and "exit status" in text and "examples" in text


def test_version_verbose_names_backends():
    result = denpex("--version", "--verbose")
    text = result.stdout.decode()
    assert result.returncode == 0
    assert "linesplit:" in text and "matcher:" in text and "signatures:" in text


def test_tee_copies_bytes_exactly_and_diagnoses(validate_diagnosis, tmp_path):
    stream = OOM_RANK3.encode() + b"\x00\xff progress\r 50%\r100%\n" * 100
    report = tmp_path / "tee.json"
    result = denpex("scan", "--tee", "-q", "--report", str(report), stdin=stream)
    assert result.returncode == 1, result.stderr
    assert result.stdout == stream
    data = json.loads(report.read_text())
    validate_diagnosis(data)
    assert data["root_cause"]["category"] == "cuda.oom"


def test_tee_of_a_healthy_stream_exits_0():
    result = denpex("scan", "--tee", "-q", stdin=HEALTHY.encode())
    assert (result.returncode, result.stdout) == (0, HEALTHY.encode())


def test_follow_reports_failures_as_they_appear(tmp_path):
    log = tmp_path / "grow.log"
    log.write_text("step 1 loss 2.0\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "denpex", "scan", "--follow", "--no-color", str(log)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        import time

        time.sleep(1.0)
        with log.open("a") as handle:
            handle.write("RuntimeError: CUDA error: an illegal memory access was encountered\n")
        deadline = time.monotonic() + 20
        seen = b""
        os.set_blocking(proc.stderr.fileno(), False)
        while time.monotonic() < deadline and b"cuda.illegal_address" not in seen:
            time.sleep(0.2)
            seen += proc.stderr.read() or b""
        assert b"cuda.illegal_address" in seen
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert proc.returncode == 1


def test_scan_says_what_it_could_not_read(tmp_path, validate_diagnosis):
    empty, binary = tmp_path / "empty.log", tmp_path / "core.bin"
    empty.write_bytes(b"")
    binary.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 64)
    for path, said in ((empty, "is empty: nothing was scanned"), (binary, "NUL bytes")):
        result = denpex("scan", str(path))
        assert result.returncode == 0  # nothing found is still exit 0 …
        text = " ".join(result.stderr.decode().split())  # as read, whatever the wrapping
        assert "OK" in text and said in text, text  # … but never a bare OK
        data = json.loads(denpex("scan", "--json", "-q", str(path)).stdout)
        validate_diagnosis(data)
        assert any(said in note for note in data["notes"]), data["notes"]


def test_an_error_at_the_end_of_a_ten_megabyte_line_is_found(tmp_path, validate_diagnosis):
    log = tmp_path / "one_line.log"
    log.write_bytes(
        b"x" * (10 << 20) + b" torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        b"2.00 GiB\nstep 2\n"
    )
    result = denpex("scan", "--json", "-q", str(log))
    data = json.loads(result.stdout)
    validate_diagnosis(data)
    assert result.returncode == 1 and data["root_cause"]["category"] == "cuda.oom"
    assert data["stats"]["long_lines"] == 1
    assert any("longer than 64 KiB" in note for note in data["notes"]), data["notes"]


@pytest.mark.parametrize(
    "line",
    [
        b"Feb 29 12:00:00 node1 kernel: x\n",  # a common year (no year: syslog takes today's)
        b"[Thu Feb 29 12:00:00 2027] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen\n",
        b"2026-11-30T23:59:60Z slurmstepd: error: *** STEP 1.0 ON node1 CANCELLED ***\n",
        b"Nov 32 25:61:00 node1 kernel: Out of memory: Killed process 4242 (python)\n",
    ],
)
def test_an_impossible_timestamp_costs_no_diagnosis(line, validate_diagnosis):
    """A line whose time names no real instant is still a line: scanned, diagnosed, untimed."""
    result = denpex("scan", "--json", "-q", stdin=line)
    assert result.returncode in (0, 1), result.stderr.decode()
    assert b"Traceback" not in result.stderr
    validate_diagnosis(json.loads(result.stdout))
