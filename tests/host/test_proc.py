"""The process-tree collector on a fixture /proc and on this host's /proc with a real tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.proc import ProcCollector, resolve_job_pids, sample_process

JOB = Registration(pid=100, job="train-42", rank=0, tenant="lab")


def values(out: list) -> dict[str, float]:
    return {e.body: e.attrs["value"] for e in out if isinstance(e, Event) and e.kind == "metric"}


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def test_sample_process_from_fixture(fixture_roots) -> None:
    roots = fixture_roots("proc")
    s = sample_process(roots, 101)
    assert s is not None
    assert (s.name, s.state, s.threads, s.rss_bytes, s.open_fds, s.fd_limit) == (
        "pt_data_worker",
        "D",
        2,
        512000 * 1024,
        9,
        10,
    )
    assert sample_process(roots, 31337) is None


def test_job_gauges_and_detectors(fixture_roots) -> None:
    roots = fixture_roots("proc")
    collector = ProcCollector(roots, {"zombie_max": 0})
    ctx = CollectContext(roots=roots, host="n", jobs=[JOB], now_ns=1)
    first = collector.collect(ctx)
    got = values(first)
    assert got == {
        "proc_processes": 4,
        "proc_rss_bytes": (2048000 + 512000 + 0 + 1000) * 1024,
        "proc_threads": 12 + 2 + 1 + 1,
        "proc_dstate_processes": 1,
        "proc_zombie_processes": 1,
        "proc_open_fds": 8 + 9 + 0 + 3,
        "proc_open_fds_limit_ratio": 0.9,
    }
    assert set(got) <= set(collector.metrics_help)
    assert all(e.job == "train-42" and e.tenant == "lab" for e in first if isinstance(e, Event))
    sigs = {e.signature: e for e in evidence(first)}
    # D state needs a second poll; zombies and fds are immediate
    assert set(sigs) == {"host.fd_exhausted.zombies", "host.fd_exhausted.open_files_near_limit"}
    fds = sigs["host.fd_exhausted.open_files_near_limit"]
    assert fds.event.pid == 101 and fds.captures == {
        "pid": "101",
        "name": "pt_data_worker",
        "open_fds": "9",
        "limit": "10",
    }
    assert fds.category == "host.fd_exhausted" and fds.severity == "warning"

    second = evidence(collector.collect(ctx))
    assert [(e.signature, e.category, e.event.pid) for e in second] == [
        ("host.kernel_fault.process_dstate", "host.kernel_fault", 101)
    ]
    assert second[0].captures["wchan"] == "nfs_wait_bit_killable"
    assert second[0].event.job == "train-42" and second[0].severity == "warning"
    assert evidence(collector.collect(ctx)) == []  # still stuck: said once

    status = roots.proc(101, "status")
    status.write_text(status.read_text().replace("D (disk sleep)", "S (sleeping)"))
    assert evidence(collector.collect(ctx)) == []
    status.write_text(status.read_text().replace("S (sleeping)", "D (disk sleep)"))
    assert evidence(collector.collect(ctx)) == []  # one poll in D is not enough
    assert len(evidence(collector.collect(ctx))) == 1


def test_vanished_job_is_not_an_error(fixture_roots) -> None:
    roots = fixture_roots("proc")
    out = ProcCollector(roots).collect(
        CollectContext(roots=roots, host="n", jobs=[Registration(pid=999999, job="gone")])
    )
    assert values(out)["proc_processes"] == 0 and evidence(out) == []


SPAWNER = """
import subprocess, sys, time
kids = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
sys.stdin.readline()
for k in kids:
    k.kill()
"""


def test_real_process_tree_is_found() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", SPAWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLURM_JOB_ID": f"denpex-test-{os.getpid()}"},
    )
    try:
        assert parent.stdout is not None
        kids = [int(p) for p in parent.stdout.readline().split()]
        roots = Roots()
        tree = resolve_job_pids(roots, pid=parent.pid)
        assert tree == sorted([parent.pid, *kids])
        by_env = resolve_job_pids(roots, slurm_job_id=f"denpex-test-{os.getpid()}")
        assert set(by_env) == {parent.pid, *kids}  # the sleeps inherit the environment
        collector = ProcCollector(roots)
        out = collector.collect(
            CollectContext(roots=roots, host="h", jobs=[Registration(pid=parent.pid, job="real")])
        )
        got = values(out)
        assert got["proc_processes"] == 3
        assert got["proc_rss_bytes"] > 1_000_000 and got["proc_threads"] >= 3
        assert got["proc_open_fds"] >= 3 and 0 < got["proc_open_fds_limit_ratio"] < 0.5
    finally:
        if parent.stdin is not None:
            parent.stdin.close()
        deadline = time.monotonic() + 10
        while parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if parent.poll() is None:
            parent.kill()
        parent.wait()
