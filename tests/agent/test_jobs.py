"""The job table: attribution by registration, ancestry, remembered descendants and cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from denpex.agent.jobs import JobTable, parent_pid
from denpex.core.roots import Roots
from denpex.core.wire import Registration

SPAWN_GRANDCHILD = (
    "import subprocess, sys; p = subprocess.Popen(['sleep', '30']); "
    "print(p.pid, flush=True); sys.stdin.read(); p.kill(); p.wait()"
)


def test_descendants_are_attributed_while_alive_and_after_they_are_reaped():
    table = JobTable(Roots())
    child = subprocess.Popen(
        [sys.executable, "-c", SPAWN_GRANDCHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        grandchild = int(child.stdout.readline())
        table.register(Registration(pid=child.pid, job="train-7", rank=3))
        assert parent_pid(Roots(), grandchild) == child.pid
        found = table.lookup(grandchild)
        assert found is not None and (found.job, found.rank) == ("train-7", 3)
        assert table.refresh() >= 1
        child.stdin.close()  # the child kills and reaps its grandchild, then exits
        child.wait(10)
        deadline = time.monotonic() + 5
        while Roots().proc(grandchild).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        found = table.lookup(grandchild)  # gone from /proc: remembered from the refresh
        assert found is not None and found.job == "train-7"
    finally:
        child.kill()
        child.wait()
    assert table.lookup(999_999_999) is None


def test_an_unnamed_registration_gets_a_job_name_and_expires_after_its_grace():
    table = JobTable(Roots(), grace_s=0.0)
    proc = subprocess.Popen(["sleep", "30"])
    try:
        stored = table.register(Registration(pid=proc.pid))
        assert stored.job == f"pid-{proc.pid}"
        assert table.expire() == []  # alive
    finally:
        proc.kill()
        proc.wait()
    table.expire()  # marks the exit
    assert table.expire() == [proc.pid]
    assert table.snapshot() == []


def test_cgroup_attribution_matches_the_job_cgroup_and_its_children_only():
    table = JobTable(Roots())
    table.register(Registration(pid=999_999_998, job="42", cgroup="/slurm/uid_0/job_42"))
    assert table.lookup(cgroup="/slurm/uid_0/job_42/step_0/task_1").job == "42"
    assert table.lookup(cgroup="/slurm/uid_0/job_42").job == "42"
    assert table.lookup(cgroup="/slurm/uid_0/job_420").job == "420"  # its own, not 42's
    assert table.lookup(cgroup="/") is None


def test_a_cgroup_the_agent_shares_is_not_used_for_attribution():
    table = JobTable(Roots())
    proc = subprocess.Popen(["sleep", "30"])  # same cgroups as this test process
    try:
        stored = table.register(Registration(pid=proc.pid, job="shared"))
        assert stored.cgroup is None
    finally:
        proc.kill()
        proc.wait()


def test_unregistered_processes_are_attributed_by_their_own_slurm_marks():
    env = {**os.environ, "SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5"}
    env.pop("RANK", None)
    proc = subprocess.Popen(["sleep", "30"], env=env)
    deadline = time.monotonic() + 5
    while not Roots().proc(proc.pid, "cmdline").read_bytes().startswith(b"sleep"):
        assert time.monotonic() < deadline  # until exec: the environment is the parent's
        time.sleep(0.01)
    try:
        table = JobTable(Roots())
        found = table.lookup(proc.pid)
        assert found is not None and (found.job, found.rank) == ("4711.0", 5)
    finally:
        proc.kill()
        proc.wait()
    assert table.lookup(proc.pid).job == "4711.0"  # remembered after the process is gone
    assert table.lookup(cgroup="/slurm/uid_0/job_99/step_batch/task_0").job == "99.batch"
    pod = "/kubepods/burstable/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427/abc"
    assert table.lookup(cgroup=pod).job == "pod:1b4e28ba-2fa1-11d2-883f-0016d3cca427"
