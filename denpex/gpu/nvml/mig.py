"""MIG devices of a GPU in MIG mode, each its own entity: its handle, MIG UUID, GPU and
compute instance ids, profile name (dcgm-exporter's GPU_I_PROFILE, named the way DCGM names
it: slices and memory, "1g.10gb") and what it answers on its own (memory, processes).

Runs inside the GPU's reader (its worker thread, its error policy); never asks a GPU that
is not in MIG mode, and caches each MIG device's identity until the MIG mode changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: no MIG device at this index


class Reader(Protocol):
    """What a MIG read needs of the parent GPU's reader (query.GpuReader)."""

    nvml: ModuleType
    handle: Any
    errors: dict[str, str]
    mig_identity: dict[int, dict[str, Any]]

    def call(self, key: str, name: str, *args: Any) -> Any: ...

    def attempt(self, name: str, *args: Any) -> tuple[Any, int]: ...


@dataclass(slots=True)
class MigSample:
    """One MIG device in one poll: `values` hold fb_total / fb_used / fb_free (bytes)."""

    slot: int
    uuid: str
    gpu_instance: int
    compute_instance: int
    profile: str
    values: dict[str, float] = field(default_factory=dict)
    processes: list[tuple[int, int]] = field(default_factory=list)


def profile_name(slices: int, memory_mb: int) -> str:
    """DCGM's name for a GPU instance profile: "<slices>g.<memory, GB rounded up>gb"."""
    return f"{slices}g.{(memory_mb + 1023) // 1024}gb"


def read_mig_devices(reader: Reader) -> list[MigSample]:
    parent = reader.handle
    count = reader.call("mig_count", "nvmlDeviceGetMaxMigDeviceCount", parent) or 0
    found = []
    for slot in range(int(count)):
        handle, code = reader.attempt("nvmlDeviceGetMigDeviceHandleByIndex", parent, slot)
        if code == NOT_FOUND:
            continue  # an empty slot: MIG devices need not be numbered densely
        if code:
            reader.errors[f"mig{slot}"] = "nvmlDeviceGetMigDeviceHandleByIndex: " + str(
                reader.nvml.NVMLError(code)
            )
            continue
        identity = reader.mig_identity.get(slot) or _identity(reader, slot, handle)
        if identity:
            reader.mig_identity[slot] = identity
            found.append(_sample(reader, slot, handle, identity))
    return found


def _identity(reader: Reader, slot: int, handle: Any) -> dict[str, Any]:
    uuid = reader.call(f"mig{slot}_uuid", "nvmlDeviceGetUUID", handle)
    gi = reader.call(f"mig{slot}_gi", "nvmlDeviceGetGpuInstanceId", handle)
    ci = reader.call(f"mig{slot}_ci", "nvmlDeviceGetComputeInstanceId", handle)
    if uuid is None or gi is None:
        return {}
    profile = ""
    instance = reader.call(f"mig{slot}_instance", "nvmlDeviceGetGpuInstanceById", reader.handle, gi)
    info = reader.call(f"mig{slot}_info", "nvmlGpuInstanceGetInfo", instance) if instance else None
    if info is not None:
        spec = reader.call(
            f"mig{slot}_profile",
            "nvmlDeviceGetGpuInstanceProfileInfoById",
            reader.handle,
            info.profileId,
        )
        if spec is not None:
            profile = profile_name(int(spec.sliceCount), int(spec.memorySizeMB))
    text = uuid.decode(errors="replace") if isinstance(uuid, bytes) else str(uuid)
    return {"uuid": text, "gi": int(gi), "ci": int(ci or 0), "profile": profile}


def _sample(reader: Reader, slot: int, handle: Any, identity: dict[str, Any]) -> MigSample:
    sample = MigSample(slot, identity["uuid"], identity["gi"], identity["ci"], identity["profile"])
    mem = reader.call(f"mig{slot}_memory", "nvmlDeviceGetMemoryInfo", handle)
    if mem is not None:
        sample.values.update(fb_total=mem.total, fb_used=mem.used, fb_free=mem.free)
    procs = reader.call(f"mig{slot}_processes", "nvmlDeviceGetComputeRunningProcesses", handle)
    for proc in procs or []:
        sample.processes.append((int(proc.pid), int(proc.usedGpuMemory or 0)))
    return sample
