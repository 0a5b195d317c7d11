"""Threshold and counter detectors over two consecutive NVML samples of one GPU: DBE ECC,
row remapping, thermal slowdown, PCIe link and replays, NVLink links and errors, the NVSwitch
fabric (registration failed or stuck long after boot, its health mask) and the GPU recovery
action NVML reports.

Pure: compares values and returns findings; never calls NVML, never emits the same
condition twice while it lasts (the caller keeps the EdgeTrigger between polls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from denpex.core.collector import EdgeTrigger
from denpex.gpu.nvml.query import GpuSample


@dataclass(frozen=True, slots=True)
class Finding:
    """A detector (catalog id) and what it saw; the collector adds the GPU's identity.
    `values` only fill the summary template ({gpu} is the collector's)."""

    detector: str
    captures: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None  # only for a detector whose catalog entry `varies`
    action: str | None = None


def _grew(before: GpuSample | None, now: GpuSample, key: str) -> float:
    old = before.values.get(key, 0.0) if before else 0.0
    return now.values.get(key, old) - old


def detect(
    before: GpuSample | None,
    now: GpuSample,
    options: Mapping[str, Any],
    edges: EdgeTrigger,
    uptime_s: float | None = None,
) -> list[Finding]:
    """Findings for `now`; `edges` remembers the conditions already reported, so a lasting
    condition is one finding, and it is reported again only after it cleared. `uptime_s`
    (seconds since boot, None when unknown) tells a fabric still starting from a stuck one."""
    v = now.values
    conditions: dict[str, Finding | None] = {}

    dbe = _grew(before, now, "ecc_dbe_vol")
    if dbe > 0:
        conditions[f"dbe@{v['ecc_dbe_vol']:.0f}"] = Finding(
            "gpu.ecc_uncorrectable.nvml_dbe_volatile",
            {"count": f"{dbe:.0f}", "total": f"{v['ecc_dbe_vol']:.0f}"},
        )
    if v.get("remap_pending"):
        conditions["remap_pending"] = Finding(
            "gpu.row_remap.nvml_remap_pending",
            {"uncorrectable_rows": f"{v.get('remap_unc', 0):.0f}"},
        )
    if v.get("remap_failed"):
        conditions["remap_failed"] = Finding("gpu.row_remap.nvml_remap_failure")
    reasons = options.get("clock_event_reasons") or {}
    bits = int(v.get("clocks_event_reasons", 0))
    thermal = [r for r in options.get("thermal_reasons") or [] if bits & int(reasons.get(r, 0))]
    if thermal:
        conditions["thermal:" + ",".join(thermal)] = Finding(
            "gpu.thermal.nvml_clocks_event",
            {"reasons": ",".join(thermal), "bitmask": hex(bits)},
            {"named": ", ".join(thermal), "temperature": v.get("temperature", float("nan"))},
        )
    margin = v.get("thermal_margin")
    if margin is not None and margin < float(options.get("thermal_margin_warn_c", 5)):
        conditions["margin"] = Finding(
            "gpu.thermal.nvml_thermal_margin", {"margin_c": f"{margin:.0f}"}
        )
    width, width_max = v.get("pcie_width"), v.get("pcie_width_max")
    if width is not None and width_max is not None and width < width_max:
        conditions["pcie_width"] = Finding(
            "host.pcie_error.nvml_link_width_degraded",
            {"width": f"{width:.0f}", "max_width": f"{width_max:.0f}"},
        )
    replays = _grew(before, now, "pcie_replays") if before else 0.0
    if replays >= float(options.get("pcie_replays_warn", 100)):
        conditions[f"replays@{v['pcie_replays']:.0f}"] = Finding(
            "host.pcie_error.nvml_pcie_replays", {"count": f"{replays:.0f}"}
        )
    for link, counters in now.nvlinks.items():
        old = before.nvlinks.get(link, {}) if before else {}
        if old.get("active") and not counters["active"]:
            conditions[f"nvlink{link}_down"] = Finding(
                "gpu.nvlink.nvml_link_down", {"link": str(link)}
            )
        if old:
            new = sum(
                counters.get(c, 0) - old.get(c, 0)
                for c in ("replay", "recovery", "crc_flit", "crc_data")
            )
            if new >= int(options.get("nvlink_errors_warn", 100)):
                conditions[f"nvlink{link}_errors@{sum(counters.values())}"] = Finding(
                    "gpu.nvlink.nvml_link_errors", {"link": str(link), "count": str(new)}
                )
    if v.get("fabric_state") == 3 and v.get("fabric_status"):
        conditions["fabric"] = Finding(
            "gpu.nvlink.nvml_fabric_registration",
            {"fabric_status": f"{v['fabric_status']:.0f}"},
        )
    conditions.update(_fabric(v, options, uptime_s))
    conditions.update(_recovery_action(v, options))
    holding = {key: f for key, f in conditions.items() if f is not None}
    fresh = edges.holding(f"gpu{now.index}", holding)
    return [f for key, f in holding.items() if key in fresh]


FABRIC_STATES = {1: "not started", 2: "in progress"}


def fabric_problems(mask: int, summary: float | None, options: Mapping[str, Any]) -> list[str]:
    """What an nvmlGpuFabricInfo health mask (and v3 summary) says is wrong, in words; each
    condition's bits and the values that mean trouble are data (settings fabric_health)."""
    found = []
    for condition in (options.get("fabric_health") or {}).values():
        value = (mask >> int(condition["shift"])) & int(condition["width"])
        bad = {int(k): str(v) for k, v in (condition.get("bad") or {}).items()}
        if value in bad:
            found.append(bad[value])
    bad_summary = {int(k): str(v) for k, v in (options.get("fabric_health_summary") or {}).items()}
    if summary is not None and int(summary) in bad_summary:
        found.append(bad_summary[int(summary)])
    return found


def _fabric(
    v: Mapping[str, float], options: Mapping[str, Any], uptime_s: float | None
) -> dict[str, Finding]:
    out: dict[str, Finding] = {}
    state = int(v.get("fabric_state", 0))
    after = float(options.get("fabric_stuck_after_s", 600))
    if state in FABRIC_STATES and uptime_s is not None and uptime_s >= after:
        out["fabric_stuck"] = Finding(
            "gpu.nvlink.nvml_fabric_stuck",
            {"fabric_state": FABRIC_STATES[state], "uptime_s": f"{uptime_s:.0f}"},
            {"minutes": uptime_s / 60},
        )
    if "fabric_health_mask" in v:
        summary = v.get("fabric_health_summary")
        problems = fabric_problems(int(v["fabric_health_mask"]), summary, options)
        if problems:
            out["fabric_health:" + ",".join(problems)] = Finding(
                "gpu.nvlink.nvml_fabric_unhealthy",
                {"problems": "; ".join(problems), "health_mask": hex(int(v["fabric_health_mask"]))},
            )
    return out


def _recovery_action(v: Mapping[str, float], options: Mapping[str, Any]) -> dict[str, Finding]:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: what the driver says the GPU needs now; each
    value's name, severity and action are data (settings recovery_actions)."""
    value = int(v.get("recovery_action", 0))
    actions = {int(k): dict(e) for k, e in (options.get("recovery_actions") or {}).items()}
    if not value:
        return {}
    entry = actions.get(value, {"name": f"action {value}", "severity": "error",
                                "action": "run_diagnostics"})  # fmt: skip
    return {
        f"recovery_action:{value}": Finding(
            "gpu.reset_required.nvml_recovery_action",
            {"recovery_action": str(value), "recovery": str(entry["name"])},
            severity=str(entry["severity"]),
            action=str(entry["action"]),
        )
    }
