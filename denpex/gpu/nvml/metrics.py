"""NVML samples as metric events: dcgm-exporter's names, types and labels where a DCGM field
exists (denpex/gpu/dcgm_fields.yaml, so existing dashboards keep working), denpex names for
the rest; a MIG device's metrics carry its GPU_I_PROFILE and GPU_I_ID labels.

Pure functions from samples to events; never calls NVML and never invents a value a GPU did
not give (a query a GPU does not support is simply absent).
"""

from __future__ import annotations

from collections.abc import Mapping

from denpex.core.events import Event, metric
from denpex.gpu.dcgm_fields import exporter_labels, help_texts, is_counter
from denpex.gpu.nvml.mig import MigSample
from denpex.gpu.nvml.query import NVLINK_COUNTERS, REMAP_BANKS, GpuSample

MIB = 1 << 20

# sample field → (metric name, scale applied to the value); a DCGM_* name's type is
# dcgm-exporter's (dcgm_fields.yaml), every other name is a gauge
FIELDS: dict[str, tuple[str, float]] = {
    "util_gpu": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "util_memory": ("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0),
    "enc_util": ("DCGM_FI_DEV_ENC_UTIL", 1.0),
    "dec_util": ("DCGM_FI_DEV_DEC_UTIL", 1.0),
    "fb_used": ("DCGM_FI_DEV_FB_USED", 1.0 / MIB),
    "fb_free": ("DCGM_FI_DEV_FB_FREE", 1.0 / MIB),
    "fb_total": ("DCGM_FI_DEV_FB_TOTAL", 1.0 / MIB),
    "fb_reserved": ("DCGM_FI_DEV_FB_RESERVED", 1.0 / MIB),
    "temperature": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "memory_temp": ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
    "thermal_margin": ("gpu_temperature_margin_celsius", 1.0),
    "power_mw": ("DCGM_FI_DEV_POWER_USAGE", 1e-3),
    "power_limit_mw": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 1e-3),
    "energy_mj": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1.0),
    "sm_clock": ("DCGM_FI_DEV_SM_CLOCK", 1.0),
    "mem_clock": ("DCGM_FI_DEV_MEM_CLOCK", 1.0),
    "clocks_event_reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
    "ecc_sbe_vol": ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0),
    "ecc_dbe_vol": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
    "ecc_sbe_agg": ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 1.0),
    "ecc_dbe_agg": ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0),
    "retired_sbe": ("DCGM_FI_DEV_RETIRED_SBE", 1.0),
    "retired_dbe": ("DCGM_FI_DEV_RETIRED_DBE", 1.0),
    "remap_corr": ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1.0),
    "remap_unc": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
    "remap_pending": ("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0),
    "remap_failed": ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0),
    "pcie_gen": ("DCGM_FI_DEV_PCIE_LINK_GEN", 1.0),
    "pcie_width": ("DCGM_FI_DEV_PCIE_LINK_WIDTH", 1.0),
    "pcie_gen_max": ("gpu_pcie_link_gen_max", 1.0),
    "pcie_width_max": ("gpu_pcie_link_width_max_lanes", 1.0),
    "pcie_replays": ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
    "fabric_state": ("gpu_fabric_state", 1.0),
    "fabric_status": ("gpu_fabric_status", 1.0),
    "fabric_health_mask": ("gpu_fabric_health_mask", 1.0),
    "fabric_health_summary": ("gpu_fabric_health_summary", 1.0),
    "recovery_action": ("gpu_recovery_action", 1.0),
    "mig_mode": ("gpu_mig_mode", 1.0),
}
NVLINK_TOTALS = {
    "replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "crc_flit": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
}
NVLINK_BANDWIDTH = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"  # data KiB received + sent (DCGM's sum)

HELP: dict[str, str] = {
    **help_texts(),
    "gpu_temperature_margin_celsius": "Degrees C before the GPU starts slowing down (NVML margin)",
    "gpu_clock_event_reason_active": "1 while this clock event (throttle) reason is active",
    "gpu_row_remap_availability_banks": "Memory banks per row-remapping availability level",
    "gpu_pcie_link_gen_max": "Highest PCIe link generation of the GPU and its slot",
    "gpu_pcie_link_width_max_lanes": "Widest PCIe link of the GPU and its slot",
    "gpu_fabric_state": "NVSwitch fabric registration: 0 n/a, 1 not started, 2 in progress, 3 done",
    "gpu_fabric_status": "NVML status of the fabric registration (0 success)",
    "gpu_fabric_health_mask": "NVML fabric health mask (nvmlGpuFabricInfo_v2/v3 healthMask)",
    "gpu_fabric_health_summary": "NVML fabric health: 0 n/a, 1 healthy, 2 unhealthy, 3 limited",
    "gpu_recovery_action": "NVML GPU recovery action: 0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset",
    "gpu_mig_mode": "1 while the GPU is in MIG mode",
    "gpu_nvlink_link_up": "1 while the NVLink link is active",
    "gpu_nvlink_errors_total": "NVLink errors per link and counter",
    "gpu_xid_errors_total": "Xid errors per GPU and code since the collector started",
    "gpu_processes": "Compute processes on the GPU (label pids lists them)",
    "gpu_process_memory_used_bytes": "GPU memory used by one compute process",
    "gpu_nvml_up": "1 when the GPU answered this poll; 0 when lost or its NVML call is stuck",
    "gpu_nvml_call_stuck_seconds": "How long an NVML call on this GPU has not returned",
}


def gpu_labels(index: int, identity: Mapping[str, str], host: str) -> dict[str, str]:
    """dcgm-exporter's label set for one GPU."""
    return exporter_labels(index, identity, host)


def _metric(name: str, value: float, labels: Mapping[str, str], host: str, ts_ns: int, **kw):  # type: ignore[no-untyped-def]
    return metric(
        name,
        value,
        source="nvml",
        counter=kw.pop("counter", is_counter(name)),
        labels=dict(labels),
        host=host,
        ts_ns=ts_ns,
        **kw,
    )


def sample_metrics(
    sample: GpuSample,
    host: str,
    ts_ns: int,
    reasons: Mapping[str, int],
) -> list[Event]:
    """Every metric of one GPU's sample; `reasons` names the clock-event bits."""
    labels = gpu_labels(sample.index, sample.identity, host)

    def emit(name: str, value: float, extra: Mapping[str, str] | None = None, **kw: object):
        return _metric(name, value, {**labels, **(extra or {})}, host, ts_ns, **kw)

    out = [emit("gpu_nvml_up", 1.0)]
    values = sample.values
    for key, value in values.items():
        if key in FIELDS:
            name, scale = FIELDS[key]
            out.append(emit(name, value * scale))
    if "nvlink_data_tx_kib" in values and "nvlink_data_rx_kib" in values:
        out.append(
            emit(NVLINK_BANDWIDTH, values["nvlink_data_tx_kib"] + values["nvlink_data_rx_kib"])
        )
    if "clocks_event_reasons" in values:
        bits = int(values["clocks_event_reasons"])
        for reason, bit in reasons.items():
            out.append(
                emit("gpu_clock_event_reason_active", float(bool(bits & bit)), {"reason": reason})
            )
    for bank in REMAP_BANKS:
        if f"remap_bank_{bank}" in values:
            value = values[f"remap_bank_{bank}"]
            out.append(emit("gpu_row_remap_availability_banks", value, {"level": bank}))
    totals = dict.fromkeys(NVLINK_TOTALS, 0)
    for link, counters in sorted(sample.nvlinks.items()):
        out.append(emit("gpu_nvlink_link_up", counters["active"], {"link": str(link)}))
        for counter in NVLINK_COUNTERS:
            if counter in counters:
                extra = {"link": str(link), "counter": counter}
                out.append(emit("gpu_nvlink_errors_total", counters[counter], extra, counter=True))
                if counter in totals:
                    totals[counter] += counters[counter]
    if sample.nvlinks:
        out += [emit(NVLINK_TOTALS[c], v) for c, v in totals.items()]
    pids = ",".join(str(pid) for pid, _ in sample.processes)
    out.append(emit("gpu_processes", len(sample.processes), {"pids": pids}))
    for pid, used in sample.processes:
        out.append(emit("gpu_process_memory_used_bytes", used, {"pid": str(pid)}, pid=pid))
    for device in sample.mig:
        out += mig_metrics(sample, device, host, ts_ns)
    return out


def mig_metrics(sample: GpuSample, device: MigSample, host: str, ts_ns: int) -> list[Event]:
    """A MIG device's own metrics, labelled as dcgm-exporter labels them: the parent GPU's
    identity with the GPU instance's profile and id."""
    labels = exporter_labels(
        sample.index, sample.identity, host, profile=device.profile, instance=device.gpu_instance
    )
    out = []
    for key in ("fb_used", "fb_free", "fb_total"):
        if key in device.values:
            name, scale = FIELDS[key]
            out.append(_metric(name, device.values[key] * scale, labels, host, ts_ns))
    for pid, used in device.processes:
        out.append(
            _metric(
                "gpu_process_memory_used_bytes",
                used,
                {**labels, "pid": str(pid), "mig_uuid": device.uuid},
                host,
                ts_ns,
                pid=pid,
            )
        )
    return out


def xid_metrics(
    totals: Mapping[tuple[str, int], int],
    last: Mapping[str, int],
    identities: Mapping[int, Mapping[str, str]],
    host: str,
    ts_ns: int,
    titles: Mapping[int, str],
) -> list[Event]:
    """DCGM_FI_DEV_XID_ERRORS (the last Xid, as DCGM shows it, with dcgm-exporter's err_code
    and err_msg labels; `titles` names the codes) and the per-code counter."""
    out = []
    for gpu, xid in sorted(last.items()):
        labels = gpu_labels(int(gpu), identities.get(int(gpu), {}), host)
        extra = {"err_code": str(xid), "err_msg": titles.get(xid, "Unknown Error")}
        out.append(_metric("DCGM_FI_DEV_XID_ERRORS", xid, {**labels, **extra}, host, ts_ns))
    for (gpu, xid), count in sorted(totals.items()):
        labels = {**gpu_labels(int(gpu), identities.get(int(gpu), {}), host), "xid": str(xid)}
        out.append(_metric("gpu_xid_errors_total", count, labels, host, ts_ns, counter=True))
    return out


def down_metrics(
    index: int, identity: Mapping[str, str], host: str, ts_ns: int, stuck_s: float
) -> list[Event]:
    """A GPU that did not answer: up=0 and, when a call is stuck, for how long."""
    labels = gpu_labels(index, identity, host)
    out = [_metric("gpu_nvml_up", 0.0, labels, host, ts_ns)]
    if stuck_s:
        out.append(_metric("gpu_nvml_call_stuck_seconds", stuck_s, labels, host, ts_ns))
    return out
