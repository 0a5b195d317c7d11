"""`denpex run` end to end: real jobs, real kernel log and memory cgroups where the machine
allows (root), the JSON report checked against the schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from denpex.core.kmsg import TEST_KMSG_ENV, TEST_MARKER
from tests.kernel_log import needs_kernel_log

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "failing_job.py"


def denpex_run(
    *args: str, cwd: Path | None = None, timeout: int = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "denpex", "run", *args],
        capture_output=True,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_example_job_is_diagnosed_with_reports(tmp_path, validate_diagnosis):
    report, html = tmp_path / "diag.json", tmp_path / "diag.html"
    result = denpex_run(
        "--no-pty", "--report", str(report), "--html", str(html), "--", sys.executable, str(EXAMPLE)
    )
    assert result.returncode == 1  # the job's own status
    assert b"train.py FAILED" in result.stderr  # the job's output passed through
    assert b"root cause: cuda.oom" in result.stderr
    data = json.loads(report.read_text())
    validate_diagnosis(data)
    assert data["exit"] == {"code": 1, "signal": None}
    assert (data["root_cause"]["category"], data["root_cause"]["rank"]) == ("cuda.oom", 2)
    assert data["root_cause"]["rule"] == "first_failing_rank"
    roles = {t["role"] for t in data["timeline"]}
    assert {"cause", "symptom"} <= roles and 3 <= len(data["timeline"]) <= 8
    assert data["actions"][0]["action"] == "reduce_memory"
    assert "<svg" in html.read_text()


def test_successful_job_reports_ok(tmp_path, validate_diagnosis):
    report = tmp_path / "ok.json"
    script = (
        "print('NCCL INFO NET/Plugin: Could not find: libnccl-net.so'); print('step 1 loss 2.0')"
    )
    result = denpex_run("--no-pty", "--report", str(report), "--", sys.executable, "-c", script)
    assert result.returncode == 0
    data = json.loads(report.read_text())
    validate_diagnosis(data)
    assert data["status"] == "ok" and data["root_cause"]["category"] == "unknown"


def test_killed_job_reports_the_signal(tmp_path, validate_diagnosis):
    report = tmp_path / "k.json"
    result = denpex_run(
        "--no-pty", "-q", "--report", str(report), "--", "sh", "-c", "kill -TERM $$"
    )
    assert result.returncode == 128 + 15
    data = json.loads(report.read_text())
    validate_diagnosis(data)
    assert data["exit"] == {"code": None, "signal": "SIGTERM"}
    assert data["status"] == "failed"


def test_usage_errors():
    assert denpex_run().returncode == 2
    missing = denpex_run("--", "no-such-command-denpex")
    assert missing.returncode == 127 and b"cannot run" in missing.stderr
    bad_report = denpex_run("--report", "/no/such/dir/x.json", "--", "true")
    assert bad_report.returncode == 2 and b"does not exist" in bad_report.stderr


def test_no_analysis_only_wraps():
    result = denpex_run(
        "--no-analysis", "--", sys.executable, "-c", "import sys; print('x'); sys.exit(3)"
    )
    assert (result.returncode, result.stdout, result.stderr) == (3, b"x\n", b"")


@needs_kernel_log
def test_xid_of_the_jobs_own_process_is_the_root_cause(tmp_path, validate_diagnosis):
    report = tmp_path / "xid.json"
    job = textwrap.dedent(f"""
        import os, sys, time
        with open('/dev/kmsg', 'w') as k:
            k.write(f'<3>NVRM: Xid (PCI:0000:3b:00): 79, pid={{os.getpid()}}, name=python, '
                    'GPU has fallen off the bus. {TEST_MARKER}\\n')
        time.sleep(0.5)
        print('RuntimeError: CUDA error: unspecified launch failure', file=sys.stderr)
        sys.exit(1)
    """)
    result = denpex_run("--no-pty", "-q", "--report", str(report), "--", sys.executable, "-c", job)
    assert result.returncode == 1
    data = json.loads(report.read_text())
    validate_diagnosis(data)
    assert data["root_cause"]["category"] == "gpu.fallen_off_bus"
    assert data["root_cause"]["rule"] == "hardware_first"
    kernel = [t for t in data["timeline"] if t["source"] == "kmsg"]
    assert kernel and kernel[0]["role"] == "cause"
    assert kernel[0]["attribution"] == "job"  # the Xid names one of the job's processes
    # written from user space, so trusted less than a record from the kernel itself
    assert data["root_cause"]["confidence"] < 0.9


@needs_kernel_log
def test_a_marked_test_line_is_ignored_outside_a_test_run(tmp_path):
    report = tmp_path / "x.json"
    job = (
        "import sys, time; open('/dev/kmsg', 'w').write("
        f"'<3>NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus. {TEST_MARKER}\\n'"
        "); time.sleep(0.5)"
    )
    env = {k: v for k, v in os.environ.items() if k != TEST_KMSG_ENV}
    argv = [sys.executable, "-m", "denpex", "run", "--no-pty", "-q", "--report", str(report)]
    result = subprocess.run(
        [*argv, "--", sys.executable, "-c", job],
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(report.read_text())
    assert data["status"] == "ok" and not [t for t in data["timeline"] if t["source"] == "kmsg"]


def _memory_cgroup_root() -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() == 0 and (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
        return root
    return None


@pytest.mark.slow
@pytest.mark.skipif(_memory_cgroup_root() is None, reason="needs root and a v1 memory cgroup")
def test_cgroup_oom_kill_is_diagnosed_from_the_wrapper_alone(tmp_path, validate_diagnosis):
    cgroup = _memory_cgroup_root() / f"denpex-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(256 << 20))
        try:
            (cgroup / "memory.memsw.limit_in_bytes").write_text(str(256 << 20))
        except OSError:
            pass
        report = tmp_path / "oom.json"
        hog = "b = bytearray(2 << 30); print('never')"
        launcher = (
            f"echo $$ > {cgroup}/cgroup.procs && exec {sys.executable} -m denpex run --no-pty -q "
            f'--report {report} -- {sys.executable} -c "{hog}"'
        )
        result = subprocess.run(["sh", "-c", launcher], capture_output=True, timeout=120, cwd=ROOT)
        assert result.returncode == 137, result.stderr
        data = json.loads(report.read_text())
        validate_diagnosis(data)
        assert data["exit"]["signal"] == "SIGKILL"
        assert data["root_cause"]["category"] == "host.oom_killed"
        assert data["root_cause"]["rule"] == "oom_killer"
        assert {t["source"] for t in data["timeline"]} & {"cgroup", "kmsg"}
    finally:
        for _ in range(50):
            try:
                cgroup.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
