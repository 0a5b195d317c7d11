"""InfiniBand and RoCE ports in sysfs (`<sysfs>/class/infiniband/*/ports/*`): finding them,
reading state, rate and counters, and the pure parsers of those files. Reads only small
sysfs attributes; never resets a counter.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from denpex.core.roots import Roots, read_text

STATE_ACTIVE = 4
STATE_FILE = "ib_ports.json"
LEVELS = ("warning", "error", "critical")
# counters/ files counted in 4-byte words (IBA PortXmitData / PortRcvData)
WORD_COUNTERS = {"port_xmit_data", "port_rcv_data"}
# hw_counters are the driver's queue counters, 32 bits in the mlx5 firmware (QUERY_Q_COUNTER):
# they wrap around, so a value that goes down is usually a wrap, not a reset
HW_COUNTER_BITS = 32

# counters/ file → HELP of its metric, `ib_<file>_total` unless renamed below
COUNTER_HELP = {
    "symbol_error": "Minor link errors (symbol errors) on the port",
    "link_error_recovery": "Times the link error recovery process completed",
    "link_downed": "Times the link went down (recovery failed)",
    "port_rcv_errors": "Packets received with errors",
    "port_rcv_remote_physical_errors": "Packets received marked bad by a remote physical error",
    "port_rcv_switch_relay_errors": "Packets discarded because they could not be forwarded",
    "port_xmit_discards": "Outbound packets discarded",
    "port_xmit_constraint_errors": "Packets not sent because of outbound constraints",
    "port_rcv_constraint_errors": "Packets dropped because of inbound constraints",
    "local_link_integrity_errors": "Times local physical errors exceeded the integrity threshold",
    "excessive_buffer_overrun_errors": "Times consecutive buffer overruns exceeded the threshold",
    "VL15_dropped": "Subnet management packets (VL15) dropped",
    "port_xmit_wait": "Ticks the port had data to send but no credits (congestion)",
    "port_xmit_data": "Bytes transmitted on the port",
    "port_rcv_data": "Bytes received on the port",
    "port_xmit_packets": "Packets transmitted on the port",
    "port_rcv_packets": "Packets received on the port",
}
# data and packet counters are named for what they count; each also gets a per-second rate
RENAMED = {
    "port_xmit_data": "ib_port_transmit_bytes",
    "port_rcv_data": "ib_port_receive_bytes",
    "port_xmit_packets": "ib_port_transmit_packets",
    "port_rcv_packets": "ib_port_receive_packets",
}


def counter_metric(name: str) -> str:
    return RENAMED.get(name, f"ib_{name.lower()}") + "_total"


HELP = {
    "ib_port_state": "1 when the port is ACTIVE, else 0 (labels device, port, link_layer)",
    "ib_port_state_code": "IB logical port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE)",
    "ib_port_phys_state_code": "IB physical port state (2 Polling, 3 Disabled, 5 LinkUp)",
    "ib_port_rate_gigabits_per_second": "Port signalling rate in Gb/s (e.g. 200 for 4X HDR)",
    **{counter_metric(name): text for name, text in COUNTER_HELP.items()},
    **{f"{m}_per_second": f"{COUNTER_HELP[n]}, per second" for n, m in RENAMED.items()},
    "ib_port_errors_per_second": "Per-second increase of an error counter (label counter)",
    "ib_port_counter_saturated_state": "1 when a narrow port counter sits at its maximum and counts "
    "nothing more until reset (label counter)",
    "ib_hw_counter_total": "A driver hw_counters value of the port (label counter)",
    "ib_hw_counter_per_second": "Per-second increase of a driver hw_counters value",
}


def parse_state(text: str | None) -> tuple[int | None, str]:
    """`4: ACTIVE` → (4, "ACTIVE"); `5: LinkUp` → (5, "LinkUp"); absent → (None, "")."""
    code, _, name = (text or "").strip().partition(":")
    return (int(code), name.strip()) if code.strip().isdigit() else (None, "")


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def parse_rate_gbps(text: str | None) -> float | None:
    """`200 Gb/sec (4X HDR)` → 200.0; `2.5 Gb/sec (1X SDR)` → 2.5; anything else None."""
    found = _RATE.match(text or "")
    return float(found.group(1)) if found else None


def parse_counter(text: str | None) -> int | None:
    value = (text or "").strip()
    return int(value) if value.isdigit() else None


@dataclass(slots=True)
class PortReading:
    device: str
    port: str
    state: int | None
    state_name: str
    phys_state: int | None
    phys_name: str
    rate_gbps: float | None
    rate_text: str
    link_layer: str
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == STATE_ACTIVE


def rdma_ports(roots: Roots) -> list[tuple[str, str, Path]]:
    """(device, port, folder) of every RDMA port, sorted; empty without the class folder."""
    base = roots.sys("class", "infiniband")
    found = []
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return []
    for device in devices:
        try:
            ports = sorted(os.listdir(base / device / "ports"), key=lambda p: (len(p), p))
        except OSError:
            continue
        found += [(device, port, base / device / "ports" / port) for port in ports]
    return found


def read_values(folder: Path, names: Sequence[str]) -> dict[str, int]:
    values = {}
    for name in names:
        value = parse_counter(read_text(folder / name))
        if value is not None:
            values[name] = value
    return values


def read_port(
    device: str, port: str, folder: Path, counters: Sequence[str], hw_counters: Sequence[str]
) -> PortReading:
    state, state_name = parse_state(read_text(folder / "state"))
    phys, phys_name = parse_state(read_text(folder / "phys_state"))
    rate_text = (read_text(folder / "rate") or "").strip()
    return PortReading(
        device=device,
        port=port,
        state=state,
        state_name=state_name,
        phys_state=phys,
        phys_name=phys_name,
        rate_gbps=parse_rate_gbps(rate_text),
        rate_text=rate_text,
        link_layer=(read_text(folder / "link_layer") or "").strip() or "InfiniBand",
        counters=read_values(folder / "counters", counters),
        hw_counters=read_values(folder / "hw_counters", hw_counters),
    )


def expected_rates(
    ports: Sequence[PortReading], configured: float | None, min_peers: int
) -> dict[str, float]:
    """The rate each link layer's ports should run at: `configured` when set, else the most
    common rate of the ACTIVE ports of that link layer (ties: the higher) once at least
    `min_peers` of them exist, so two ports alone never outvote each other."""
    by_layer: dict[str, list[float]] = {}
    for p in ports:
        if p.active and p.rate_gbps is not None:
            by_layer.setdefault(p.link_layer, []).append(p.rate_gbps)
    if configured is not None:
        return {layer: float(configured) for layer in by_layer}
    expected = {}
    for layer, rates in by_layer.items():
        if len(rates) >= min_peers:
            expected[layer] = max(set(rates), key=lambda r: (rates.count(r), r))
    return expected
