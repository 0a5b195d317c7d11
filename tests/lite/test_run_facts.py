"""The report fields `denpex run` adds to its diagnosis (denpex.lite.run_facts): the GPUs
each rank held with their UUID and VBIOS from the driver's procfs files, the driver and
kernel the job ran on, the workload's name and when it started; a scan of a log from
elsewhere claims none of this host's driver or kernel."""

from __future__ import annotations

from pathlib import Path

from denpex.core.roots import Roots
from denpex.lite.job_processes import JobProcesses
from denpex.lite.run_facts import host_labels, run_facts, start_board_lookup, workload_name

UUID = "GPU-5f0e3a1c-92d4-4e56-8d2f-3a7c1b2e9d40"
# what the 550 driver writes in /proc/driver/nvidia/gpus/<pci>/information
INFORMATION = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 351
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.89.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t {pci}
Device Minor: \t {minor}
GPU Firmware: \t 550.54.15
GPU Excluded:\t No
"""
VERSION = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def fake_proc(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    for pid, ppid, env, maps in (
        (100, 1, b"", ""),
        (101, 100, b"RANK=0\0", "7f0-7f1 rw-s 00000000 00:05 12 /dev/nvidia0\n"),
        (102, 100, b"RANK=1\0CUDA_VISIBLE_DEVICES=1\0", ""),
    ):
        (proc / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python) S {ppid} 1 1 0 -1 0 " + "0 " * 40)
        children = "101 102 " if pid == 100 else ""
        (proc / str(pid) / "task" / str(pid) / "children").write_text(children)
        (proc / str(pid) / "environ").write_bytes(env)
        (proc / str(pid) / "maps").write_text(maps)
    for minor, pci in ((0, "0000:3b:00.0"), (1, "0000:5e:00.0")):
        folder = proc / "driver/nvidia/gpus" / pci
        folder.mkdir(parents=True)
        uuid = UUID if minor == 0 else UUID.replace("9d40", "9d41")
        (folder / "information").write_text(INFORMATION.format(uuid=uuid, pci=pci, minor=minor))
    (proc / "driver/nvidia/version").write_text(VERSION)
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/osrelease").write_text("6.1.0-27-amd64\n")
    return proc


def test_a_run_names_each_rank_gpu_and_what_it_ran_on(tmp_path):
    roots = Roots(procfs=str(fake_proc(tmp_path)))
    job = JobProcesses(roots, 100)
    job.poll()
    env = {"SLURM_JOB_NAME": "llama-70b", "DENPEX_LABELS": "image=train:42, kernel=custom"}
    facts = run_facts(
        roots=roots, env=env, host="node7", started_ns=123, processes=job, argv=["python"]
    )
    assert facts["started_ns"] == 123 and facts["name"] == "llama-70b"
    assert facts["labels"] == {"driver": "550.54.15", "kernel": "custom", "image": "train:42"}
    assert facts["gpus"] == [
        {"host": "node7", "rank": 0, "pci": "0000:3b:00", "uuid": UUID, "vbios": "96.00.89.00.01"},
        {
            "host": "node7",
            "rank": 1,
            "pci": "0000:5e:00",
            "uuid": UUID.replace("9d40", "9d41"),
            "vbios": "96.00.89.00.01",
        },
    ]


def test_a_scan_claims_nothing_of_this_host(tmp_path):
    roots = Roots(procfs=str(fake_proc(tmp_path)))
    assert host_labels(roots, {}, on_this_host=False) == {}
    facts = run_facts(
        roots=roots, env={}, host="h", started_ns=None, processes=None, on_this_host=False
    )
    assert facts == {"gpus": [], "labels": {}}
    assert workload_name({}, ["python", "train.py"]) == "python train.py"
    assert workload_name({}, []) is None


def test_nvml_adds_each_boards_serial_by_its_bus_id(tmp_path):
    roots = Roots(procfs=str(fake_proc(tmp_path)))
    job = JobProcesses(roots, 100)
    job.poll()
    boards = {  # what BoardLookup read through NVML: NVML's bus ids, upper case, 8-digit domain
        "00000000:3B:00.0": {"serial": "1652923012345", "uuid": UUID, "vbios": "96.00.89.00.01"},
        "00000000:5E:00.0": {"uuid": UUID.replace("9d40", "9d41")},  # a board with no serial
        "00000000:AF:00.0": {"serial": "1652923099999"},  # held by no rank of this job
    }
    facts = run_facts(roots=roots, env={}, host="node7", started_ns=1, processes=job, boards=boards)
    assert [(g["rank"], g["pci"], g.get("serial")) for g in facts["gpus"]] == [
        (0, "0000:3b:00", "1652923012345"),
        (1, "0000:5e:00", None),
    ]
    assert facts["gpus"][0]["uuid"] == UUID and facts["gpus"][0]["vbios"] == "96.00.89.00.01"


def test_no_nvml_lookup_on_a_host_without_nvidia_gpus(tmp_path):
    assert start_board_lookup(Roots(procfs=str(tmp_path))) is None
