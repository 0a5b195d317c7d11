"""Threshold and counter detectors over two consecutive NVML samples of one GPU: DBE ECC,
row remapping, thermal slowdown, PCIe link and replays, NVLink links and errors, fabric.

Pure: compares values and returns findings; never calls NVML, never emits the same
condition twice while it lasts (the caller keeps `active` between polls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from denpex.gpu.nvml_query import GpuSample


@dataclass(frozen=True, slots=True)
class Finding:
    signature: str  # starts with its category
    category: str
    severity: str
    action: str
    summary: str
    captures: dict[str, str] = field(default_factory=dict)


def _grew(before: GpuSample | None, now: GpuSample, key: str) -> float:
    old = before.values.get(key, 0.0) if before else 0.0
    return now.values.get(key, old) - old


def detect(
    before: GpuSample | None,
    now: GpuSample,
    options: Mapping[str, Any],
    active: set[str],
) -> list[Finding]:
    """Findings for `now`; `active` holds conditions already reported (updated in place) so a
    lasting condition is one finding, and it is reported again only after it cleared."""
    gpu = f"GPU {now.index} ({now.identity.get('pci_bus_id', '?')})"
    v = now.values
    conditions: dict[str, Finding | None] = {}

    dbe = _grew(before, now, "ecc_dbe_vol")
    conditions["dbe"] = None
    if dbe > 0:
        conditions[f"dbe@{v['ecc_dbe_vol']:.0f}"] = Finding(
            "gpu.ecc_uncorrectable.nvml_dbe_volatile",
            "gpu.ecc_uncorrectable",
            "critical",
            "reset_gpu",
            f"{gpu}: {dbe:.0f} new uncorrectable (double-bit) ECC error(s), "
            f"{v['ecc_dbe_vol']:.0f} since the last driver load",
            {"count": f"{dbe:.0f}", "total": f"{v['ecc_dbe_vol']:.0f}"},
        )
    if v.get("remap_pending"):
        conditions["remap_pending"] = Finding(
            "gpu.row_remap.nvml_remap_pending",
            "gpu.row_remap",
            "warning",
            "reset_gpu",
            f"{gpu}: a row remapping is pending; it takes effect at the next GPU reset",
            {"uncorrectable_rows": f"{v.get('remap_unc', 0):.0f}"},
        )
    if v.get("remap_failed"):
        conditions["remap_failed"] = Finding(
            "gpu.row_remap.nvml_remap_failure",
            "gpu.row_remap",
            "critical",
            "rma",
            f"{gpu}: row remapping failed (no spare rows left): the GPU needs replacing",
        )
    reasons = options.get("clock_event_reasons") or {}
    bits = int(v.get("clocks_event_reasons", 0))
    thermal = [r for r in options.get("thermal_reasons") or [] if bits & int(reasons.get(r, 0))]
    if thermal:
        conditions["thermal:" + ",".join(thermal)] = Finding(
            "gpu.thermal.nvml_clocks_event",
            "gpu.thermal",
            "warning",
            "run_diagnostics",
            f"{gpu}: clocks slowed by {', '.join(thermal)} "
            f"(temperature {v.get('temperature', float('nan')):.0f} C)",
            {"reasons": ",".join(thermal), "bitmask": hex(bits)},
        )
    margin = v.get("thermal_margin")
    if margin is not None and margin < float(options.get("thermal_margin_warn_c", 5)):
        conditions["margin"] = Finding(
            "gpu.thermal.nvml_thermal_margin",
            "gpu.thermal",
            "warning",
            "run_diagnostics",
            f"{gpu}: only {margin:.0f} C left before thermal slowdown",
            {"margin_c": f"{margin:.0f}"},
        )
    width, width_max = v.get("pcie_width"), v.get("pcie_width_max")
    if width is not None and width_max is not None and width < width_max:
        conditions["pcie_width"] = Finding(
            "host.pcie_error.nvml_link_width_degraded",
            "host.pcie_error",
            "warning",
            "run_diagnostics",
            f"{gpu}: PCIe link runs x{width:.0f} of x{width_max:.0f}",
            {"width": f"{width:.0f}", "max_width": f"{width_max:.0f}"},
        )
    replays = _grew(before, now, "pcie_replays") if before else 0.0
    if replays >= float(options.get("pcie_replays_warn", 100)):
        conditions[f"replays@{v['pcie_replays']:.0f}"] = Finding(
            "host.pcie_error.nvml_pcie_replays",
            "host.pcie_error",
            "warning",
            "run_diagnostics",
            f"{gpu}: {replays:.0f} PCIe replays since the last poll",
            {"count": f"{replays:.0f}"},
        )
    for link, counters in now.nvlinks.items():
        old = before.nvlinks.get(link, {}) if before else {}
        if old.get("active") and not counters["active"]:
            conditions[f"nvlink{link}_down"] = Finding(
                "gpu.nvlink.nvml_link_down",
                "gpu.nvlink",
                "error",
                "check_fabric",
                f"{gpu}: NVLink link {link} went down",
                {"link": str(link)},
            )
        if old:
            new = sum(
                counters.get(c, 0) - old.get(c, 0)
                for c in ("replay", "recovery", "crc_flit", "crc_data")
            )
            if new >= int(options.get("nvlink_errors_warn", 100)):
                conditions[f"nvlink{link}_errors@{sum(counters.values())}"] = Finding(
                    "gpu.nvlink.nvml_link_errors",
                    "gpu.nvlink",
                    "warning",
                    "check_fabric",
                    f"{gpu}: {new} NVLink errors on link {link} since the last poll",
                    {"link": str(link), "count": str(new)},
                )
    if v.get("fabric_state") == 3 and v.get("fabric_status"):
        conditions["fabric"] = Finding(
            "gpu.nvlink.nvml_fabric_registration",
            "gpu.nvlink",
            "error",
            "check_fabric",
            f"{gpu}: NVSwitch fabric registration finished with NVML status "
            f"{v['fabric_status']:.0f}",
        )
    found = [f for key, f in conditions.items() if f is not None and key not in active]
    active.intersection_update(k for k, f in conditions.items() if f is not None)
    active.update(k for k, f in conditions.items() if f is not None)
    return found
