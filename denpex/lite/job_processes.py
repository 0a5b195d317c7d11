"""What the wrapper knows of its job's processes: the tree, their ranks, the GPUs they hold.

Polled from the analyzer process while the job runs (a few /proc reads per process), so a
kernel record about a process that has already exited is still tied to the job. Reads only
through `Roots` with the collectors' parsers (`host/procfs.py`); never signals, traces or
writes to a process, and never raises for one that vanished mid-read.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from denpex.core.roots import Roots, read_text
from denpex.host.procfs import RANK_VARIABLES, descendants, parse_environ, read_bytes, read_stat

GPU_SCAN_S = 5.0  # how often a live process's mappings are read for the GPUs it opened
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
_NVIDIA_DEVICE = re.compile(r"/dev/nvidia(\d{1,3})$")
_XID_PCI = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})")
_MINOR = re.compile(r"^Device Minor:[ \t]*(\d+)", re.MULTILINE)


class ProcessNoted(Protocol):
    """Told of every process whose environment names a rank (`Scanner.note_process`)."""

    def __call__(
        self, pid: int, *, rank: int | None = ..., local_rank: int | None = ...
    ) -> None: ...


def pci_key(address: str) -> str:
    """A PCI address as domain:bus:device, lower case ('0000:3B:00.0' → '0000:3b:00'); the
    kernel's Xid line omits the function, sysfs and the driver name it."""
    parts = address.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    domain, bus, device = parts[0][-4:].rjust(4, "0"), parts[1], parts[2].split(".")[0]
    return f"{domain}:{bus}:{device}"


def ranks_from_environ(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(rank, local rank) a launcher gave a process: RANK, SLURM_PROCID, OMPI/PMI ranks, else
    torchrun's GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK; (None, None) for none."""
    local = next((int(env[n]) for n in LOCAL_RANK_VARIABLES if env.get(n, "").isdigit()), None)
    rank = next((int(env[n]) for n in RANK_VARIABLES if env.get(n, "").isdigit()), None)
    group, size = env.get("GROUP_RANK", ""), env.get("LOCAL_WORLD_SIZE", "")
    if rank is None and local is not None and group.isdigit() and size.isdigit():
        rank = int(group) * int(size) + local
    return rank, local


def gpu_minors_in_maps(text: str) -> set[int]:
    """Minor numbers of the /dev/nvidiaN devices a process has mapped."""
    found = set()
    for line in text.splitlines():
        hit = _NVIDIA_DEVICE.search(line)
        if hit:
            found.add(int(hit.group(1)))
    return found


def nvidia_gpus(roots: Roots) -> dict[int, str]:
    """Device minor → PCI key, from the driver's /proc/driver/nvidia/gpus/<pci>/information."""
    folder = roots.proc("driver", "nvidia", "gpus")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    gpus = {}
    for name in names:
        found = _MINOR.search(read_text(folder / name / "information") or "")
        if found:
            gpus[int(found.group(1))] = pci_key(name)
    return gpus


@dataclass(slots=True)
class JobProcess:
    pid: int
    comm: str = ""
    rank: int | None = None
    local_rank: int | None = None
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as the process got it
    gpu_minors: set[int] = field(default_factory=set)
    alive: bool = True
    first_seen: float = 0.0
    gpus_scanned: float = 0.0


class JobProcesses:
    """The job's process tree below `root_pid`, polled; processes are remembered after exit."""

    def __init__(self, roots: Roots, root_pid: int, on_process: ProcessNoted | None = None) -> None:
        self.roots = roots
        self.root_pid = root_pid
        self.on_process = on_process
        self.processes: dict[int, JobProcess] = {}
        self._gpus: dict[int, str] | None = None

    def poll(self) -> None:
        """Find the processes below the root now; read each new one's environment once."""
        now = time.monotonic()
        alive = set(descendants(self.roots, self.root_pid))
        for pid in alive - self.processes.keys():
            self._add(pid, now)
        for pid, proc in self.processes.items():
            proc.alive = pid in alive
            if proc.alive and now - proc.gpus_scanned >= GPU_SCAN_S:
                self._scan_gpus(proc, now)

    def _add(self, pid: int, now: float) -> None:
        stat = read_stat(self.roots, pid)
        env = parse_environ(read_bytes(self.roots.proc(pid, "environ")) or b"")
        rank, local = ranks_from_environ(env)
        proc = JobProcess(pid, stat.comm if stat else "", rank, local, first_seen=now)
        proc.visible_devices = env.get("CUDA_VISIBLE_DEVICES")
        self.processes[pid] = proc
        self._scan_gpus(proc, now)
        if self.on_process is not None and (rank is not None or local is not None):
            self.on_process(pid, rank=rank, local_rank=local)

    def _scan_gpus(self, proc: JobProcess, now: float) -> None:
        proc.gpus_scanned = now
        proc.gpu_minors |= gpu_minors_in_maps(read_text(self.roots.proc(proc.pid, "maps")) or "")

    def knows(self, pid: int) -> bool:
        """True when `pid` is (or was) one of the job's processes; a live process not seen
        yet is looked up through its parents, so a short-lived one is not missed."""
        if pid in self.processes or pid == self.root_pid:
            return True
        seen = set()
        current = pid
        while current > 1 and current not in seen:
            seen.add(current)
            stat = read_stat(self.roots, current)
            if stat is None:
                return False
            if stat.ppid == self.root_pid or stat.ppid in self.processes:
                self._add(pid, time.monotonic())
                return True
            current = stat.ppid
        return False

    def rank_processes(self) -> dict[int, JobProcess]:
        """rank → its main process (the topmost one with that rank: not a DataLoader worker)."""
        found: dict[int, JobProcess] = {}
        for proc in sorted(self.processes.values(), key=lambda p: p.first_seen):
            if proc.rank is not None and proc.rank not in found:
                found[proc.rank] = proc
        return found

    def rank_of(self, pid: int) -> int | None:
        proc = self.processes.get(pid)
        return proc.rank if proc is not None else None

    def gpus_held(self) -> set[str]:
        """PCI keys of the GPUs the job's processes opened (mapped /dev/nvidiaN) or were
        given (CUDA_VISIBLE_DEVICES indices, taken in PCI order: CUDA's order when
        CUDA_DEVICE_ORDER=PCI_BUS_ID or when the GPUs are all alike)."""
        held: set[str] = set()
        for proc in self.processes.values():
            held |= self.gpus_of(proc)
        return held

    def gpus_of(self, proc: JobProcess) -> set[str]:
        """PCI keys of the GPUs one process opened or was given (see gpus_held)."""
        if self._gpus is None:
            self._gpus = nvidia_gpus(self.roots)
        gpus = self._gpus
        in_pci_order = [gpus[m] for m in sorted(gpus, key=lambda m: gpus[m])]
        held = {gpus[m] for m in proc.gpu_minors if m in gpus}
        for item in (proc.visible_devices or "").split(","):
            if item.strip().isdigit() and int(item) < len(in_pci_order):
                held.add(in_pci_order[int(item)])
        return held

    @staticmethod
    def gpu_named_in(message: str) -> str | None:
        """The PCI key of the GPU a kernel (Xid) message is about, or None."""
        found = _XID_PCI.search(message)
        return pci_key(found.group(1)) if found else None
