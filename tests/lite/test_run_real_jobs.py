"""`denpex run` on real failing CPU training jobs (torchrun + gloo, children/gloo_job.py).

Each job fails the way real ones do, and the diagnosis must name the right rank and cause:
an OOM-killed rank in a memory cgroup, a segfault of rank 0, a rank blocked in open() on a
FIFO while the others time out in gloo, a disk-full failure with an unrelated OOM kill and
an unrelated Xid in the kernel log. Tests that write into the kernel log run only with
DENPEX_TEST_KMSG=1 and mark every line they write (denpex.core.kmsg.TEST_MARKER).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.core.kmsg import TEST_KMSG_ENV
from tests.kernel_log import needs_kernel_log
from tests.memcg import enter, memory_cgroup, unavailable_reason

CHILD = Path(__file__).parent / "children" / "gloo_job.py"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("torch") is None, reason="needs torch (CPU)"
    ),
]
KMSG_READABLE = os.access("/dev/kmsg", os.R_OK)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(mode: str, *args: str, ranks: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={ranks}",
        f"--master-port={free_port()}",
        "--monitor-interval=0.5",
        str(CHILD),
        mode,
        *args,
    ]


def denpex_run(
    report: Path, cmd: list[str], *, cgroup: Path | None = None, kmsg: bool = False
) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["TMPDIR"] = str(report.parent)  # torchrun's torchelastic_* folders go with the test's
    env.pop(TEST_KMSG_ENV, None)
    if kmsg:
        env[TEST_KMSG_ENV] = "1"
    argv = [sys.executable, "-m", "denpex", "run", "--no-pty", "-q", "--report", str(report)]
    proc = subprocess.Popen(
        [*argv, "--", *cmd],
        stdin=subprocess.PIPE if cgroup else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    if cgroup is not None:
        enter(cgroup, proc.pid)  # before denpex starts the job: every process inherits it
    out, err = proc.communicate(b"" if cgroup else None, timeout=240)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert report.exists(), err.decode(errors="replace")[-3000:]
    return result, json.loads(report.read_text())


def evidence_of(data: dict, category: str) -> list[dict]:
    return [t for t in data["timeline"] if t["category"] == category]


def root_cause_is_the_jobs(data: dict, schema: dict) -> bool:
    """Whether the root cause can be checked: the engine weighs host context down (the
    "context" role of contract 3), or no host record (another job's OOM kill on this shared
    machine) happened during the run to mislead an engine that does not."""
    roles = schema["properties"]["timeline"]["items"]["properties"]["role"]["enum"]
    return "context" in roles or not [t for t in data["timeline"] if t.get("attribution") == "host"]


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
@pytest.mark.skipif(not KMSG_READABLE, reason="needs a readable /dev/kmsg")
def test_oom_killed_rank_in_a_memory_cgroup_is_named(
    tmp_path, validate_diagnosis, diagnosis_schema
):
    with memory_cgroup(1200 << 20) as (folder, _path):
        result, data = denpex_run(tmp_path / "r.json", torchrun("oom"), cgroup=folder)
    validate_diagnosis(data)
    assert result.returncode != 0
    victims = [t for t in evidence_of(data, "host.oom_killed") if t["attribution"] == "job"]
    assert victims and {t["rank"] for t in victims if t["source"] == "kmsg"} == {1}, victims
    rc = data["root_cause"]
    if root_cause_is_the_jobs(data, diagnosis_schema):
        assert rc["category"] == "host.oom_killed", rc
        assert rc["rank"] == 1, rc  # the victim's pid → its RANK, read from its environment
    assert data["stats"]["job_processes"] >= 3


@pytest.mark.skipif(not KMSG_READABLE, reason="needs a readable /dev/kmsg")
def test_segfault_of_rank_0_is_reported_on_rank_0(tmp_path, validate_diagnosis, diagnosis_schema):
    result, data = denpex_run(tmp_path / "r.json", torchrun("segv"))
    validate_diagnosis(data)
    assert result.returncode != 0
    segfaults = evidence_of(data, "host.segfault")
    assert segfaults, data["timeline"]
    kernel = [t for t in segfaults if t["source"] == "kmsg"]
    assert kernel and {t["rank"] for t in kernel} == {0}, kernel
    assert {t["attribution"] for t in kernel} == {"job"}
    if root_cause_is_the_jobs(data, diagnosis_schema):
        assert data["root_cause"]["category"] == "host.segfault"
        assert data["root_cause"]["rank"] == 0, data["root_cause"]


def test_rank_blocked_in_open_on_a_fifo_is_named_as_the_hang(
    tmp_path, validate_diagnosis, diagnosis_schema
):
    fifo = tmp_path / "shard_3.bin"
    os.mkfifo(fifo)
    result, data = denpex_run(tmp_path / "r.json", torchrun("fifo", str(fifo)))
    validate_diagnosis(data)
    assert result.returncode != 0
    hangs = evidence_of(data, "train.hang")
    assert len(hangs) == 1, data["timeline"]
    [hang] = hangs
    assert hang["rank"] == 1 and hang["source"] == "proc"
    assert f"openat({str(fifo)!r})" in hang["line"], hang["line"]
    seconds = int(hang["line"].split(" for ")[1].split(" s")[0])
    assert 4 <= seconds <= 60, hang["line"]  # the others gave up after gloo's 6 s timeout
    if root_cause_is_the_jobs(data, diagnosis_schema):
        assert data["root_cause"]["category"] == "train.hang", data["root_cause"]
        assert data["root_cause"]["rank"] == 1
    assert data["stats"]["rank_samples"] >= 10
    if shutil.which("py-spy"):  # where the rank's Python code was, from its stack
        assert "gloo_job.py:" in hang["line"], hang["line"]
    else:
        assert any("py-spy is not installed" in note for note in data["notes"])


@needs_kernel_log
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a small tmpfs)")
def test_unrelated_oom_and_xid_during_a_disk_full_failure_stay_context(
    tmp_path, validate_diagnosis, diagnosis_schema
):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], check=True)
    try:
        result, data = denpex_run(tmp_path / "r.json", torchrun("diskfull", str(small)), kmsg=True)
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
    validate_diagnosis(data)
    assert result.returncode != 0
    kernel = {t["category"]: t for t in data["timeline"] if t["source"] == "kmsg"}
    assert {"host.oom_killed", "gpu.fallen_off_bus"} <= set(kernel), data["timeline"]
    assert (
        "999999" in kernel["host.oom_killed"]["line"]
        and "df:00" in kernel["gpu.fallen_off_bus"]["line"]
    )
    # another cgroup's victim and a GPU no process of the job holds: host context
    assert kernel["host.oom_killed"]["attribution"] == "host"
    assert kernel["gpu.fallen_off_bus"]["attribution"] == "host"
    if (
        "context"
        in diagnosis_schema["properties"]["timeline"]["items"]["properties"]["role"]["enum"]
    ):
        # the engine weighs host context down (contract 3): the job's own ENOSPC stays the cause
        assert data["root_cause"]["category"] == "host.disk_full", data["root_cause"]
        assert data["root_cause"]["rank"] == 0
