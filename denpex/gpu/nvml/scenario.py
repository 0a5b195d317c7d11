"""Scenarios for the fake NVML library: validate a YAML scenario, write the line file the C
library (`fake.c`) reads, and compile that library on demand into a cache folder.

Used by tests and by `DENPEX_NVML_SHIM=1` demos; never loads anything into a process that
did not ask for the shim, and never touches a real GPU.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from denpex.core import caches

SCENARIO_ENV = "DENPEX_FAKE_NVML_SCENARIO"  # the line file, read by the C library at nvmlInit
LIBRARY_NAME = "libnvidia-ml.so.1"
SOURCES = ("fake.h", "fake.c", "fake_mig.c", "fake_events.c")  # the C library, shipped as source

# property → type; the C library reads each under the same name
INT_PROPERTIES = (
    "utilization_gpu",
    "utilization_memory",
    "memory_total_mib",
    "memory_used_mib",
    "temperature_c",
    "margin_temperature_c",
    "power_mw",
    "power_limit_mw",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clocks_event_reasons",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "retired_sbe",
    "retired_dbe",
    "remap_corrected",
    "remap_uncorrected",
    "remap_pending",
    "remap_failed",
    "remap_bank_max",
    "remap_bank_high",
    "remap_bank_partial",
    "remap_bank_low",
    "remap_bank_none",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "pcie_replays",
    "nvlink_links",
    "fabric_state",
    "fabric_status",
    "fabric_clique",
    "fabric_health_mask",
    "fabric_health_summary",
    "fabric_info_max_version",
    "lost",
    "reset_required",
    "pci_device_id",
    "memory_reserved_mib",
    "memory_temperature_c",
    "energy_mj",
    "utilization_encoder",
    "utilization_decoder",
    "nvlink_tx_kib",
    "nvlink_rx_kib",
    "recovery_action",
    "supported_events",
    "mig_mode",
    "mig_mode_pending",
)
STR_PROPERTIES = ("name", "uuid", "serial", "pci_bus_id", "processes", "vbios_version")
# nvlink<N>_active / nvlink<N>_<counter>, unsupported:<nvml function> (answers NOT_SUPPORTED)
# and error:<nvml function> (answers the NVML return code named in NVML_RETURN) are accepted
NVLINK_COUNTERS = ("active", "replay", "recovery", "crc_flit", "crc_data", "ecc_data")
EVENT_TYPES = {
    "single_bit_ecc": 0x1,
    "double_bit_ecc": 0x2,
    "xid": 0x8,
    "recovery_action": 0x8000,
}
TIMELINE_ACTIONS = ("set", "xid", "event", "hang")
# nvmlReturn_t codes a scenario can make a call answer (nvml.h)
NVML_RETURN = {
    "not_supported": 3,
    "no_permission": 4,
    "not_found": 6,
    "insufficient_power": 8,
    "timeout": 10,
    "irq_issue": 11,
    "gpu_is_lost": 15,
    "reset_required": 16,
    "argument_version_mismatch": 25,
    "gpu_not_found": 28,
    "unknown": 999,
}
# one MIG device of a GPU's `mig` list → the mig<slot>_<name> properties the C library reads
MIG_FIELDS = {
    "gi": int,
    "ci": int,
    "profile_id": int,
    "slices": int,
    "memory_mib": int,
    "used_mib": int,
    "uuid": str,
    "name": str,
    "processes": str,
}
MIG_PROPERTY = {"memory_mib": "memory_total_mib", "used_mib": "memory_used_mib"}

DEFAULTS: dict[str, Any] = {
    "name": "NVIDIA H100 80GB HBM3",
    "vbios_version": "96.00.89.00.01",
    "memory_total_mib": 81559,
    "memory_used_mib": 0,
    "temperature_c": 40,
    "power_mw": 70000,
    "power_limit_mw": 700000,
}


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names every problem with its key."""


class FakeLibraryError(RuntimeError):
    """The fake library cannot be built here (no C compiler, compile failure)."""


@dataclass(frozen=True, slots=True)
class Line:
    t: float
    gpu: int  # -1: the whole system
    key: str
    value: str

    def render(self) -> str:
        return f"{self.t:.6f}\t{self.gpu}\t{self.key}\t{self.value}\n"


def _check_property(key: str, value: Any, where: str) -> str | None:
    if key in STR_PROPERTIES:
        return None if isinstance(value, str | int) else f"{where}.{key}: a string"
    if key.startswith("error:"):
        ok = value in NVML_RETURN or (isinstance(value, int) and value > 0)
        return None if ok else f"{where}.{key}: one of {', '.join(NVML_RETURN)}"
    if key in INT_PROPERTIES or _is_nvlink_key(key) or key.startswith("unsupported:"):
        ok = isinstance(value, bool | int) and int(value) >= 0
        return None if ok else f"{where}.{key}: a non-negative integer"
    return f"{where}.{key}: unknown property"


def _mig_lines(devices: Any, index: int, where: str) -> tuple[list[Line], list[str]]:
    """A GPU's `mig` list (one mapping per MIG device) → its mig_count and mig<slot>_* lines."""
    if not isinstance(devices, list) or len(devices) > 7:
        return [], [f"{where}.mig: a list of at most 7 MIG devices"]
    lines, problems = [Line(0.0, index, "mig_count", str(len(devices)))], []
    for slot, device in enumerate(devices):
        if not isinstance(device, Mapping):
            problems.append(f"{where}.mig[{slot}]: a mapping of {', '.join(MIG_FIELDS)}")
            continue
        fields = {
            "uuid": f"MIG-{index:08x}-{slot:04x}-4e56-8d2f-fake{slot:08x}",
            "name": f"NVIDIA H100 80GB HBM3 MIG {device.get('slices', 1)}g",
            "ci": 0,
            **device,
        }
        for name, value in fields.items():
            kind = MIG_FIELDS.get(str(name))
            if kind is None or not isinstance(value, kind) or isinstance(value, bool):
                problems.append(f"{where}.mig[{slot}].{name}: unknown or not a {kind}")
                continue
            key = f"mig{slot}_{MIG_PROPERTY.get(str(name), name)}"
            lines.append(Line(0.0, index, key, str(value)))
    return lines, problems


def _is_nvlink_key(key: str) -> bool:
    head, _, counter = key.partition("_")
    return head.startswith("nvlink") and head[6:].isdigit() and counter in NVLINK_COUNTERS


def _value(value: Any, key: str = "") -> str:
    if key.startswith("error:") and isinstance(value, str):
        return str(NVML_RETURN[value])  # the return code, named in the scenario
    return str(int(value)) if isinstance(value, bool) else str(value)


def identity(index: int) -> dict[str, Any]:
    """Deterministic identity of GPU `index` when the scenario gives none."""
    return {
        "uuid": f"GPU-{index:08x}-fake-4e56-8d2f-{index:012x}",
        "serial": f"165{index:010d}",
        "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
    }


def compile_scenario(data: Mapping[str, Any], where: str = "scenario") -> list[Line]:
    """A parsed YAML scenario → the sorted lines of the C library's file (pure)."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: a YAML mapping (gpus, defaults, gpu, timeline)")
    known = {"description", "gpus", "driver_version", "init_error", "defaults", "gpu", "timeline"}
    unknown = set(data) - known
    problems += [f"{where}: unknown key {k!r}" for k in sorted(unknown, key=str)]
    count = data.get("gpus")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 64:
        raise ScenarioError("; ".join([*problems, f"{where}.gpus: a number of GPUs, 0 to 64"]))
    lines = [Line(0.0, -1, "gpu_count", str(count))]
    lines.append(Line(0.0, -1, "driver_version", str(data.get("driver_version", "550.54.15"))))
    if "init_error" in data:
        if data["init_error"] not in NVML_RETURN:
            problems.append(f"{where}.init_error: one of {', '.join(NVML_RETURN)}")
        else:
            lines.append(Line(0.0, -1, "init_error", str(NVML_RETURN[data["init_error"]])))
    defaults = {**DEFAULTS, **(data.get("defaults") or {})}
    per_gpu = data.get("gpu") or {}
    if not isinstance(per_gpu, Mapping):
        problems.append(f"{where}.gpu: a mapping of GPU index to properties")
        per_gpu = {}
    for index in per_gpu:
        if not isinstance(index, int) or not 0 <= index < count:
            problems.append(f"{where}.gpu.{index}: no such GPU (0..{count - 1})")
    for index in range(count):
        props = {**identity(index), **defaults, **(per_gpu.get(index) or {})}
        if "mig" in props:
            found, bad = _mig_lines(props.pop("mig"), index, f"{where}.gpu.{index}")
            lines += found
            problems += bad
        for key, value in props.items():
            problem = _check_property(str(key), value, f"{where}.gpu.{index}")
            if problem:
                problems.append(problem)
            else:
                lines.append(Line(0.0, index, str(key), _value(value, str(key))))
    for n, step in enumerate(data.get("timeline") or []):
        problems += _timeline_step(step, count, f"{where}.timeline[{n}]", lines)
    if problems:
        raise ScenarioError("; ".join(dict.fromkeys(problems)))
    return sorted(lines, key=lambda line: line.t)  # stable: file order within one time


def _timeline_step(step: Any, count: int, where: str, out: list[Line]) -> list[str]:
    if not isinstance(step, Mapping):
        return [f"{where}: a mapping with t, gpu and one of {', '.join(TIMELINE_ACTIONS)}"]
    t, gpu = step.get("t"), step.get("gpu")
    if not isinstance(t, int | float) or t < 0:
        return [f"{where}.t: seconds since nvmlInit (>= 0)"]
    if not isinstance(gpu, int) or not 0 <= gpu < count:
        return [f"{where}.gpu: a GPU index 0..{count - 1}"]
    actions = [a for a in TIMELINE_ACTIONS if a in step]
    if len(actions) != 1:
        return [f"{where}: exactly one of {', '.join(TIMELINE_ACTIONS)}"]
    action = actions[0]
    if action == "set":
        props = step["set"]
        if not isinstance(props, Mapping):
            return [f"{where}.set: a mapping of properties"]
        problems = [p for k, v in props.items() if (p := _check_property(str(k), v, where))]
        out += [
            Line(float(t), gpu, str(k), _value(v, str(k)))
            for k, v in props.items()
            if not _check_property(str(k), v, where)
        ]
        return problems
    if action == "hang":
        hold = step.get("for_s", 3600)
        if not isinstance(step["hang"], str) or not str(step["hang"]).startswith("nvml"):
            return [f"{where}.hang: the NVML function to hang, e.g. nvmlDeviceGetPowerUsage"]
        out.append(Line(float(t), gpu, f"hang:{step['hang']}", str(float(hold))))
        return []
    repeat, every = step.get("repeat", 1), step.get("every_s", 0.0)
    if not isinstance(repeat, int) or repeat < 1 or not isinstance(every, int | float):
        return [f"{where}: repeat is a count >= 1 and every_s a number of seconds"]
    if action == "xid":
        if not isinstance(step["xid"], int) or step["xid"] <= 0:
            return [f"{where}.xid: a positive Xid code"]
        kind, data = EVENT_TYPES["xid"], int(step["xid"])
    else:
        if step["event"] not in EVENT_TYPES or step["event"] == "xid":
            names = ", ".join(e for e in EVENT_TYPES if e != "xid")
            return [f"{where}.event: one of {names}"]
        kind, data = EVENT_TYPES[step["event"]], 0
    out += [Line(float(t) + i * every, gpu, "event", f"{kind} {data}") for i in range(repeat)]
    return []


def load_scenario(path: str | Path) -> list[Line]:
    """Read and validate a YAML scenario file; ScenarioError names the file and every problem."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    return compile_scenario(data, str(path))


def write_lines(lines: list[Line], path: Path) -> Path:
    path.write_text("".join(line.render() for line in lines))
    return path


def cache_dir() -> Path:
    return caches.cache_dir("nvml-fake")


def build_fake_library(where: Path | None = None) -> Path:
    """Compile the fake libnvidia-ml.so.1 (shipped as C source) with the system C compiler,
    once per source version; returns its path. FakeLibraryError when it cannot."""
    package = resources.files("denpex.gpu.nvml")
    sources = {name: package.joinpath(name).read_bytes() for name in SOURCES}
    digest = hashlib.sha256(b"".join(sources[name] for name in SOURCES)).hexdigest()[:12]
    folder = (where or cache_dir()) / digest
    target = folder / LIBRARY_NAME
    if target.exists():
        return target
    wanted = os.environ.get("CC")
    compiler = shutil.which(wanted) if wanted else shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise FakeLibraryError(
            "no C compiler found (cc, gcc or $CC) to build the fake libnvidia-ml.so.1 the "
            "NVML shim loads: install gcc, or unset DENPEX_NVML_SHIM"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        for name, text in sources.items():
            Path(scratch, name).write_bytes(text)
        built = Path(scratch, LIBRARY_NAME)
        c_files = [str(Path(scratch, name)) for name in SOURCES if name.endswith(".c")]
        result = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(built), *c_files],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise FakeLibraryError(
                f"compiling the fake NVML library with {compiler} failed: {result.stderr[-500:]}"
            )
        os.replace(built, target)  # atomic: a concurrent build sees all or nothing
    return target


def prepare_shim(scenario: str | Path, where: Path | None = None) -> Path:
    """Validate `scenario`, write its line file, point the C library at it (environment) and
    return the built library's path, ready for pynvml to load."""
    lines = load_scenario(scenario)
    folder = where or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256("".join(x.render() for x in lines).encode()).hexdigest()[:12]
    line_file = write_lines(lines, folder / f"scenario-{digest}.txt")
    os.environ[SCENARIO_ENV] = str(line_file)
    return build_fake_library(where)
