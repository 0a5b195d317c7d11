"""The InfiniBand port detectors: one port's metrics and evidence per poll (flaps, ports down
or slower than their peers, rising error counters, counters stuck at their maximum) from its
readings and what is remembered of it. Pure: no I/O, state is passed in and updated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from denpex.core.collector import CollectContext, Observation, poll_finding
from denpex.core.events import Event, metric
from denpex.fabric.counters import CounterTracker, IncreaseWindow, level_for, rising, saturated
from denpex.fabric.ib.ports import (
    COUNTER_HELP,
    HW_COUNTER_BITS,
    LEVELS,
    RENAMED,
    STATE_ACTIVE,
    WORD_COUNTERS,
    PortReading,
    counter_metric,
)

# error counter (settings error_thresholds) → its detector
ERROR_DETECTORS = {
    "symbol_error": "net.ib_error.ib_symbol_error",
    "link_error_recovery": "net.ib_error.ib_link_error_recovery",
    "port_rcv_errors": "net.ib_error.ib_port_rcv_errors",
    "port_rcv_remote_physical_errors": "net.ib_error.ib_port_rcv_remote_physical_errors",
    "port_xmit_discards": "net.ib_error.ib_port_xmit_discards",
    "local_link_integrity_errors": "net.ib_error.ib_local_link_integrity_errors",
    "excessive_buffer_overrun_errors": "net.ib_error.ib_excessive_buffer_overrun_errors",
    "local_ack_timeout_err": "net.ib_error.ib_local_ack_timeout_err",
    "req_transport_retries_exceeded": "net.ib_error.ib_req_transport_retries_exceeded",
    "req_rnr_retries_exceeded": "net.ib_error.ib_req_rnr_retries_exceeded",
}


def threshold_problems(rules: Mapping[str, Any]) -> list[str]:
    """Counters in `error_thresholds` that no detector explains."""
    return [
        f"collectors.ib.error_thresholds: no detector for counter {name!r} "
        f"(known: {', '.join(ERROR_DETECTORS)})"
        for name in rules
        if name not in ERROR_DETECTORS
    ]


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
    saturated: set[str] = field(default_factory=set)  # counters reported stuck at their max


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
    widths: dict[str, int] = {}
    for name, value in reading.counters.items():
        scale = 4 if name in WORD_COUNTERS else 1
        width = widths[name] = int(bits.get(name, bits.get("default", 64)))
        found = tracker.update(f"{reading.key}/{name}", value, ctx.now_ns, width, saturates=True)
        if width < 64:
            labels = {**port, "counter": name}
            full = 1.0 if saturated(value, width) else 0.0
            out.append(ib_metric(ctx, "ib_port_counter_saturated_state", full, labels))
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
        found = tracker.update(f"{reading.key}/hw/{name}", value, ctx.now_ns, HW_COUNTER_BITS)
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
        out += _saturation_evidence(ctx, reading, memory, widths)
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
        captures = {"flaps_in_window": str(flaps)}
        return [
            _evidence(
                ctx, r, "net.link_down.ib_port_down", captures, {"when": when}, severity=severity
            )
        ]
    m.down_reported = False
    if downed > 0:
        flaps = _count_flaps(m, ctx.now_ns, downed, options)
        severity, action = "error", "check_fabric"
        if flaps >= int(options["flap_drain_count"]):
            severity, action = "critical", "drain_node"
        captures = {"link_downed_increase": str(downed), "flaps_in_window": str(flaps)}
        window = {"window_s": options["flap_window_s"]}
        return [
            _evidence(
                ctx,
                r,
                "net.link_down.ib_port_flap",
                captures,
                window,
                severity=severity,
                action=action,
            )
        ]
    warn_at = options.get("link_downed_at_start_warn")
    if m.state is None and warn_at and link_downed is not None and link_downed >= int(warn_at):
        return [_evidence(ctx, r, "net.link_down.ib_link_downed_before_start", {}, {})]
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
    captures = {"expected_gbps": f"{expected:g}"}
    values = {"rate_gbps": r.rate_gbps}
    return [_evidence(ctx, r, "net.link_down.ib_port_rate_degraded", captures, values)]


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
            captures = {"counter": name, "increase": str(total), "window_s": f"{window_s:g}"}
            values = {"threshold": rule.get(level)}
            out.append(_evidence(ctx, r, ERROR_DETECTORS[name], captures, values, severity=level))
        m.levels[name] = level
    return out


def _saturation_evidence(
    ctx: CollectContext, r: PortReading, m: PortMemory, widths: Mapping[str, int]
) -> list[Observation]:
    """A counter at its maximum counts nothing more until it is reset: reported once when it
    gets there (or is found there), re-armed once it reads below its maximum again."""
    out: list[Observation] = []
    for name, width in widths.items():
        value = r.counters[name]
        if not saturated(value, width):
            m.saturated.discard(name)
            continue
        if name in m.saturated:
            continue
        m.saturated.add(name)
        captures = {"counter": name, "value": str(value), "bits": str(width)}
        out.append(_evidence(ctx, r, "net.ib_error.ib_counter_saturated", captures, {}))
    return out


def _evidence(
    ctx: CollectContext,
    r: PortReading,
    detector_id: str,
    extra: dict[str, str],
    values: dict[str, Any],
    *,
    severity: str | None = None,
    action: str | None = None,
) -> Observation:
    attrs = {"device": r.device, "port": r.port, "link_layer": r.link_layer}
    captures = {
        **attrs,
        "key": r.key,
        "state": r.state_name or str(r.state),
        "phys_state": r.phys_name or str(r.phys_state),
        "rate": r.rate_text,
        **{k: str(v) for k, v in r.counters.items() if k in ("link_downed", "symbol_error")},
        **extra,
    }
    return poll_finding(
        ctx,
        "ib",
        detector_id,
        attrs=dict(attrs),
        captures=captures,
        values=values,
        severity=severity,
        action=action,
    )
