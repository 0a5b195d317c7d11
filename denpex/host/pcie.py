"""PCIe health from sysfs: AER error counters of every device, and the link speed and width
of GPUs and NICs against what the device supports.

Reads small sysfs attributes only; never touches config space, never resets a link. The first
poll of a device is the AER baseline: only errors that appear while the agent runs are
evidence. Only width degradation warns by default: idle GPUs (and some NICs) lower their
link *speed* to save power and raise it under load, so a low speed in one poll is normal,
while lanes lost in training never come back without a retrain or reseat.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.roots import Roots, read_text
from denpex.host.base import HostCollector
from denpex.host.procfs import parse_int_fields

AER_KINDS = ("correctable", "nonfatal", "fatal")
AER_TOTALS = {
    "correctable": "TOTAL_ERR_COR",
    "nonfatal": "TOTAL_ERR_NONFATAL",
    "fatal": "TOTAL_ERR_FATAL",
}
# kind → the detector of a growing total (correctable errors are metrics only)
AER_DETECTORS = {
    "fatal": "host.pcie_error.aer_counter_fatal",
    "nonfatal": "host.pcie_error.aer_counter_nonfatal",
}
LINK_DETECTORS = {
    "width": "host.pcie_error.link_width_degraded",
    "speed": "host.pcie_error.link_speed_degraded",
}

HELP = {
    "pcie_aer_errors_total": "AER errors the device reported (labels device, kind, error)",
    "pcie_link_speed_transfers_per_second": "Current PCIe link speed (GT/s x 1e9)",
    "pcie_link_max_speed_transfers_per_second": "Highest PCIe link speed the device supports",
    "pcie_link_width_lanes": "Current PCIe link width",
    "pcie_link_max_width_lanes": "Widest PCIe link the device supports",
}


def parse_aer(text: str) -> dict[str, int]:
    """An `aer_dev_*` file: `NAME count` lines, ending with a TOTAL_ERR_* line."""
    return parse_int_fields(text)


def parse_link_speed(text: str | None) -> float | None:
    """`16.0 GT/s PCIe` (or older `8 GT/s`) → 16.0; None for `Unknown` or absent."""
    if not text:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_width(text: str | None) -> int | None:
    value = (text or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def device_kind(pci_class: str, vendor: str) -> str | None:
    """ "gpu", "nic" or "ib" for the devices whose link matters to training, else None."""
    code = pci_class.strip().lower().removeprefix("0x")
    if code.startswith(("0300", "0302")) and vendor.strip().lower() == "0x10de":
        return "gpu"
    if code.startswith("0207"):
        return "ib"
    if code.startswith("0200"):
        return "nic"
    return None


@dataclass(frozen=True, slots=True)
class Link:
    speed: float | None
    max_speed: float | None
    width: int | None
    max_width: int | None

    def width_degraded(self) -> bool:
        return self.width is not None and self.max_width is not None and self.width < self.max_width

    def speed_degraded(self) -> bool:
        return self.speed is not None and self.max_speed is not None and self.speed < self.max_speed


def read_link(folder: Path) -> Link:
    return Link(
        speed=parse_link_speed(read_text(folder / "current_link_speed")),
        max_speed=parse_link_speed(read_text(folder / "max_link_speed")),
        width=parse_width(read_text(folder / "current_link_width")),
        max_width=parse_width(read_text(folder / "max_link_width")),
    )


class PcieCollector(HostCollector):
    name = "pcie"
    stability = "experimental"
    default_interval_s = 60.0
    default_budget_s = 2.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._totals: dict[tuple[str, str], int] = {}

    def available(self) -> tuple[bool, str]:
        folder = self.roots.sys("bus", "pci", "devices")
        if not folder.is_dir():
            return False, f"{folder} is missing (no PCI bus or sysfs not mounted)"
        return True, f"AER counters and link state under {folder}"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        folder = ctx.roots.sys("bus", "pci", "devices")
        try:
            devices = sorted(os.listdir(folder))
        except OSError:
            return []
        out: list[Observation] = []
        for device in devices:
            out += self._device(ctx, device, folder / device)
        return out

    def _device(self, ctx: CollectContext, device: str, folder: Path) -> list[Observation]:
        kind = device_kind(read_text(folder / "class") or "", read_text(folder / "vendor") or "")
        base = {"device": device, "class": kind or "other"}
        out: list[Observation] = []
        for aer_kind in AER_KINDS:
            text = read_text(folder / f"aer_dev_{aer_kind}")
            if text is None:
                continue
            counts = parse_aer(text)
            total_name = AER_TOTALS[aer_kind]
            for error, count in counts.items():
                if error == total_name or count:  # per-error series only once they happen
                    out.append(
                        self.metric_event(
                            ctx,
                            "pcie_aer_errors_total",
                            count,
                            {**base, "kind": aer_kind, "error": error},
                            True,
                        )
                    )
            total = counts.get(total_name, sum(counts.values()))
            before = self._totals.get((device, aer_kind))
            self._totals[(device, aer_kind)] = total
            if aer_kind in AER_DETECTORS and before is not None and total > before:
                out.append(self._aer_evidence(ctx, device, kind, aer_kind, total - before, counts))
        if kind is None:
            return out
        link = read_link(folder)
        for name, value in (
            ("pcie_link_speed_transfers_per_second", link.speed),
            ("pcie_link_max_speed_transfers_per_second", link.max_speed),
        ):
            if value is not None:
                out.append(self.metric_event(ctx, name, value * 1e9, base))
        for name, lanes in (
            ("pcie_link_width_lanes", link.width),
            ("pcie_link_max_width_lanes", link.max_width),
        ):
            if lanes is not None:
                out.append(self.metric_event(ctx, name, lanes, base))
        checks = [("width", link.width_degraded(), f"x{link.width} of x{link.max_width}")]
        if self.options.get("warn_speed_degraded", False):
            checks.append(
                ("speed", link.speed_degraded(), f"{link.speed} GT/s of {link.max_speed} GT/s")
            )
        for what, degraded, detail in checks:
            if self.edges.rising((device, what), degraded):
                out.append(self._link_evidence(ctx, device, kind, what, detail, link))
        return out

    def _aer_evidence(
        self,
        ctx: CollectContext,
        device: str,
        kind: str | None,
        aer_kind: str,
        new: int,
        counts: dict[str, int],
    ) -> Observation:
        named = ", ".join(f"{k} {v}" for k, v in counts.items() if v and not k.startswith("TOTAL"))
        return self.finding(
            ctx,
            AER_DETECTORS[aer_kind],
            attrs={"device": device, "aer_kind": aer_kind},
            captures={"device": device, "kind": aer_kind, "count": str(new), "errors": named},
            values={"class": kind or "other", "named": f": {named}" if named else ""},
        )

    def _link_evidence(
        self, ctx: CollectContext, device: str, kind: str, what: str, detail: str, link: Link
    ) -> Observation:
        return self.finding(
            ctx,
            LINK_DETECTORS[what],
            attrs={"device": device},
            captures={
                "device": device,
                "class": kind,
                "width": str(link.width),
                "max_width": str(link.max_width),
                "speed_gts": str(link.speed),
                "max_speed_gts": str(link.max_speed),
            },
            values={"detail": detail},
        )
