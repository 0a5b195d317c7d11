"""RoCE priority flow control and congestion: per-priority (or global) pause frames and pause
time from `ethtool -S <netdev>` (mlx5 names), ECN/CNP counters from the RDMA device's
hw_counters, a PFC storm detector (heavy pausing on one priority for several consecutive
polls), and the port's physical and PCIe health (phy.py).

Runs `ethtool -S` only, each call under a timeout; never changes a NIC setting, never blocks
a poll past its budget. The parser is a pure function of the command's text.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.roots import Roots, read_text
from denpex.fabric.base import FabricCollector
from denpex.fabric.counters import CounterTracker
from denpex.fabric.ib.ports import HW_COUNTER_BITS, parse_counter, rdma_ports
from denpex.fabric.roce.ethtool import parse_ethtool_stats, pause_counters, storm_level
from denpex.fabric.roce.phy import PHY_HELP, phy_observations

# hw_counters of the RDMA device → (metric, HELP)
CONGESTION = {
    "np_ecn_marked_roce_packets": (
        "roce_ecn_marked_packets_total",
        "RoCE packets received with an ECN congestion mark (notification point)",
    ),
    "np_cnp_sent": ("roce_cnp_sent_total", "Congestion notification packets sent (NP)"),
    "rp_cnp_handled": ("roce_cnp_handled_total", "CNPs handled by the reaction point (RP)"),
    "rp_cnp_ignored": ("roce_cnp_ignored_total", "CNPs received and ignored by the RP"),
}
# `ethtool -S` port counters worth a series of their own → (metric, HELP)
PHY = {
    "rx_pause_ctrl_phy": ("roce_rx_pause_ctrl_frames_total", "Pause control frames received"),
    "tx_pause_ctrl_phy": ("roce_tx_pause_ctrl_frames_total", "Pause control frames sent"),
    "rx_discards_phy": ("roce_rx_discards_total", "Packets the port dropped on receive"),
    "rx_symbol_err_phy": ("roce_rx_symbol_errors_total", "Symbol errors received (physical)"),
    "rx_corrected_bits_phy": ("roce_fec_corrected_bits_total", "Bits corrected by FEC"),
    "link_down_events_phy": ("roce_link_down_events_total", "Times the physical link went down"),
    "tx_pause_storm_warning_events": (
        "roce_pause_storm_warning_events_total",
        "Times the NIC sent pause frames for longer than the storm warning time",
    ),
    "tx_pause_storm_error_events": (
        "roce_pause_storm_error_events_total",
        "Times the NIC's pause storm prevention stopped it sending pause frames",
    ),
}
HELP = {
    "roce_pause_frames_total": "Per-priority pause frames (labels netdev, direction, priority)",
    "roce_pause_frames_per_second": "Per-priority pause frames per second",
    "roce_pause_duration_seconds_total": "Time paused on a priority (mlx5 counts microseconds)",
    "roce_pause_duration_ratio": "Fraction of the last poll interval paused on a priority",
    "roce_ethtool_failures_total": "`ethtool -S` calls that failed or timed out (label netdev)",
    **{name: text for name, text in CONGESTION.values()},
    "roce_congestion_per_second": "Per-second ECN/CNP counter increase (label counter)",
    **{name: text for name, text in PHY.values()},
    **PHY_HELP,
}


def port_netdev(folder: Path, device_folder: Path) -> str | None:
    """The netdev of a RoCE port: `gid_attrs/ndevs/0`, else the device's `device/net/*`."""
    name = (read_text(folder / "gid_attrs" / "ndevs" / "0") or "").strip()
    if name:
        return name
    try:
        names = sorted(os.listdir(device_folder / "device" / "net"))
    except OSError:
        return None
    return names[0] if names else None


def roce_ports(roots: Roots) -> list[tuple[str, str, Path, str | None]]:
    """(device, port, folder, netdev) of each RDMA port whose link layer is Ethernet."""
    found = []
    for device, port, folder in rdma_ports(roots):
        if (read_text(folder / "link_layer") or "").strip() == "Ethernet":
            netdev = port_netdev(folder, folder.parent.parent)
            found.append((device, port, folder, netdev))
    return found


class RoceCollector(FabricCollector):
    name = "roce"
    stability = "experimental"
    default_interval_s = 10.0  # one `ethtool -S` per netdev per poll
    default_budget_s = 5.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        command = self.options["ethtool_command"]
        self.command: list[str] = shlex.split(command) if isinstance(command, str) else command
        self.tracker = CounterTracker()
        self.streaks: dict[tuple[str, str, str], int] = {}
        self.failures: dict[str, int] = {}
        self._blind: str | None = None

    def _ethtool_found(self) -> bool:
        program = self.command[0] if self.command else ""
        return bool(program) and (shutil.which(program) is not None or Path(program).is_file())

    def available(self) -> tuple[bool, str]:
        base = self.roots.sys("class", "infiniband")
        ports = roce_ports(self.roots)
        if not ports:
            return False, f"no RDMA port with link_layer Ethernet (RoCE) under {base}"
        netdevs = sorted({n for *_, n in ports if n})
        if not self._ethtool_found():
            program = self.command[0] if self.command else "(empty ethtool_command)"
            return True, (
                f"ECN/CNP counters of {len(ports)} RoCE port(s); `{program}` not found: "
                "no pause-frame counters or PFC storm detection (install ethtool or set "
                "ethtool_command)"
            )
        return True, f"{len(ports)} RoCE port(s), PFC counters of {', '.join(netdevs)}"

    def degraded(self) -> str | None:
        return self._blind

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        netdevs: dict[str, str] = {}
        for device, port, folder, netdev in roce_ports(ctx.roots):
            out += self._congestion(ctx, device, port, folder, netdev)
            if netdev:
                netdevs.setdefault(netdev, device)
        if not self._ethtool_found():
            return out
        deadline = time.monotonic() + float(self.options["poll_budget_s"])
        errors = []
        for netdev in sorted(netdevs):
            if time.monotonic() > deadline:
                errors.append(f"{netdev}: skipped, poll budget spent")
                continue
            text, error = self._ethtool(netdev)
            if text is None:
                errors.append(f"{netdev}: {error}")
                self.failures[netdev] = self.failures.get(netdev, 0) + 1
                labels = {"netdev": netdev}
                out.append(
                    self.metric_event(
                        ctx, "roce_ethtool_failures_total", self.failures[netdev], labels, True
                    )
                )
                continue
            out += self._pause(ctx, netdev, netdevs[netdev], parse_ethtool_stats(text))
        # blind only when every netdev failed: one bad port is a metric, not an outage
        self._blind = (
            "`ethtool -S` failed for every RoCE netdev: " + "; ".join(errors)
            if netdevs and len(errors) == len(netdevs)
            else None
        )
        return out

    def _ethtool(self, netdev: str) -> tuple[str | None, str]:
        try:
            done = subprocess.run(
                [*self.command, "-S", netdev],
                capture_output=True,
                text=True,
                timeout=float(self.options["ethtool_timeout_s"]),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return None, f"timed out after {self.options['ethtool_timeout_s']} s"
        except OSError as exc:
            return None, f"cannot run {self.command[0]}: {exc.strerror}"
        if done.returncode != 0:
            return None, f"exit {done.returncode}: {done.stderr.strip()[:200]}"
        return done.stdout, ""

    def _congestion(
        self, ctx: CollectContext, device: str, port: str, folder: Path, netdev: str | None
    ) -> list[Observation]:
        out: list[Observation] = []
        base = {"device": device, "port": port, "netdev": netdev or ""}
        for name, (metric_name, _) in CONGESTION.items():
            value = parse_counter(read_text(folder / "hw_counters" / name))
            if value is None:
                continue
            out.append(self.metric_event(ctx, metric_name, value, base, True))
            key = f"{device}/{port}/{name}"
            found = self.tracker.update(key, value, ctx.now_ns, HW_COUNTER_BITS)
            if found.rate_per_second is not None:
                labels = {**base, "counter": name}
                out.append(
                    self.metric_event(
                        ctx, "roce_congestion_per_second", found.rate_per_second, labels
                    )
                )
        return out

    def _pause(
        self, ctx: CollectContext, netdev: str, device: str, stats: Mapping[str, int]
    ) -> list[Observation]:
        out: list[Observation] = []
        base = {"netdev": netdev, "device": device}
        for name, (metric_name, _) in PHY.items():
            if name in stats:
                out.append(self.metric_event(ctx, metric_name, stats[name], base, True))
        rates: dict[tuple[str, str], dict[str, float | None]] = {}
        for counter, value in sorted(pause_counters(stats).items(), key=str):
            labels = {**base, "direction": counter.direction, "priority": counter.priority}
            key = f"{netdev}/{counter.direction}/{counter.priority}/{counter.kind}"
            found = self.tracker.update(key, value, ctx.now_ns)
            per_poll = rates.setdefault((counter.direction, counter.priority), {})
            if counter.kind == "pause":
                out.append(self.metric_event(ctx, "roce_pause_frames_total", value, labels, True))
                per_poll["frames"] = found.rate_per_second
                if found.rate_per_second is not None:
                    out.append(
                        self.metric_event(
                            ctx, "roce_pause_frames_per_second", found.rate_per_second, labels
                        )
                    )
            else:  # mlx5 counts pause duration in microseconds
                out.append(
                    self.metric_event(
                        ctx, "roce_pause_duration_seconds_total", value / 1e6, labels, True
                    )
                )
                ratio = None if found.rate_per_second is None else found.rate_per_second / 1e6
                per_poll["ratio"] = ratio
                if ratio is not None:
                    out.append(self.metric_event(ctx, "roce_pause_duration_ratio", ratio, labels))
        for (direction, priority), seen in sorted(rates.items()):
            out += self._storm(ctx, netdev, device, direction, priority, seen, stats)
        out += self._storm_prevention(ctx, netdev, device, stats)
        out += phy_observations(ctx, self, self.tracker, netdev, device, stats)
        return out

    def _storm_prevention(
        self, ctx: CollectContext, netdev: str, device: str, stats: Mapping[str, int]
    ) -> list[Observation]:
        """The NIC's own pause storm prevention fired (mlx5 `tx_pause_storm_error_events`):
        it sent pauses past the device stall watermark and stopped; no streak needed."""
        name = "tx_pause_storm_error_events"
        if name not in stats:
            return []
        found = self.tracker.update(f"{netdev}/{name}", stats[name], ctx.now_ns)
        if not found.increase:
            return []
        captures = {"netdev": netdev, "device": device, "storm_error_events": str(found.increase)}
        return [
            self.finding(
                ctx,
                "net.link_down.pfc_storm_prevention",
                attrs={"netdev": netdev, "device": device},
                captures=captures,
            )
        ]

    def _storm(
        self,
        ctx: CollectContext,
        netdev: str,
        device: str,
        direction: str,
        priority: str,
        seen: Mapping[str, float | None],
        stats: Mapping[str, int],
    ) -> list[Observation]:
        """Count consecutive storm-like polls; report once when the streak reaches
        `storm_polls`, re-arm when the priority calms down."""
        key = (netdev, direction, priority)
        frames, ratio = seen.get("frames"), seen.get("ratio")
        if frames is None and ratio is None:
            return []  # first sample or a reset: neither a storm poll nor a calm one
        if not storm_level(frames, ratio, self.options):
            self.streaks[key] = 0
            self.edges.clear(key)
            return []
        self.streaks[key] = streak = self.streaks.get(key, 0) + 1
        if streak < int(self.options["storm_polls"]) or not self.edges.first(key):
            return []
        who = (
            "the switch is pausing this NIC"
            if direction == "rx"
            else "this NIC is pausing the switch"
        )
        shown = [
            f"{frames:.0f} pause frames/s" if frames is not None else "",
            f"paused {ratio:.0%} of the time" if ratio is not None else "",
        ]
        captures = {
            "netdev": netdev,
            "device": device,
            "priority": priority,
            "direction": direction,
            "pause_frames_per_second": "" if frames is None else f"{frames:.1f}",
            "paused_ratio": "" if ratio is None else f"{ratio:.3f}",
            "polls": str(streak),
            "storm_error_events": str(stats.get("tx_pause_storm_error_events", "")),
        }
        return [
            self.finding(
                ctx,
                "net.link_down.pfc_storm",
                attrs={
                    "netdev": netdev,
                    "device": device,
                    "priority": priority,
                    "direction": direction,
                },
                captures=captures,
                values={"who": who, "shown": ", ".join(s for s in shown if s)},
            )
        ]
