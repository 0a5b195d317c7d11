"""The shared /proc parsers and job lookups, on strings, on a fixture tree and on /proc."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from denpex.core.roots import Roots
from denpex.host.procfs import (
    cgroup_path_of,
    descendants,
    format_id_list,
    parse_colon_fields,
    parse_environ,
    parse_id_list,
    parse_int_fields,
    parse_limit_value,
    parse_open_files_limit,
    parse_proc_cgroup,
    parse_stat,
    resolve_job_pids,
)


def test_parse_stat_with_spaces_and_parentheses_in_the_name() -> None:
    text = "4242 (python (a) b) S 17 4242 4242 0 -1 4194560 " + " ".join(["0"] * 10) + " 7 0 0"
    stat = parse_stat(text)
    assert stat is not None
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.threads) == (
        4242,
        "python (a) b",
        "S",
        17,
        7,
    )
    assert parse_stat("garbage") is None


def test_parse_stat_of_this_process() -> None:
    stat = parse_stat(Roots().proc("self", "stat").read_text())
    assert stat is not None and stat.pid == os.getpid() and stat.ppid == os.getppid()


def test_parse_proc_cgroup_hybrid() -> None:
    text = "12:pids:/a\n4:memory:/slurm/job_7\n3:cpu,cpuacct:/c\n1:name=systemd:/s\n0::/u\n"
    entries = parse_proc_cgroup(text)
    assert cgroup_path_of(entries, "memory") == "/slurm/job_7"
    assert cgroup_path_of(entries, "cpu") == "/c"
    assert cgroup_path_of(entries, "") == "/u"
    assert cgroup_path_of(parse_proc_cgroup("1:name=systemd:/s\n"), "") is None
    assert cgroup_path_of(entries, "blkio") is None


def test_key_value_parsers() -> None:
    assert parse_colon_fields("Name:\tpython\nVmRSS:\t  12 kB\nbad line\n") == {
        "Name": "python",
        "VmRSS": "12 kB",
    }
    assert parse_int_fields("oom_kill 3\nunder_oom 0\nname text\nx 1 2\n") == {
        "oom_kill": 3,
        "under_oom": 0,
    }
    assert parse_limit_value("max\n") is None
    assert parse_limit_value("9223372036854771712\n") is None
    assert parse_limit_value("33554432\n") == 33554432
    limits = "Max open files            1024                 524288               files\n"
    assert parse_open_files_limit(limits) == 1024
    assert parse_open_files_limit(limits.replace("1024 ", "unlimited")) is None
    assert parse_environ(b"A=1\0SLURM_JOB_ID=42\0junk\0") == {"A": "1", "SLURM_JOB_ID": "42"}


@given(st.sets(st.integers(min_value=0, max_value=300)))
def test_id_list_round_trip(ids: set[int]) -> None:
    assert parse_id_list(format_id_list(ids)) == ids


def test_id_list_examples() -> None:
    assert parse_id_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_id_list([3, 1, 2, 8]) == "1-3,8"
    assert parse_id_list("") == frozenset()


def test_descendants_from_children_files_and_by_scan(fixture_roots) -> None:
    roots = fixture_roots("proc")
    assert descendants(roots, 100) == [100, 101, 102, 103]
    # a kernel without CONFIG_PROC_CHILDREN: the ppid scan finds the same tree
    for pid in (100, 101, 102, 103, 200):
        (roots.proc(pid, "task", pid, "children")).unlink()
    assert sorted(descendants(roots, 100)) == [100, 101, 102, 103]
    assert descendants(roots, 99999) == []


def test_resolve_job_pids_by_each_selector(fixture_roots) -> None:
    roots = fixture_roots("proc")
    assert resolve_job_pids(roots, pid=101) == [101, 103]
    assert resolve_job_pids(roots, cgroup="/slurm/job_42") == [100, 101, 102, 103]
    assert resolve_job_pids(roots, slurm_job_id="42") == [100, 101]  # not 420
    assert resolve_job_pids(roots, pod_uid="1f2e3d4c-aaaa-bbbb-cccc-000000000001") == [200]
    assert resolve_job_pids(roots, pid=103, slurm_job_id="420") == [103, 200]
    assert resolve_job_pids(roots) == []


def test_identity_from_environ_and_cgroup_paths() -> None:
    from denpex.host.procfs import identity_from_cgroup, identity_from_environ

    assert identity_from_environ({"SLURM_JOB_ID": "12", "SLURM_PROCID": "3"}) == ("12", 3)
    assert identity_from_environ({"RANK": "7", "SLURM_PROCID": "3"}) == (None, 7)
    assert identity_from_environ({"RANK": "x"}) == (None, None)
    assert identity_from_cgroup("/system.slice/sshd.service") is None
    assert identity_from_cgroup("/slurm/uid_1000/job_812/step_2/task_0") == "812.2"
    systemd_pod = (
        "/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice/cri-containerd-1.scope"
    )
    assert identity_from_cgroup(systemd_pod) == "pod:1b4e28ba-2fa1-11d2-883f-0016d3cca427"
