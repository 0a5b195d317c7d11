"""One GPU's NVML queries for one poll, run on that GPU's own BoundedCaller worker thread.

What a return code means is decided here, once: GPU_IS_LOST and RESET_REQUIRED say the GPU
itself is gone (`GpuGone`); NOT_SUPPORTED and FUNCTION_NOT_FOUND say a query is unsupported
(remembered until the GPU's MIG mode changes, which turns utilisation and remapped rows off
and on); NO_PERMISSION says this user may not ask (remembered); anything else, UNKNOWN (999)
and GPU_NOT_FOUND included, fails that one query for this poll. A GPU whose handle cannot
be had is `GpuUnreadable`. Never raises anything else for an NVML error.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from denpex.gpu.nvml.mig import MigSample, read_mig_devices

NOT_SUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
NO_PERMISSION = 4
ARGUMENT_VERSION_MISMATCH = 25
LOST = (15,)  # NVML_ERROR_GPU_IS_LOST
RESET_REQUIRED = (16,)  # NVML_ERROR_RESET_REQUIRED
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
REMAP_BANKS = ("max", "high", "partial", "low", "none")
# nvmlDeviceGetFieldValues ids (nvml.h) → sample key; a scope of 0xFFFFFFFF is every NVLink
FIELDS = {
    (82, 0): "memory_temp",  # NVML_FI_DEV_MEMORY_TEMP
    (138, 0xFFFFFFFF): "nvlink_data_tx_kib",  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    (139, 0xFFFFFFFF): "nvlink_data_rx_kib",  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    (230, 0): "recovery_action",  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
}
# nvmlGpuFabricInfo structs, newest first: v3 adds the health summary to v2's health mask
FABRIC_STRUCTS = ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")


class GpuGone(Exception):
    """The GPU answered with an error that means it is gone or needs a reset."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call}: {text}")
        self.call = call
        self.code = code
        self.text = text

    @property
    def reset_required(self) -> bool:
        return self.code in RESET_REQUIRED


class GpuUnreadable(Exception):
    """No handle for the GPU this poll (no permission, an unknown error): it cannot be read,
    which is not the same as lost."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call}: {text}")
        self.call, self.code, self.text = call, code, text


@dataclass(slots=True)
class GpuSample:
    """What one GPU answered in one poll: `values` by field name (see metrics.py)."""

    index: int
    identity: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    nvlinks: dict[int, dict[str, int]] = field(default_factory=dict)
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    mig: list[MigSample] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    denied: set[str] = field(default_factory=set)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuReader:
    """Reads one GPU; `current_call` names the NVML function in flight (what a hang report
    quotes). Not thread-safe: only its own worker thread calls `read`."""

    def __init__(self, nvml: ModuleType, index: int, driver_version: str = "") -> None:
        self.nvml = nvml
        self.index = index
        self.driver_version = driver_version
        self.handle: Any = None
        self.identity: dict[str, str] = {}
        self.unsupported: set[str] = set()
        self.denied: set[str] = set()
        self.mig_mode: int | None = None
        self.mig_identity: dict[int, dict[str, Any]] = {}
        self.nvlink_count: int | None = None
        self.current_call = ""
        self.errors: dict[str, str] = {}

    def attempt(self, name: str, *args: Any) -> tuple[Any, int]:
        """pynvml's `name` → (answer, 0), or (None, the NVML return code); GpuGone for the
        codes that mean the GPU itself is gone."""
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            return None, NOT_SUPPORTED[1]
        self.current_call = name
        try:
            return fn(*args), 0
        except self.nvml.NVMLError as exc:
            code = int(exc.value)
            if code in LOST or code in RESET_REQUIRED:
                raise GpuGone(name, code, str(exc)) from None
            return None, code
        finally:
            self.current_call = ""

    def call(self, key: str, name: str, *args: Any) -> Any:
        """The answer of pynvml's `name`, or None when unsupported, refused or failed."""
        if key in self.unsupported or key in self.denied:
            return None
        answer, code = self.attempt(name, *args)
        if code in NOT_SUPPORTED:
            self.unsupported.add(key)
        elif code == NO_PERMISSION:
            self.denied.add(key)
        elif code:
            self.errors[key] = f"{name}: {self.nvml.NVMLError(code)}"
        return answer

    def read(self) -> GpuSample:
        self.errors = {}
        self.read_identity()
        self._read_mig_mode()
        sample = GpuSample(self.index, dict(self.identity))
        if self.mig_mode is not None:
            sample.values["mig_mode"] = float(self.mig_mode)
        self._read_values(sample.values)
        self._read_fields(sample.values)
        self._read_fabric(sample.values)
        self._read_nvlinks(sample)
        procs = self.call("processes", "nvmlDeviceGetComputeRunningProcesses", self.handle)
        for proc in procs or []:
            sample.processes.append((int(proc.pid), int(proc.usedGpuMemory or 0)))
        if self.mig_mode:
            sample.mig = read_mig_devices(self)
        sample.errors, sample.denied = self.errors, set(self.denied)
        return sample

    def read_identity(self) -> dict[str, str]:
        """The GPU's identity (UUID, PCI bus id, board serial, name, VBIOS), read once; ""
        for what the GPU does not answer (a GeForce board has no serial)."""
        if self.handle is None:
            handle, code = self.attempt("nvmlDeviceGetHandleByIndex", self.index)
            if code:
                raise GpuUnreadable(
                    "nvmlDeviceGetHandleByIndex", code, str(self.nvml.NVMLError(code))
                )
            self.handle = handle
        if not self.identity:
            self.identity = self._read_identity()
        return self.identity

    def _read_identity(self) -> dict[str, str]:
        h = self.handle
        pci = self.call("pci", "nvmlDeviceGetPciInfo", h)
        return {
            "uuid": _text(self.call("uuid", "nvmlDeviceGetUUID", h) or ""),
            "pci_bus_id": _text(pci.busId) if pci is not None else "",
            "serial": _text(self.call("serial", "nvmlDeviceGetSerial", h) or ""),
            "name": _text(self.call("name", "nvmlDeviceGetName", h) or ""),
            "vbios": _text(self.call("vbios", "nvmlDeviceGetVbiosVersion", h) or ""),
            "driver_version": self.driver_version,
        }

    def _read_mig_mode(self) -> None:
        """A change of MIG mode makes what the GPU refused worth asking again (and the
        reverse), so nothing learnt under the other mode is kept."""
        modes = self.call("mig_mode", "nvmlDeviceGetMigMode", self.handle)
        mode = int(modes[0]) if modes is not None else None
        if mode != self.mig_mode and modes is not None:
            if self.mig_mode is not None:
                self.unsupported.clear()
                self.nvlink_count = None
            self.mig_identity.clear()
            self.mig_mode = mode

    def _read_values(self, out: dict[str, float]) -> None:
        nvml, h, call = self.nvml, self.handle, self.call
        util = call("util", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            out["util_gpu"], out["util_memory"] = util.gpu, util.memory
        for key, name in (("enc_util", "nvmlDeviceGetEncoderUtilization"),
                          ("dec_util", "nvmlDeviceGetDecoderUtilization")):  # fmt: skip
            answer = call(key, name, h)
            if answer is not None:
                out[key] = float(answer[0])  # [utilisation %, sampling period µs]
        self._read_memory(out)
        scalar = {
            "temperature": ("nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,)),
            "thermal_margin": ("nvmlDeviceGetMarginTemperature", ()),
            "power_mw": ("nvmlDeviceGetPowerUsage", ()),
            "power_limit_mw": ("nvmlDeviceGetPowerManagementLimit", ()),
            "energy_mj": ("nvmlDeviceGetTotalEnergyConsumption", ()),
            "sm_clock": ("nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,)),
            "mem_clock": ("nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_MEM,)),
            "pcie_gen": ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
            "pcie_gen_max": ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
            "pcie_width": ("nvmlDeviceGetCurrPcieLinkWidth", ()),
            "pcie_width_max": ("nvmlDeviceGetMaxPcieLinkWidth", ()),
            "pcie_replays": ("nvmlDeviceGetPcieReplayCounter", ()),
        }
        for key, (name, args) in scalar.items():
            value = call(key, name, h, *args)
            if value is not None:
                out[key] = float(value)
        reasons = call("clocks_event", "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None and "clocks_event" in self.unsupported:
            reasons = call("clocks_throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            out["clocks_event_reasons"] = float(reasons)
        for kind, error_type in (("sbe", 0), ("dbe", 1)):
            for scope, counter_type in (("vol", 0), ("agg", 1)):
                key = f"ecc_{kind}_{scope}"
                value = call(key, "nvmlDeviceGetTotalEccErrors", h, error_type, counter_type)
                if value is not None:
                    out[key] = float(value)
            pages = call(f"retired_{kind}", "nvmlDeviceGetRetiredPages", h, error_type)
            if pages is not None:
                out[f"retired_{kind}"] = float(len(pages))
        rows = call("remap", "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            for key, value in zip(
                ("remap_corr", "remap_unc", "remap_pending", "remap_failed"), rows, strict=True
            ):
                out[key] = float(value)
        banks = call("remap_histogram", "nvmlDeviceGetRowRemapperHistogram", h)
        if banks is not None:
            for bank in REMAP_BANKS:
                out[f"remap_bank_{bank}"] = float(getattr(banks, bank))

    def _read_memory(self, out: dict[str, float]) -> None:
        """nvmlMemory_v2 (with the driver's reserved memory) where the driver has it."""
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        mem = None
        if version is not None:
            mem = self.call("memory_v2", "nvmlDeviceGetMemoryInfo", self.handle, version)
        if mem is None and (version is None or "memory_v2" in self.unsupported):
            mem = self.call("memory", "nvmlDeviceGetMemoryInfo", self.handle)
        if mem is not None:
            out["fb_total"], out["fb_used"], out["fb_free"] = mem.total, mem.used, mem.free
            if hasattr(mem, "reserved"):
                out["fb_reserved"] = mem.reserved

    def _read_fields(self, out: dict[str, float]) -> None:
        """Field values (one call for all): memory temperature, NVLink data throughput and
        the GPU recovery action; a field the GPU does not support is not asked again."""
        wanted = [f for f, key in FIELDS.items() if f"field:{key}" not in self.unsupported]
        if not wanted:
            return
        values = self.call("fields", "nvmlDeviceGetFieldValues", self.handle, wanted)
        for requested, value in zip(wanted, values or [], strict=False):
            key = FIELDS[requested]
            if int(value.nvmlReturn) in NOT_SUPPORTED:
                self.unsupported.add(f"field:{key}")
            elif int(value.nvmlReturn) == 0:
                out[key] = float(_field_value(value))

    def _read_fabric(self, out: dict[str, float]) -> None:
        """The NVSwitch fabric registration: state, status and health mask (v3/v2 structs),
        or the v1 struct (no health) from a driver older than the versioned call."""
        if "fabric" in self.unsupported:
            return
        for struct in FABRIC_STRUCTS:
            info_type = getattr(self.nvml, struct, None)
            if info_type is None:
                continue
            info = info_type()
            _, code = self.attempt("nvmlDeviceGetGpuFabricInfoV", self.handle, ctypes.byref(info))
            if code == ARGUMENT_VERSION_MISMATCH:
                continue  # a driver that knows only an older version of the struct
            if code == NOT_SUPPORTED[0]:
                self.unsupported.add("fabric")
                return
            if code == 0:
                out["fabric_state"], out["fabric_status"] = float(info.state), float(info.status)
                out["fabric_health_mask"] = float(info.healthMask)
                if hasattr(info, "healthSummary"):
                    out["fabric_health_summary"] = float(info.healthSummary)
                return
            if code != NOT_SUPPORTED[1]:
                self.errors["fabric"] = f"nvmlDeviceGetGpuFabricInfoV: {self.nvml.NVMLError(code)}"
                return
            break  # the versioned call is missing: a driver with only the v1 struct
        legacy = getattr(self.nvml, "c_nvmlGpuFabricInfo_t", None)
        if legacy is None:
            self.unsupported.add("fabric")
            return
        info = legacy()
        answer = self.call("fabric", "nvmlDeviceGetGpuFabricInfo", self.handle, ctypes.byref(info))
        if answer is not None:  # pynvml returns NVML_SUCCESS (0) and fills `info`
            out["fabric_state"], out["fabric_status"] = float(info.state), float(info.status)

    def _read_nvlinks(self, sample: GpuSample) -> None:
        if "nvlink" in self.unsupported:
            return
        limit = self.nvlink_count
        for link in range(limit if limit is not None else self.nvml.NVML_NVLINK_MAX_LINKS):
            active, code = self.attempt("nvmlDeviceGetNvLinkState", self.handle, link)
            if code:
                if link == 0 and code in NOT_SUPPORTED:
                    self.unsupported.add("nvlink")
                if limit is None:  # past the last link: remember how many there are
                    self.nvlink_count = link
                break
            counters = {"active": int(active)}
            for number, counter in enumerate(NVLINK_COUNTERS):
                value = self.call(
                    f"nvlink_{counter}",
                    "nvmlDeviceGetNvLinkErrorCounter",
                    self.handle,
                    link,
                    number,
                )
                if value is not None:
                    counters[counter] = int(value)
            sample.nvlinks[link] = counters
        else:
            if limit is None:
                self.nvlink_count = self.nvml.NVML_NVLINK_MAX_LINKS


def _field_value(value: Any) -> float:
    """The number in an nvmlFieldValue_t, by its valueType (nvmlValueType_t)."""
    kind = int(value.valueType)
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    return float(getattr(value.value, member.get(kind, "ullVal")))
