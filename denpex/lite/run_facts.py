"""What a job report tells the control plane beyond its diagnosis: when the job started,
the workload's name, the GPUs each rank held on this host (PCI address, UUID and VBIOS from
the driver's /proc/driver/nvidia/gpus/<pci>/information, the board serial from NVML) and the
shared dependencies it ran on (driver, kernel, and the site's own DENPEX_LABELS such as the
image).

The fleet rules read these (denpex.control.fleet.reports): the labels name a rollout, the
GPUs a board that follows its serial and UUID. Reads files under the configured roots and the
environment; NVML only through a `BoardLookup` started with the job and waited on for a
bounded time (a hung driver must not hold the job's exit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from denpex.core.roots import Roots, read_text
from denpex.lite.job_processes import JobProcesses, pci_key

if TYPE_CHECKING:
    from denpex.gpu.nvml.boards import BoardLookup

NAME_VARIABLES = ("DENPEX_JOB_NAME", "SLURM_JOB_NAME", "PBS_JOBNAME", "LSB_JOBNAME")
LABELS_VARIABLE = "DENPEX_LABELS"  # "image=registry/train:2.4,filesystem=lustre-a"
_FIELD = re.compile(r"^([A-Za-z ]+):[ \t]*(.*?)\s*$", re.MULTILINE)
_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def start_board_lookup(roots: Roots) -> BoardLookup | None:
    """Read the boards' serials through NVML, from now on, when the NVIDIA driver lists a
    GPU here (no NVML library is loaded on a host without one)."""
    try:
        if not os.listdir(roots.proc("driver", "nvidia", "gpus")):
            return None
    except OSError:
        return None
    from denpex.gpu.nvml.boards import BoardLookup  # only here: a run without GPUs skips it

    return BoardLookup()


def gpu_information(roots: Roots) -> dict[str, dict[str, str]]:
    """PCI key → {uuid, vbios} of every NVIDIA GPU the driver lists here."""
    folder = roots.proc("driver", "nvidia", "gpus")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    out: dict[str, dict[str, str]] = {}
    for name in names:
        fields = dict(_FIELD.findall(read_text(folder / name / "information") or ""))
        out[pci_key(name)] = {
            key: fields[field]
            for key, field in (("uuid", "GPU UUID"), ("vbios", "Video BIOS"))
            if fields.get(field)
        }
    return out


def host_labels(roots: Roots, env: Mapping[str, str], *, on_this_host: bool) -> dict[str, str]:
    """driver (the loaded NVIDIA kernel module) and kernel (its release) of a job that ran
    on this host, and DENPEX_LABELS (which win)."""
    labels: dict[str, str] = {}
    if on_this_host:
        labels.update(_driver_and_kernel(roots))
    for item in (env.get(LABELS_VARIABLE) or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() and value.strip():
            labels[key.strip()] = value.strip()
    return labels


def _driver_and_kernel(roots: Roots) -> dict[str, str]:
    labels: dict[str, str] = {}
    driver = _DRIVER.search(read_text(roots.proc("driver", "nvidia", "version")) or "")
    if driver:
        labels["driver"] = driver.group(1)
    kernel = (read_text(roots.proc("sys", "kernel", "osrelease")) or "").strip()
    if kernel:
        labels["kernel"] = kernel
    return labels


def workload_name(env: Mapping[str, str], argv: Sequence[str] = ()) -> str | None:
    """The scheduler's job name, else the command line (reruns of a workload share it)."""
    for variable in NAME_VARIABLES:
        if env.get(variable):
            return env[variable]
    return " ".join(argv)[:200] or None


def rank_gpus(
    processes: JobProcesses | None,
    roots: Roots,
    host: str,
    boards: Mapping[str, Mapping[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """[{host, rank, pci, serial, uuid, vbios}] for each GPU a rank's process held (opened,
    or was given through CUDA_VISIBLE_DEVICES); GPUs held by no known rank are listed without
    one. `boards`: NVML's identities by PCI bus id (BoardLookup), which add the serial."""
    if processes is None:
        return []
    info = gpu_information(roots)
    for bus_id, board in (boards or {}).items():
        info[pci_key(bus_id)] = {**board, **info.get(pci_key(bus_id), {})}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for rank, proc in sorted(processes.rank_processes().items()):
        for pci in sorted(processes.gpus_of(proc)):
            seen.add(pci)
            out.append({"host": host, "rank": rank, "pci": pci, **info.get(pci, {})})
    for pci in sorted(processes.gpus_held() - seen):
        out.append({"host": host, "pci": pci, **info.get(pci, {})})
    return out


def run_facts(
    *,
    roots: Roots,
    env: Mapping[str, str],
    host: str,
    started_ns: int | None,
    processes: JobProcesses | None,
    argv: Sequence[str] = (),
    on_this_host: bool = True,
    boards: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """The report fields of one run: started_ns, name, gpus and labels (those known)."""
    facts: dict[str, Any] = {
        "gpus": rank_gpus(processes, roots, host, boards),
        "labels": host_labels(roots, env, on_this_host=on_this_host),
    }
    name = workload_name(env, argv)
    if name:
        facts["name"] = name
    if started_ns is not None:
        facts["started_ns"] = started_ns
    return facts
