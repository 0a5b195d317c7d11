"""What the UFM collector makes of UFM's answers: port metrics, link-down/degraded evidence,
and evidence for new alarms and events that concern this node, deduplicated across polls.

Pure functions over decoded JSON plus a small persisted state; never does network I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation, poll_finding
from denpex.core.events import Evidence, metric

HELP = {
    "ufm_up": "1 when the last poll of UFM succeeded, 0 when UFM was unreachable or refused",
    "ufm_port_up": "1 when UFM sees the port Active with the physical link up (labels port, ...)",
    "ufm_port_width_lanes": "Active width of the port as UFM reports it",
    "ufm_port_rate_bits_per_second": "Data rate of the port: lane rate of its active speed x width",
    "ufm_alarms_active": "Active UFM alarms about this node's ports, by severity",
}
# UFM severity → evidence severity
SEVERITY = {"critical": "critical", "major": "error", "minor": "warning", "warning": "warning"}
UFM_SEVERITY_RANK = {"info": 0, "warning": 1, "minor": 2, "major": 3, "critical": 4}
PORT_DETECTORS = {
    "down": "net.link_down.ufm_port_down",
    "degraded": "net.link_down.ufm_port_degraded",
}
# (alarm | event, the category `alarm_categories` chose) → detector
ITEM_DETECTORS = {
    ("alarm", "net.link_down"): "net.link_down.ufm_alarm",
    ("alarm", "net.ib_error"): "net.ib_error.ufm_alarm",
    ("event", "net.link_down"): "net.link_down.ufm_event",
    ("event", "net.ib_error"): "net.ib_error.ufm_event",
}
ITEM_CATEGORIES = sorted({category for _, category in ITEM_DETECTORS})


def port_is_up(port: Mapping[str, Any]) -> bool:
    physical = str(port.get("physical_state", "")).lower().replace(" ", "")
    return physical == "linkup" and str(port.get("logical_state", "")).lower() == "active"


def parse_width(text: Any) -> int | None:
    """`4x` → 4; None for `N/A` or absent."""
    value = str(text or "").strip().lower().removesuffix("x")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _labels(port: Mapping[str, Any]) -> dict[str, str]:
    return {
        "port": str(port.get("name", "")),
        "system": str(port.get("system_name", "")),
        "dname": str(port.get("dname", "")),
        "peer": str(port.get("peer_node_name", "") or port.get("peer", "")),
    }


def port_metrics(
    ctx: CollectContext, ports: list[dict[str, Any]], lane_rate_gbps: Mapping[str, float]
) -> list[Observation]:
    out: list[Observation] = [metric("ufm_up", 1, source="ufm", host=ctx.host, ts_ns=ctx.now_ns)]
    for port in ports:
        labels = _labels(port)
        values: list[tuple[str, float | None]] = [("ufm_port_up", float(port_is_up(port)))]
        width = parse_width(port.get("active_width"))
        values.append(("ufm_port_width_lanes", width))
        lane = lane_rate_gbps.get(str(port.get("active_speed", "")).upper())
        rate = lane * width * 1e9 if lane and width and port_is_up(port) else None
        values.append(("ufm_port_rate_bits_per_second", rate))
        for name, value in values:
            if value is not None:
                out.append(
                    metric(
                        name, value, source="ufm", labels=labels, host=ctx.host, ts_ns=ctx.now_ns
                    )
                )
    return out


def port_problem(port: Mapping[str, Any], options: Mapping[str, Any]) -> tuple[str, str] | None:
    """("down" | "degraded", detail) for a port that is down or runs below the expected
    width or speed (options `expected_width`, `expected_speed`), else None."""
    if not port_is_up(port):
        return "down", (
            f"physical state {port.get('physical_state', '?')}, "
            f"logical state {port.get('logical_state', '?')}"
        )
    want_width = parse_width(options.get("expected_width"))
    width = parse_width(port.get("active_width"))
    if want_width and width and width < want_width:
        return "degraded", f"width {width}x of {want_width}x"
    want_speed = str(options.get("expected_speed") or "").upper()
    speed = str(port.get("active_speed", "")).upper()
    rates = options.get("lane_rate_gbps") or {}
    if want_speed and speed and rates.get(speed, 0) < rates.get(want_speed, 0):
        return "degraded", f"speed {speed} below {want_speed}"
    return None


def in_scope(ports: list[dict[str, Any]], guids: set[str], systems: list[str]) -> set[str]:
    """The object names an alarm or event must carry to concern this node: its port names
    (`<guid>_<n>`), GUIDs, system names, and the switch ports its links end on."""
    scope = set(guids) | {s.lower() for s in systems}
    for port in ports:
        for key in ("name", "guid", "system_id", "system_name", "peer"):
            if port.get(key):
                scope.add(str(port[key]).lower())
    return scope


def concerns(item: Mapping[str, Any], scope: set[str]) -> bool:
    names = (item.get("object_name"), item.get("related_object_name"))
    for name in (str(n).lower() for n in names if n):
        if name in scope or name.split("_")[0] in scope:
            return True
    path = str(item.get("object_path") or item.get("related_object_path") or "").lower()
    return any(f": {s} " in f"{path} " or f"/ {s} " in f"{path} " for s in scope if s)


def categorise(item: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """Taxonomy id for an alarm or event: the first `alarm_categories` entry whose `match`
    occurs in its name or description (case-insensitive), else `default_category`."""
    text = f"{item.get('name', '')} | {item.get('description', '')}".lower()
    for rule in options.get("alarm_categories") or []:
        if str(rule.get("match", "")).lower() in text:
            return str(rule["category"])
    return str(options.get("default_category", "net.ib_error"))


def category_problems(options: Mapping[str, Any]) -> list[str]:
    """Categories in `alarm_categories`/`default_category` that UFM evidence cannot have."""
    chosen = [rule.get("category") for rule in options.get("alarm_categories") or []]
    chosen.append(options.get("default_category", "net.ib_error"))
    return [
        f"collectors.ufm: category {c!r} is not one of {', '.join(ITEM_CATEGORIES)}"
        for c in chosen
        if c not in ITEM_CATEGORIES
    ]


@dataclass(slots=True)
class UfmState:
    """What survives between polls (and restarts, with state_dir): the alarms already
    reported, the newest event id seen, and the ports already reported down/degraded."""

    alarm_ids: set[str] = field(default_factory=set)
    last_event_id: int | None = None
    bad_ports: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None) -> UfmState:
        try:
            data = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            data = {}
        last = data.get("last_event_id")
        return cls(
            alarm_ids=set(map(str, data.get("alarm_ids", []))),
            last_event_id=int(last) if isinstance(last, int) else None,
            bad_ports=dict(data.get("bad_ports", {})),
        )

    def save(self, path: Path | None) -> None:
        if path is None:
            return
        data = {
            "alarm_ids": sorted(self.alarm_ids),
            "last_event_id": self.last_event_id,
            "bad_ports": self.bad_ports,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(path)
        except OSError:
            pass  # state is an optimisation: without it a restart re-reports, never misses


def _evidence(
    ctx: CollectContext,
    detector_id: str,
    *,
    ts_ns: int | None,
    captures: dict[str, str],
    values: dict[str, Any],
    severity: str | None = None,
) -> Evidence:
    return poll_finding(
        ctx,
        "ufm",
        detector_id,
        ts_ns=ts_ns,
        attrs=dict(captures),
        captures=captures,
        values=values,
        severity=severity,
    )


def port_evidence(
    ctx: CollectContext,
    ports: list[dict[str, Any]],
    options: Mapping[str, Any],
    state: UfmState,
) -> list[Observation]:
    """net.link_down evidence for each port that turned down or degraded since last poll."""
    out: list[Observation] = []
    now_bad: dict[str, str] = {}
    for port in ports:
        problem = port_problem(port, options)
        if problem is None:
            continue
        name = str(port.get("name", ""))
        what, detail = problem
        # a down port is one problem whatever its states; a degraded one per width/speed
        now_bad[name] = what if what == "down" else detail
        if state.bad_ports.get(name) == now_bad[name]:
            continue
        labels = _labels(port)
        where = f"{labels['system']} {labels['dname']}".strip() or name
        peer = f" (peer {labels['peer']} port {port.get('peer_port_dname', '?')})"
        out.append(
            _evidence(
                ctx,
                PORT_DETECTORS[what],
                ts_ns=None,
                captures={**labels, "problem": what, "detail": detail},
                values={"where": where, "peer_text": peer},
            )
        )
    state.bad_ports = now_bad
    return out


def alarm_evidence(
    ctx: CollectContext,
    alarms: list[dict[str, Any]],
    events: list[dict[str, Any]],
    scope: set[str],
    options: Mapping[str, Any],
    state: UfmState,
) -> list[Observation]:
    """Evidence for alarms not reported before and events newer than the last seen id, when
    they concern this node and reach `alarm_min_severity`. The first poll without saved
    state takes existing events as a baseline; active alarms are current faults and count."""
    floor = UFM_SEVERITY_RANK.get(str(options.get("alarm_min_severity", "major")).lower(), 3)
    out: list[Observation] = []
    active: dict[str, int] = {}
    current_ids: set[str] = set()
    for alarm in alarms:
        if not concerns(alarm, scope):
            continue
        severity = str(alarm.get("severity", "Info"))
        active[severity] = active.get(severity, 0) + 1
        alarm_id = str(alarm.get("id"))
        current_ids.add(alarm_id)
        if alarm_id not in state.alarm_ids and UFM_SEVERITY_RANK.get(severity.lower(), 0) >= floor:
            out.append(_item_evidence(ctx, alarm, "alarm", options))
    state.alarm_ids = current_ids
    for severity, count in sorted(active.items()):
        out.append(
            metric(
                "ufm_alarms_active",
                count,
                source="ufm",
                labels={"severity": severity},
                host=ctx.host,
                ts_ns=ctx.now_ns,
            )
        )
    ids = [e["id"] for e in events if isinstance(e.get("id"), int)]
    baseline = state.last_event_id is None
    for event in events:
        event_id = event.get("id")
        if baseline or not isinstance(event_id, int) or event_id <= (state.last_event_id or 0):
            continue
        severity = str(event.get("severity", "Info")).lower()
        if concerns(event, scope) and UFM_SEVERITY_RANK.get(severity, 0) >= floor:
            out.append(_item_evidence(ctx, event, "event", options))
    if ids:
        state.last_event_id = max([*ids, state.last_event_id or 0])
    return out


def _item_evidence(
    ctx: CollectContext, item: Mapping[str, Any], kind: str, options: Mapping[str, Any]
) -> Evidence:
    category = categorise(item, options)
    name = str(item.get("name", "?"))
    detail = str(item.get("reason") or item.get("description") or "")
    obj = str(item.get("object_path") or item.get("object_name") or "?")
    return _evidence(
        ctx,
        ITEM_DETECTORS[(kind, category)],
        ts_ns=parse_ufm_time(item.get("timestamp")),
        # UFM's own severity of the alarm or event decides
        severity=SEVERITY.get(str(item.get("severity", "")).lower(), "warning"),
        values={"detail_text": f": {detail}" if detail else ""},
        captures={
            f"{kind}_id": str(item.get("id")),
            "name": name,
            "object": obj,
            "ufm_severity": str(item.get("severity", "")),
            "detail": detail,
        },
    )


def parse_ufm_time(text: Any) -> int | None:
    """UFM's `2024-05-28 08:23:10` or `2017-05-08 11:48:09.351` (taken as UTC) → ns."""
    if not isinstance(text, str):
        return None
    for pattern in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S"):
        try:
            dt = datetime.strptime(text.strip(), pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
        return int(dt.timestamp() * 1_000_000) * 1000
    return None
