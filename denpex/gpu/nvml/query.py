"""One GPU's NVML queries for one poll, run on that GPU's own BoundedCaller worker thread.

Remembers which queries a GPU does not support (NOT_SUPPORTED, FUNCTION_NOT_FOUND, or a
pynvml without the function) so they are never retried; never raises for an NVML error
except `GpuGone`, which says the GPU itself stopped answering (lost, reset required).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

NOT_SUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
LOST = (15, 28, 999)  # GPU_IS_LOST, GPU_NOT_FOUND, UNKNOWN: the GPU existed and is gone
RESET_REQUIRED = (16,)
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
REMAP_BANKS = ("max", "high", "partial", "low", "none")


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


@dataclass(slots=True)
class GpuSample:
    """What one GPU answered in one poll: `values` by field name (see metrics.py)."""

    index: int
    identity: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)
    nvlinks: dict[int, dict[str, int]] = field(default_factory=dict)
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    errors: dict[str, str] = field(default_factory=dict)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuReader:
    """Reads one GPU; `current_call` names the NVML function in flight (what a hang report
    quotes). Not thread-safe: only its own worker thread calls `read`."""

    def __init__(self, nvml: ModuleType, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.handle: Any = None
        self.identity: dict[str, str] = {}
        self.unsupported: set[str] = set()
        self.nvlink_count: int | None = None
        self.current_call = ""
        self.errors: dict[str, str] = {}

    def _call(self, key: str, name: str, *args: Any) -> Any:
        """The answer of pynvml's `name`, or None when unsupported or failed this poll."""
        if key in self.unsupported:
            return None
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            self.unsupported.add(key)
            return None
        self.current_call = name
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = int(exc.value)
            if code in NOT_SUPPORTED:
                self.unsupported.add(key)
            elif code in LOST or code in RESET_REQUIRED:
                raise GpuGone(name, code, str(exc)) from None
            else:
                self.errors[key] = f"{name}: {exc}"
            return None
        finally:
            self.current_call = ""

    def read(self) -> GpuSample:
        self.errors = {}
        if self.handle is None:
            self.handle = self._call("handle", "nvmlDeviceGetHandleByIndex", self.index)
            if self.handle is None:
                return GpuSample(self.index, dict(self.identity), errors=self.errors)
        if not self.identity:
            self.identity = self._read_identity()
        sample = GpuSample(self.index, dict(self.identity))
        self._read_values(sample.values)
        self._read_nvlinks(sample)
        procs = self._call("processes", "nvmlDeviceGetComputeRunningProcesses", self.handle)
        for proc in procs or []:
            sample.processes.append((int(proc.pid), int(proc.usedGpuMemory or 0)))
        sample.errors = self.errors
        return sample

    def _read_identity(self) -> dict[str, str]:
        h = self.handle
        pci = self._call("pci", "nvmlDeviceGetPciInfo", h)
        return {
            "uuid": _text(self._call("uuid", "nvmlDeviceGetUUID", h) or ""),
            "pci_bus_id": _text(pci.busId) if pci is not None else "",
            "serial": _text(self._call("serial", "nvmlDeviceGetSerial", h) or ""),
            "name": _text(self._call("name", "nvmlDeviceGetName", h) or ""),
        }

    def _read_values(self, out: dict[str, float]) -> None:
        nvml, h, call = self.nvml, self.handle, self._call
        util = call("util", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            out["util_gpu"], out["util_memory"] = util.gpu, util.memory
        mem = call("memory", "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            out["fb_total"], out["fb_used"], out["fb_free"] = mem.total, mem.used, mem.free
        scalar = {
            "temperature": ("nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,)),
            "thermal_margin": ("nvmlDeviceGetMarginTemperature", ()),
            "power_mw": ("nvmlDeviceGetPowerUsage", ()),
            "power_limit_mw": ("nvmlDeviceGetPowerManagementLimit", ()),
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
        self._read_fabric(out)

    def _read_fabric(self, out: dict[str, float]) -> None:
        info_type = getattr(self.nvml, "c_nvmlGpuFabricInfo_t", None)
        if info_type is None or "fabric" in self.unsupported:
            return
        info = info_type()
        answer = self._call("fabric", "nvmlDeviceGetGpuFabricInfo", self.handle, ctypes.byref(info))
        if answer is not None:  # pynvml returns NVML_SUCCESS (0) and fills `info`
            out["fabric_state"], out["fabric_status"] = float(info.state), float(info.status)

    def _read_nvlinks(self, sample: GpuSample) -> None:
        if "nvlink" in self.unsupported:
            return
        limit = self.nvlink_count
        for link in range(limit if limit is not None else self.nvml.NVML_NVLINK_MAX_LINKS):
            try:
                self.current_call = "nvmlDeviceGetNvLinkState"
                active = self.nvml.nvmlDeviceGetNvLinkState(self.handle, link)
            except self.nvml.NVMLError as exc:
                if int(exc.value) in LOST or int(exc.value) in RESET_REQUIRED:
                    raise GpuGone("nvmlDeviceGetNvLinkState", int(exc.value), str(exc)) from None
                if link == 0 and int(exc.value) in NOT_SUPPORTED:
                    self.unsupported.add("nvlink")
                if limit is None:  # past the last link: remember how many there are
                    self.nvlink_count = link
                break
            finally:
                self.current_call = ""
            counters = {"active": int(active)}
            for number, counter in enumerate(NVLINK_COUNTERS):
                value = self._call(
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
