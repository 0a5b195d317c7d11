"""InfiniBand and RoCE ports from sysfs (`<sysfs>/class/infiniband/*/ports/*`): state, rate,
port counters and hw_counters as metrics; link flaps, ports down or slower than their peers,
and rising error counters (symbol errors before a link drops) as evidence.

Reads small sysfs attributes only; never resets a counter, never sends a MAD of its own.
Each counters/ file costs a firmware query on mlx5, so only the flap and early-warning
counters are read every poll, the rest every `full_counters_every` polls.
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation, detector_evidence
from denpex.core.events import Event, metric
from denpex.core.roots import Roots, read_text
from denpex.fabric.base import FabricCollector
from denpex.fabric.counters import CounterTracker, IncreaseWindow, level_for, rising

STATE_ACTIVE = 4
STATE_FILE = "ib_ports.json"
LEVELS = ("warning", "error", "critical")
# counters/ files counted in 4-byte words (IBA PortXmitData / PortRcvData)
WORD_COUNTERS = {"port_xmit_data", "port_rcv_data"}

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


@dataclass(slots=True)
class PortMemory:
    """What the detectors remember of one port between polls."""

    state: int | None = None
    seen_active: bool = False
    down_reported: bool = False
    rate_reported: bool = False
    levels: dict[str, str | None] = field(default_factory=dict)
    windows: dict[str, IncreaseWindow] = field(default_factory=dict)
    flaps: deque[int] = field(default_factory=deque)


class IbCollector(FabricCollector):
    name = "ib"
    stability = "experimental"
    default_interval_s = 5.0  # a flap must become evidence within 10 s
    default_budget_s = 2.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self.tracker = CounterTracker()
        self.memory: dict[str, PortMemory] = {}
        self.polls = 0
        state_dir = self.options.get("state_dir")
        self.state_path = Path(state_dir, STATE_FILE) if state_dir else None

    def available(self) -> tuple[bool, str]:
        base = self.roots.sys("class", "infiniband")
        ports = rdma_ports(self.roots)
        if not ports:
            return False, f"no RDMA ports under {base} (no InfiniBand/RoCE device or driver)"
        return True, f"{len(ports)} RDMA port(s) under {base}"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        if self.polls == 0:
            self._restore(ctx.now_ns)
        full = self.polls % max(1, int(self.options["full_counters_every"])) == 0
        self.polls += 1
        names = list(self.options["counters_every_poll"])
        if full:
            names += [n for n in self.options["counters"] if n not in names]
        hw_names = list(self.options["hw_counters"]) if full else []
        readings = [read_port(d, p, f, names, hw_names) for d, p, f in rdma_ports(ctx.roots)]
        expected = expected_rates(
            readings, self.options.get("expected_rate_gbps"), int(self.options["min_peers"])
        )
        out: list[Observation] = []
        for reading in readings:
            memory = self.memory.setdefault(reading.key, PortMemory())
            out += port_observations(
                ctx, reading, memory, self.tracker, self.options, expected.get(reading.link_layer)
            )
        self._save(ctx.now_ns)
        return out

    # -- persistence: a restarted agent (or a second `--once` with a state_dir) compares
    # against the counters it saw last, so flaps in between are not lost -------------------
    def _restore(self, now_ns: int) -> None:
        if self.state_path is None:
            return
        try:
            data = json.loads(self.state_path.read_text())
            saved_ns = int(data["ts_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if not 0 <= now_ns - saved_ns <= float(self.options["state_max_age_s"]) * 1e9:
            return
        counters, ports = data.get("counters"), data.get("ports")
        if not isinstance(counters, dict) or not isinstance(ports, dict):
            return
        self.tracker.restore(counters)
        for key, port in ports.items():
            if isinstance(port, dict):
                state = port.get("state")
                self.memory[str(key)] = PortMemory(
                    state=state if isinstance(state, int) else None,
                    seen_active=bool(port.get("seen_active")),
                    down_reported=bool(port.get("down_reported")),
                )

    def _save(self, now_ns: int) -> None:
        if self.state_path is None:
            return
        data = {
            "ts_ns": now_ns,
            "counters": self.tracker.snapshot(),
            "ports": {
                key: {
                    "state": m.state,
                    "seen_active": m.seen_active,
                    "down_reported": m.down_reported,
                }
                for key, m in self.memory.items()
            },
        }
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.state_path)
        except OSError:
            pass  # persistence is a convenience: the next poll still compares in memory


def ib_metric(
    ctx: CollectContext, name: str, value: float, labels: dict[str, str], counter: bool = False
) -> Event:
    return metric(
        name, value, source="ib", counter=counter, labels=labels, host=ctx.host, ts_ns=ctx.now_ns
    )


def port_observations(
    ctx: CollectContext,
    reading: PortReading,
    memory: PortMemory,
    tracker: CounterTracker,
    options: Mapping[str, Any],
    expected_gbps: float | None,
) -> list[Observation]:
    """One port's metrics and evidence for this poll; updates `memory` and `tracker`."""
    port = {"device": reading.device, "port": reading.port}
    out: list[Observation] = []
    if reading.state is not None:
        layer = {**port, "link_layer": reading.link_layer}
        out.append(ib_metric(ctx, "ib_port_state", 1.0 if reading.active else 0.0, layer))
        out.append(ib_metric(ctx, "ib_port_state_code", reading.state, port))
    if reading.phys_state is not None:
        out.append(ib_metric(ctx, "ib_port_phys_state_code", reading.phys_state, port))
    if reading.rate_gbps is not None:
        out.append(ib_metric(ctx, "ib_port_rate_gigabits_per_second", reading.rate_gbps, port))
    bits: Mapping[str, int] = options.get("counter_bits") or {}
    rules: Mapping[str, Mapping[str, Any]] = options.get("error_thresholds") or {}
    increases: dict[str, int] = {}
    for name, value in reading.counters.items():
        scale = 4 if name in WORD_COUNTERS else 1
        width = int(bits.get(name, bits.get("default", 64)))
        found = tracker.update(f"{reading.key}/{name}", value, ctx.now_ns, width)
        if name in COUNTER_HELP:
            out.append(ib_metric(ctx, counter_metric(name), value * scale, port, counter=True))
        else:
            labels = {**port, "counter": name}
            out.append(ib_metric(ctx, "ib_hw_counter_total", value, labels, counter=True))
        if found.increase is not None:
            increases[name] = found.increase
        if found.rate_per_second is None:
            continue
        if name in RENAMED:
            rate_name = f"{RENAMED[name]}_per_second"
            out.append(ib_metric(ctx, rate_name, found.rate_per_second * scale, port))
        elif name in rules:
            labels = {**port, "counter": name}
            out.append(ib_metric(ctx, "ib_port_errors_per_second", found.rate_per_second, labels))
    for name, value in reading.hw_counters.items():
        found = tracker.update(f"{reading.key}/hw/{name}", value, ctx.now_ns)
        labels = {**port, "counter": name}
        out.append(ib_metric(ctx, "ib_hw_counter_total", value, labels, counter=True))
        if found.increase is not None:
            increases.setdefault(name, found.increase)
        if found.rate_per_second is not None:
            out.append(ib_metric(ctx, "ib_hw_counter_per_second", found.rate_per_second, labels))
    ignored = options.get("ignore_ports") or ()
    if reading.key not in ignored and reading.device not in ignored:
        out += _link_evidence(ctx, reading, memory, increases, options)
        out += _rate_evidence(ctx, reading, memory, expected_gbps)
        out += _error_evidence(ctx, reading, memory, increases, rules)
    if reading.state is not None:
        memory.state = reading.state
        memory.seen_active = memory.seen_active or reading.active
    return out


def _link_evidence(
    ctx: CollectContext,
    r: PortReading,
    m: PortMemory,
    increases: Mapping[str, int],
    options: Mapping[str, Any],
) -> list[Observation]:
    """Down (edge-triggered), flapped between polls (link_downed grew while ACTIVE), or
    with link drops recorded before anyone looked (first poll without a saved baseline)."""
    if r.state is None:
        return []
    downed = increases.get("link_downed", 0)
    link_downed = r.counters.get("link_downed")
    if not r.active:
        if m.down_reported:
            return []
        m.down_reported = True
        was_up = m.state == STATE_ACTIVE or m.seen_active
        flaps = _count_flaps(m, ctx.now_ns, max(downed, 1) if was_up else downed, options)
        severity = "error" if was_up else str(options["down_at_start_severity"])
        when = "went down" if was_up else "is down"
        summary = (
            f"{r.link_layer} port {r.key} {when}: state {r.state_name or r.state}, "
            f"physical {r.phys_name or r.phys_state}"
        )
        return [
            _evidence(
                ctx,
                r,
                "net.link_down.ib_port_down",
                "net.link_down",
                severity,
                summary,
                "check_fabric",
                {"flaps_in_window": str(flaps)},
            )
        ]
    m.down_reported = False
    if downed > 0:
        flaps = _count_flaps(m, ctx.now_ns, downed, options)
        severity, action = "error", "check_fabric"
        if flaps >= int(options["flap_drain_count"]):
            severity, action = "critical", "drain_node"
        summary = (
            f"{r.link_layer} port {r.key} flapped: link went down {downed} time(s) since the "
            f"last poll and is ACTIVE again ({flaps} in the last {options['flap_window_s']} s)"
        )
        captures = {"link_downed_increase": str(downed), "flaps_in_window": str(flaps)}
        return [
            _evidence(
                ctx,
                r,
                "net.link_down.ib_port_flap",
                "net.link_down",
                severity,
                summary,
                action,
                captures,
            )
        ]
    warn_at = options.get("link_downed_at_start_warn")
    if m.state is None and warn_at and link_downed is not None and link_downed >= int(warn_at):
        summary = (
            f"{r.link_layer} port {r.key} is ACTIVE but its link went down {link_downed} "
            "time(s) since its counters were last reset (before this first look)"
        )
        return [
            _evidence(
                ctx,
                r,
                "net.link_down.ib_link_downed_before_start",
                "net.link_down",
                "warning",
                summary,
                "check_fabric",
                {},
            )
        ]
    return []


def _count_flaps(m: PortMemory, now_ns: int, new: int, options: Mapping[str, Any]) -> int:
    horizon = now_ns - int(float(options["flap_window_s"]) * 1e9)
    m.flaps.extend([now_ns] * min(new, 1000))
    while m.flaps and m.flaps[0] <= horizon:
        m.flaps.popleft()
    return len(m.flaps)


def _rate_evidence(
    ctx: CollectContext, r: PortReading, m: PortMemory, expected: float | None
) -> list[Observation]:
    if not r.active or r.rate_gbps is None:
        return []
    if expected is None or r.rate_gbps >= expected:
        m.rate_reported = False
        return []
    if m.rate_reported:
        return []
    m.rate_reported = True
    summary = (
        f"{r.link_layer} port {r.key} runs at {r.rate_gbps:g} Gb/s ({r.rate_text}), below the "
        f"{expected:g} Gb/s expected: a degraded cable, lane or speed negotiation"
    )
    return [
        _evidence(
            ctx,
            r,
            "net.link_down.ib_port_rate_degraded",
            "net.link_down",
            "warning",
            summary,
            "check_fabric",
            {"expected_gbps": f"{expected:g}"},
        )
    ]


def _error_evidence(
    ctx: CollectContext,
    r: PortReading,
    m: PortMemory,
    increases: Mapping[str, int],
    rules: Mapping[str, Mapping[str, Any]],
) -> list[Observation]:
    """Error counters whose increase over their window reaches a threshold: reported when
    the level rises, re-armed once the window falls below the lowest threshold."""
    out: list[Observation] = []
    for name, rule in rules.items():
        if name not in increases and name not in m.windows:
            continue
        window = m.windows.setdefault(name, IncreaseWindow())
        window.add(ctx.now_ns, increases.get(name, 0))
        window_s = float(rule.get("window_s", 300))
        total = window.total(ctx.now_ns, window_s)
        level = level_for(total, rule)
        if rising(m.levels.get(name), level, LEVELS):
            assert level is not None
            summary = (
                f"{r.link_layer} port {r.key}: {name} rose by {total} in the last "
                f"{window_s:g} s (threshold {rule.get(level)}); the link may drop next"
                if name in ("symbol_error", "link_error_recovery")
                else f"{r.link_layer} port {r.key}: {name} rose by {total} in the last "
                f"{window_s:g} s (threshold {rule.get(level)})"
            )
            captures = {"counter": name, "increase": str(total), "window_s": f"{window_s:g}"}
            out.append(
                _evidence(
                    ctx,
                    r,
                    f"net.ib_error.ib_{name.lower()}",
                    "net.ib_error",
                    level,
                    summary,
                    "check_fabric",
                    captures,
                )
            )
        m.levels[name] = level
    return out


def _evidence(
    ctx: CollectContext,
    r: PortReading,
    signature: str,
    category: str,
    severity: str,
    summary: str,
    action: str,
    extra: dict[str, str],
) -> Observation:
    attrs = {"device": r.device, "port": r.port, "link_layer": r.link_layer}
    event = Event(
        body=summary, ts_ns=ctx.now_ns, host=ctx.host, source="ib", kind="state", attrs=dict(attrs)
    )
    captures = {
        **attrs,
        "state": r.state_name or str(r.state),
        "phys_state": r.phys_name or str(r.phys_state),
        "rate": r.rate_text,
        **{k: str(v) for k, v in r.counters.items() if k in ("link_downed", "symbol_error")},
        **extra,
    }
    return detector_evidence(
        event,
        signature=signature,
        category=category,
        severity=severity,
        summary=summary,
        action=action,
        captures=captures,
    )
