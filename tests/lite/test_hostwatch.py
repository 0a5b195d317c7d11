"""Host evidence for `denpex run`: cgroup OOM kills (v1 and v2 fixture trees), /dev/kmsg."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from denpex.lite.hostwatch import CgroupMemoryWatch, KmsgWatch


def make_tree(tmp_path: Path, version: str, pid: int = 4242) -> tuple[Path, Path]:
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    (proc / str(pid)).mkdir(parents=True)
    if version == "v1":
        (proc / str(pid) / "cgroup").write_text("5:cpu:/\n4:memory:/slurm/job42\n0::/\n")
        folder = sys_ / "fs/cgroup/memory/slurm/job42"
        folder.mkdir(parents=True)
        (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
        (folder / "memory.failcnt").write_text("10\n")
    else:
        (proc / str(pid) / "cgroup").write_text("0::/system.slice/job42.scope\n")
        folder = sys_ / "fs/cgroup/system.slice/job42.scope"
        folder.mkdir(parents=True)
        (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    return proc, folder


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroup_oom_kill_during_the_run_is_evidence(tmp_path, version):
    proc, folder = make_tree(tmp_path, version)
    watch = CgroupMemoryWatch(4242, procfs=str(proc), sysfs=str(tmp_path / "sys"))
    assert watch.start()
    assert watch.finish("e1", "node1") is None  # nothing changed yet
    if version == "v1":
        (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    else:
        (folder / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    evidence = watch.finish("e7", "node1")
    assert evidence is not None
    assert (evidence.id, evidence.category, evidence.event.host) == (
        "e7",
        "host.oom_killed",
        "node1",
    )
    assert "oom_kill" in evidence.event.body and version in evidence.event.body


def test_missing_cgroup_is_reported_not_raised(tmp_path):
    watch = CgroupMemoryWatch(1, procfs=str(tmp_path), sysfs=str(tmp_path))
    assert not watch.start()
    assert watch.finish("e1", None) is None


def test_unreadable_kmsg_says_why(tmp_path):
    watch = KmsgWatch(str(tmp_path))
    assert not watch.open()
    assert "kernel log not readable" in watch.unavailable
    assert watch.poll() == []


@pytest.mark.skipif(
    not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs a writable /dev/kmsg (root)"
)
def test_kmsg_sees_records_written_after_open():
    watch = KmsgWatch()
    assert watch.open()
    marker = f"denpex-test-{os.getpid()}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<4>{marker} NVRM: Xid (PCI:0000:3b:00): 79, pid=1\n")
    records = [r for r in watch.poll() if marker.encode() in r.body]
    watch.close()
    assert len(records) == 1
    assert records[0].source == "kmsg" and records[0].attrs.get("userspace") is True
    assert records[0].ts_ns is not None
