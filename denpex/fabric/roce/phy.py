"""The RoCE port's link and PCIe health from one `ethtool -S` sample: the post-FEC bit error
ratio (uncorrected PCS symbol errors over received bits), PCIe signal-integrity errors, and
receive discards on lossless priorities. Reads only the stats it is given; never runs
ethtool and never changes a NIC setting.
"""

from __future__ import annotations

from collections.abc import Mapping

from denpex.core.collector import CollectContext, Observation
from denpex.fabric.base import FabricCollector
from denpex.fabric.counters import CounterTracker
from denpex.fabric.roce.ethtool import GLOBAL, pause_counters, paused_priorities, priority_discards

# mlx5 `ethtool -S` counters of this module → (metric, HELP)
PHY_COUNTERS = {
    "rx_pcs_symbol_err_phy": (
        "roce_rx_pcs_symbol_errors_total",
        "Symbol errors FEC could not correct or PCS did not detect (post-FEC errors)",
    ),
    "rx_bits_phy": ("roce_rx_bits_total", "Bits received by the physical layer"),
    "rx_pci_signal_integrity": (
        "roce_rx_pci_signal_integrity_errors_total",
        "PCIe link recoveries from framing/CRC errors seen by the NIC (receive side)",
    ),
    "tx_pci_signal_integrity": (
        "roce_tx_pci_signal_integrity_errors_total",
        "PCIe link recoveries from framing/CRC errors seen by the NIC (transmit side)",
    ),
}
PHY_HELP = {
    **{name: text for name, text in PHY_COUNTERS.values()},
    "roce_post_fec_bit_error_ratio": "Uncorrected symbol errors per received bit over the last "
    "poll (rx_pcs_symbol_err_phy / rx_bits_phy)",
    "roce_rx_priority_discards_total": "Received packets dropped on a priority (label priority)",
}


def phy_observations(
    ctx: CollectContext,
    owner: FabricCollector,
    tracker: CounterTracker,
    netdev: str,
    device: str,
    stats: Mapping[str, int],
) -> list[Observation]:
    """Metrics and evidence of one netdev's sample; `tracker` keeps the previous values and
    `owner.edges` what was already reported, so a lasting condition is reported once."""
    base = {"netdev": netdev, "device": device}
    out: list[Observation] = []
    increases: dict[str, int | None] = {}
    for name, (metric_name, _) in PHY_COUNTERS.items():
        if name in stats:
            out.append(owner.metric_event(ctx, metric_name, stats[name], base, True))
            increases[name] = tracker.update(f"{netdev}/{name}", stats[name], ctx.now_ns).increase
    out += _post_fec_ber(ctx, owner, base, increases)
    out += _pci_signal_integrity(ctx, owner, base, increases)
    out += _lossless_discards(ctx, owner, tracker, base, stats)
    return out


def _post_fec_ber(
    ctx: CollectContext,
    owner: FabricCollector,
    base: dict[str, str],
    increases: Mapping[str, int | None],
) -> list[Observation]:
    """Post-FEC BER needs both counters (rx_bits_phy came with newer mlx5 drivers): without
    the bit count the symbol errors stay a counter, never a ratio guessed from a line rate."""
    errors, bits = increases.get("rx_pcs_symbol_err_phy"), increases.get("rx_bits_phy")
    if errors is None or not bits:
        return []
    ber = errors / bits
    out: list[Observation] = [owner.metric_event(ctx, "roce_post_fec_bit_error_ratio", ber, base)]
    threshold = float(owner.options["post_fec_ber_threshold"])
    if owner.edges.rising((base["netdev"], "post_fec_ber"), ber > threshold):
        captures = {**base, "errors": str(errors), "bits": str(bits)}
        values = {"ber": ber, "threshold": threshold}
        out.append(
            owner.finding(
                ctx,
                "net.ib_error.roce_post_fec_ber",
                attrs=dict(base),
                captures=captures,
                values=values,
            )
        )
    return out


def _pci_signal_integrity(
    ctx: CollectContext,
    owner: FabricCollector,
    base: dict[str, str],
    increases: Mapping[str, int | None],
) -> list[Observation]:
    grown = {side: increases.get(f"{side}_pci_signal_integrity") or 0 for side in ("rx", "tx")}
    total = sum(grown.values())
    limit = int(owner.options["pci_signal_integrity_per_poll"])
    if not owner.edges.rising((base["netdev"], "pci_signal_integrity"), total >= limit):
        return []
    captures = {**base, "rx_increase": str(grown["rx"]), "tx_increase": str(grown["tx"])}
    return [
        owner.finding(
            ctx, "host.pcie_error.roce_pci_signal_integrity", attrs=dict(base), captures=captures
        )
    ]


def _lossless_discards(
    ctx: CollectContext,
    owner: FabricCollector,
    tracker: CounterTracker,
    base: dict[str, str],
    stats: Mapping[str, int],
) -> list[Observation]:
    """Drops on a priority PFC protects mean the lossless contract broke (buffers overran
    despite pausing); drops on a lossy priority are TCP's business and only a metric."""
    lossless = {str(p) for p in owner.options.get("lossless_priorities") or ()}
    lossless |= paused_priorities(stats)
    global_pause = any(v > 0 for c, v in pause_counters(stats).items() if c.priority == GLOBAL)
    limit = int(owner.options["lossless_discards_per_poll"])
    out: list[Observation] = []
    for priority, value in sorted(priority_discards(stats).items()):
        labels = {**base, "priority": priority}
        out.append(owner.metric_event(ctx, "roce_rx_priority_discards_total", value, labels, True))
        increase = tracker.update(f"{base['netdev']}/rx_prio{priority}_discards", value, ctx.now_ns)
        grown = increase.increase or 0
        protected = global_pause or priority in lossless
        key = (base["netdev"], "lossless_discards", priority)
        if owner.edges.rising(key, protected and grown >= limit):
            mode = "global pause" if global_pause else "PFC"
            captures = {**labels, "increase": str(grown), "mode": mode}
            out.append(
                owner.finding(
                    ctx,
                    "net.ib_error.roce_lossless_discards",
                    attrs=dict(labels),
                    captures=captures,
                )
            )
    return out
