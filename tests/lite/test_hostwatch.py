"""Host evidence for `denpex run` through the collectors' readers: cgroup OOM kills (v1 and v2
fixture trees), kernel-log records and their lost-record count, attribution job/host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from denpex.core.events import Event
from denpex.core.kmsg import TEST_MARKER, KmsgRecord, format_record
from denpex.core.roots import Roots
from denpex.lite.hostwatch import RunHostWatch, attribution
from denpex.lite.job_processes import JobProcesses
from tests.kernel_log import needs_kernel_log

PID = os.getpid()  # the watch locates the cgroup of the process that runs it


def make_tree(tmp_path: Path, version: str) -> tuple[Roots, Path]:
    proc, sys_, dev = tmp_path / "proc", tmp_path / "sys", tmp_path / "dev"
    (proc / str(PID)).mkdir(parents=True)
    dev.mkdir()
    if version == "v1":
        (proc / str(PID) / "cgroup").write_text("5:cpu:/\n4:memory:/slurm/job42\n0::/\n")
        (sys_ / "fs/cgroup/memory").mkdir(parents=True)
        folder = sys_ / "fs/cgroup/memory/slurm/job42"
        folder.mkdir(parents=True)
        (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
        (folder / "memory.failcnt").write_text("10\n")
    else:
        (proc / str(PID) / "cgroup").write_text("0::/system.slice/job42.scope\n")
        (sys_ / "fs/cgroup").mkdir(parents=True)
        (sys_ / "fs/cgroup/cgroup.controllers").write_text("memory pids\n")
        folder = sys_ / "fs/cgroup/system.slice/job42.scope"
        folder.mkdir(parents=True)
        (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    return Roots(procfs=str(proc), sysfs=str(sys_), devfs=str(dev)), folder


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroup_oom_kill_during_the_run_is_evidence(tmp_path, version):
    roots, folder = make_tree(tmp_path, version)
    watch = RunHostWatch(roots, host="node1")
    assert watch.memcg == ("/slurm/job42" if version == "v1" else "/system.slice/job42.scope")
    watch.poll_cgroup(force=True)
    assert watch.cgroup_evidence == []  # the kills before the run are not the job's
    if version == "v1":
        (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    else:
        (folder / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    watch.poll_cgroup(force=True)
    [evidence] = watch.cgroup_evidence
    assert (evidence.signature, evidence.category, evidence.event.host) == (
        "host.oom_killed.cgroup_oom_kill",
        "host.oom_killed",
        "node1",
    )
    assert evidence.captures["count"] == "1"
    assert "kernel log not readable" in " ".join(watch.notes)


def test_missing_cgroup_is_reported_not_raised(tmp_path):
    watch = RunHostWatch(Roots(procfs=str(tmp_path), sysfs=str(tmp_path), devfs=str(tmp_path)))
    assert watch.cgroup is None and watch.memcg is None
    assert any("no memory cgroup" in n for n in watch.notes)
    assert watch.kernel_records() == [] and watch.lost_records == 0


def _raw(seq: int, message: str) -> bytes:
    return format_record(KmsgRecord(0, 3, seq, seq * 1000, "-", message))


def test_kernel_records_come_through_the_collector_and_lost_ones_are_counted_by_seq(
    tmp_path, monkeypatch
):
    roots, _ = make_tree(tmp_path, "v1")
    (tmp_path / "dev" / "kmsg").write_bytes(b"")  # opens like the device; records are scripted
    watch = RunHostWatch(roots, host="node1")
    assert watch.kmsg is not None
    batches = [
        [_raw(5, "Out of memory: Killed process 4242 (python) total-vm:1kB")],
        [_raw(9, f"{TEST_MARKER} NVRM: Xid (PCI:0000:3b:00): 79, pid=77, GPU has fallen off")],
    ]
    watch.kmsg.read_raw = lambda limit: batches.pop(0) if batches else []  # type: ignore[method-assign]
    [first] = watch.kernel_records()
    assert (first.source, first.pid, first.body[:13]) == ("kmsg", 4242, b"Out of memory")
    assert first.attrs["kmsg_seq"] == 5 and first.ts_ns is not None
    monkeypatch.delenv("DENPEX_TEST_KMSG", raising=False)
    assert watch.kernel_records() == []  # a test's marked line, outside a test run: ignored
    assert watch.lost_records == 3  # seq 6, 7 and 8 were overwritten (not: one per EPIPE)


def _job(tmp_path: Path) -> JobProcesses:
    proc = tmp_path / "proc"
    for pid, ppid in ((100, 1), (101, 100)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python) S {ppid} 1 1 0 -1 0 " + "0 " * 40)
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "task" / str(pid) / "children").write_text("101 " if pid == 100 else "")
        (proc / str(pid) / "environ").write_bytes(b"RANK=1\0LOCAL_RANK=1\0" if pid == 101 else b"")
        (proc / str(pid) / "maps").write_text(
            "7f0-7f1 rw-s 00000000 00:05 12 /dev/nvidia1\n" if pid == 101 else ""
        )
    gpus = proc / "driver/nvidia/gpus"
    for minor, pci in ((0, "0000:3b:00.0"), (1, "0000:5e:00.0")):
        (gpus / pci).mkdir(parents=True)
        (gpus / pci / "information").write_text(f"Model: H100\nDevice Minor: \t {minor}\n")
    job = JobProcesses(Roots(procfs=str(proc)), 100)
    job.poll()
    assert set(job.processes) == {100, 101} and job.rank_of(101) == 1
    assert job.gpus_held() == {"0000:5e:00"}
    return job


@pytest.mark.parametrize(
    "body,pid,attrs,expected",
    [
        ("Out of memory: Killed process 101 (python)", 101, {}, "job"),
        ("Out of memory: Killed process 999 (python)", 999, {}, "host"),
        (
            "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/job/a",
            999,
            {"cgroup": "/job/a"},
            "job",
        ),
        (
            "oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/other",
            999,
            {"cgroup": "/other"},
            "host",
        ),
        ("NVRM: Xid (PCI:0000:5e:00): 79, pid=999, GPU has fallen off the bus.", 999, {}, "job"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=999, GPU has fallen off the bus.", 999, {}, "host"),
        ("NVRM: Xid (PCI:0000:3b:00): 13, pid=101, Graphics Exception", 101, {}, "job"),
        ("EXT4-fs error (device sda1): ext4_find_entry", None, {}, "host"),
    ],
)
def test_attribution_of_kernel_records(tmp_path, body, pid, attrs, expected):
    job = _job(tmp_path)
    event = Event(body=body, source="kmsg", kind="line", pid=pid, attrs=attrs)
    assert attribution(event, job, "/job") == expected


def test_cgroup_counters_are_the_jobs_unless_the_cgroup_is_the_root(tmp_path):
    job = _job(tmp_path)
    event = Event(body="oom_kill 1 -> 2", source="cgroup", kind="state")
    assert attribution(event, job, "/slurm/job42") == "job"
    assert attribution(event, job, "/") == "host"


@needs_kernel_log
def test_real_kernel_log_records_written_after_the_watch_opened():
    watch = RunHostWatch(host="node1")
    assert watch.kmsg is not None
    line = f"<4>NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off {TEST_MARKER}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"{line} {os.getpid()}\n")
    records = [r for r in watch.kernel_records() if str(os.getpid()).encode() in r.body]
    watch.close()
    assert len(records) == 1
    [record] = records
    assert record.source == "kmsg" and record.attrs.get("userspace") is True
    assert record.pid == 1 and record.ts_ns is not None and watch.lost_records == 0
