"""NVML samples as metric events: dcgm-exporter's names and labels where a DCGM field exists
(so existing dashboards keep working), denpex names for the rest.

Pure functions from samples to events; never calls NVML and never invents a value a GPU did
not give (a query a GPU does not support is simply absent).
"""

from __future__ import annotations

from collections.abc import Mapping

from denpex.core.events import Event, metric
from denpex.gpu.nvml.query import NVLINK_COUNTERS, REMAP_BANKS, GpuSample

MIB = 1 << 20

# sample field → (metric name, scale applied to the value, is a counter). DCGM_* names are
# gauges, as dcgm-exporter exports them: a counter family would gain a `_total` suffix.
FIELDS: dict[str, tuple[str, float, bool]] = {
    "util_gpu": ("DCGM_FI_DEV_GPU_UTIL", 1.0, False),
    "util_memory": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0, False),
    "fb_used": ("DCGM_FI_DEV_FB_USED", 1.0 / MIB, False),
    "fb_free": ("DCGM_FI_DEV_FB_FREE", 1.0 / MIB, False),
    "fb_total": ("DCGM_FI_DEV_FB_TOTAL", 1.0 / MIB, False),
    "temperature": ("DCGM_FI_DEV_GPU_TEMP", 1.0, False),
    "thermal_margin": ("gpu_temperature_margin_celsius", 1.0, False),
    "power_mw": ("DCGM_FI_DEV_POWER_USAGE", 1e-3, False),
    "power_limit_mw": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1e-3, False),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", 1.0, False),
    "mem_clock": ("DCGM_FI_DEV_MEM_CLOCK", 1.0, False),
    "clocks_event_reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0, False),
    "ecc_sbe_vol": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0, False),
    "ecc_dbe_vol": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0, False),
    "ecc_sbe_agg": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0, False),
    "ecc_dbe_agg": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0, False),
    "retired_sbe": ("DCGM_FI_DEV_RETIRED_SBE", 1.0, False),
    "retired_dbe": ("DCGM_FI_DEV_RETIRED_DBE", 1.0, False),
    "remap_corr": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0, False),
    "remap_unc": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0, False),
    "remap_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0, False),
    "remap_failed": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0, False),
    "pcie_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN", 1.0, False),
    "pcie_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH", 1.0, False),
    "pcie_gen_max": ("gpu_pcie_link_gen_max", 1.0, False),
    "pcie_width_max": ("gpu_pcie_link_width_max_lanes", 1.0, False),
    "pcie_replays": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0, False),
    "fabric_state": ("gpu_fabric_state", 1.0, False),
    "fabric_status": ("gpu_fabric_status", 1.0, False),
}
NVLINK_TOTALS = {
    "replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "crc_flit": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
}

HELP: dict[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %)",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %)",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB)",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB)",
    "DCGM_FI_DEV_FB_TOTAL": "Framebuffer memory total (in MiB)",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C)",
    "gpu_temperature_margin_celsius": "Degrees C before the GPU starts slowing down (NVML margin)",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W)",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "Power management limit (in W)",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz)",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz)",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Current clock event (throttle) reasons, a bitmask",
    "gpu_clock_event_reason_active": "1 while this clock event (throttle) reason is active",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Single-bit volatile ECC errors",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Double-bit volatile ECC errors",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "Single-bit persistent ECC errors",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "Double-bit persistent ECC errors",
    "DCGM_FI_DEV_RETIRED_SBE": "Pages retired for single-bit errors",
    "DCGM_FI_DEV_RETIRED_DBE": "Pages retired for double-bit errors",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Rows remapped for correctable errors",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Rows remapped for uncorrectable errors",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "1 while a row remapping waits for a GPU reset",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "1 when a row remapping failed",
    "gpu_row_remap_availability_banks": "Memory banks per row-remapping availability level",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "Current PCIe link generation",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "Current PCIe link width (lanes)",
    "gpu_pcie_link_gen_max": "Highest PCIe link generation of the GPU and its slot",
    "gpu_pcie_link_width_max_lanes": "Widest PCIe link of the GPU and its slot",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "PCIe replays (retries)",
    "gpu_fabric_state": "NVSwitch fabric registration: 0 n/a, 1 not started, 2 running, 3 done",
    "gpu_fabric_status": "NVML status of the fabric registration (0 success)",
    "gpu_nvlink_link_up": "1 while the NVLink link is active",
    "gpu_nvlink_errors_total": "NVLink errors per link and counter",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "NVLink replay errors, all links",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "NVLink recovery errors, all links",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "NVLink flow-control CRC errors, all links",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "NVLink data CRC errors, all links",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last Xid error seen on the GPU",
    "gpu_xid_errors_total": "Xid errors per GPU and code since the collector started",
    "gpu_processes": "Compute processes on the GPU (label pids lists them)",
    "gpu_process_memory_used_bytes": "GPU memory used by one compute process",
    "gpu_nvml_up": "1 when the GPU answered this poll; 0 when lost or its NVML call is stuck",
    "gpu_nvml_call_stuck_seconds": "How long an NVML call on this GPU has not returned",
}


def gpu_labels(index: int, identity: Mapping[str, str], host: str) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU."""
    return {
        "gpu": str(index),
        "UUID": identity.get("uuid", ""),
        "pci_bus_id": identity.get("pci_bus_id", ""),
        "device": f"nvidia{index}",
        "modelName": identity.get("name", ""),
        "Hostname": host,
    }


def sample_metrics(
    sample: GpuSample,
    host: str,
    ts_ns: int,
    reasons: Mapping[str, int],
) -> list[Event]:
    """Every metric of one GPU's sample; `reasons` names the clock-event bits."""
    labels = gpu_labels(sample.index, sample.identity, host)

    def gauge(name: str, value: float, extra: Mapping[str, str] | None = None, **kw: object):
        return metric(
            name,
            value,
            source="nvml",
            labels={**labels, **(extra or {})},
            host=host,
            ts_ns=ts_ns,
            **kw,  # type: ignore[arg-type]
        )

    out = [gauge("gpu_nvml_up", 1.0)]
    for key, value in sample.values.items():
        if key in FIELDS:
            name, scale, is_counter = FIELDS[key]
            out.append(gauge(name, value * scale, counter=is_counter))
    if "clocks_event_reasons" in sample.values:
        bits = int(sample.values["clocks_event_reasons"])
        for reason, bit in reasons.items():
            out.append(
                gauge("gpu_clock_event_reason_active", float(bool(bits & bit)), {"reason": reason})
            )
    for bank in REMAP_BANKS:
        if f"remap_bank_{bank}" in sample.values:
            value = sample.values[f"remap_bank_{bank}"]
            out.append(gauge("gpu_row_remap_availability_banks", value, {"level": bank}))
    totals = dict.fromkeys(NVLINK_TOTALS, 0)
    for link, counters in sorted(sample.nvlinks.items()):
        out.append(gauge("gpu_nvlink_link_up", counters["active"], {"link": str(link)}))
        for counter in NVLINK_COUNTERS:
            if counter in counters:
                extra = {"link": str(link), "counter": counter}
                out.append(gauge("gpu_nvlink_errors_total", counters[counter], extra, counter=True))
                if counter in totals:
                    totals[counter] += counters[counter]
    if sample.nvlinks:
        out += [gauge(NVLINK_TOTALS[c], v) for c, v in totals.items()]
    pids = ",".join(str(pid) for pid, _ in sample.processes)
    out.append(gauge("gpu_processes", len(sample.processes), {"pids": pids}))
    for pid, used in sample.processes:
        out.append(gauge("gpu_process_memory_used_bytes", used, {"pid": str(pid)}, pid=pid))
    return out


def xid_metrics(
    totals: Mapping[tuple[str, int], int],
    last: Mapping[str, int],
    identities: Mapping[int, Mapping[str, str]],
    host: str,
    ts_ns: int,
) -> list[Event]:
    """DCGM_FI_DEV_XID_ERRORS (the last Xid, as DCGM shows it) and the per-code counter."""
    out = []
    for gpu, xid in sorted(last.items()):
        labels = gpu_labels(int(gpu), identities.get(int(gpu), {}), host)
        out.append(
            metric(
                "DCGM_FI_DEV_XID_ERRORS", xid, source="nvml", labels=labels, host=host, ts_ns=ts_ns
            )
        )
    for (gpu, xid), count in sorted(totals.items()):
        labels = {**gpu_labels(int(gpu), identities.get(int(gpu), {}), host), "xid": str(xid)}
        out.append(
            metric(
                "gpu_xid_errors_total",
                count,
                source="nvml",
                counter=True,
                labels=labels,
                host=host,
                ts_ns=ts_ns,
            )
        )
    return out


def down_metrics(
    index: int, identity: Mapping[str, str], host: str, ts_ns: int, stuck_s: float
) -> list[Event]:
    """A GPU that did not answer: up=0 and, when a call is stuck, for how long."""
    labels = gpu_labels(index, identity, host)
    out = [metric("gpu_nvml_up", 0.0, source="nvml", labels=labels, host=host, ts_ns=ts_ns)]
    if stuck_s:
        out.append(
            metric(
                "gpu_nvml_call_stuck_seconds",
                stuck_s,
                source="nvml",
                labels=labels,
                host=host,
                ts_ns=ts_ns,
            )
        )
    return out
