"""Xid codes as data (`xid.yaml`, merged with a site's overrides) and the per-(GPU, Xid)
counting that turns a flood of one Xid into one evidence with a count.

Pure: no NVML, no clock of its own (times are passed in); never drops an occurrence from
the totals, whatever the thresholds say.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.core.detectors import UnknownDetector, detector
from denpex.core.diagnosis import ACTIONS
from denpex.core.events import SEVERITIES

TABLE_FIELDS = ("detector", "count", "window_s")
OPTIONAL_FIELDS = ("title",)  # the catalog's name of the code (dcgm-exporter's err_msg)
# what a site may change per code; the category is what the code means (its detector's)
OVERRIDE_FIELDS = ("severity", "action", "count", "window_s")


class XidTableError(ValueError):
    """A table or override that cannot be used; the message names every problem."""


@dataclass(frozen=True, slots=True)
class XidRule:
    """How one Xid code becomes evidence: its detector (denpex/core/detectors.yaml), the
    severity and action it gets (the detector's unless a site changed them), and how many
    occurrences inside one window make one evidence."""

    detector: str
    category: str
    severity: str
    action: str
    count: int  # occurrences inside one window that make evidence
    window_s: float


@dataclass(frozen=True, slots=True)
class XidTable:
    codes: Mapping[int, XidRule]
    default: XidRule
    titles: Mapping[int, str] = field(default_factory=dict)

    def rule(self, xid: int) -> XidRule:
        return self.codes.get(xid, self.default)


def _problems(where: str, fields: Mapping[str, Any], allowed: tuple[str, ...]) -> list[str]:
    problems = [
        f"{where}.{k}: the category is the code's detector's (a site changes severity/action)"
        if k == "category"
        else f"{where}.{k}: unknown field"
        for k in fields
        if k not in allowed
    ]
    if "detector" in fields:
        try:
            detector(str(fields["detector"]))
        except UnknownDetector as exc:
            problems.append(f"{where}.detector: {exc}")
    if "severity" in fields and fields["severity"] not in SEVERITIES:
        problems.append(f"{where}.severity: one of {', '.join(SEVERITIES)}")
    if "action" in fields and fields["action"] not in ACTIONS:
        problems.append(f"{where}.action: one of {', '.join(ACTIONS)}")
    count = fields.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        problems.append(f"{where}.count: an integer >= 1")
    window = fields.get("window_s", 0)
    if not isinstance(window, int | float) or isinstance(window, bool) or window < 0:
        problems.append(f"{where}.window_s: seconds >= 0")
    return problems


def _rule(fields: Mapping[str, Any]) -> XidRule:
    entry = detector(str(fields["detector"]))
    return XidRule(
        detector=entry.id,
        category=entry.category,
        severity=entry.severity,
        action=entry.action,
        count=int(fields["count"]),
        window_s=float(fields["window_s"]),
    )


def parse_table(data: Mapping[str, Any], where: str = "xid.yaml") -> XidTable:
    """A parsed `xid.yaml` → XidTable; XidTableError names every problem."""
    default = data.get("default") or {}
    codes = data.get("codes") or {}
    problems = _problems(f"{where}:default", default, TABLE_FIELDS)
    problems += [f"{where}:default.{f}: required" for f in TABLE_FIELDS if f not in default]
    for code, fields in codes.items():
        if not isinstance(code, int):
            problems.append(f"{where}:codes.{code}: an Xid number")
            continue
        fields = fields or {}
        problems += _problems(f"{where}:codes.{code}", fields, TABLE_FIELDS + OPTIONAL_FIELDS)
        problems += [f"{where}:codes.{code}.{f}: required" for f in TABLE_FIELDS if f not in fields]
    if problems:
        raise XidTableError("; ".join(problems))
    return XidTable(
        codes={code: _rule(fields) for code, fields in codes.items()},
        default=_rule(default),
        titles={code: str(f["title"]) for code, f in codes.items() if f.get("title")},
    )


@cache
def default_table() -> XidTable:
    text = resources.files("denpex.gpu.nvml").joinpath("xid.yaml").read_text()
    return parse_table(yaml.safe_load(text))


def merge_overrides(table: XidTable, overrides: Mapping[Any, Any] | None) -> XidTable:
    """`table` with a site's `xid_overrides` applied ({79: {severity: ...}}: severity,
    action, count, window_s; keys may be
    strings of digits, as YAML or JSON configs give them). A code not in the table starts
    from the table's default rule. Pure; XidTableError names every problem."""
    if not overrides:
        return table
    if not isinstance(overrides, Mapping):
        raise XidTableError("xid_overrides: a mapping of Xid number to fields")
    problems: list[str] = []
    codes = dict(table.codes)
    for key, fields in overrides.items():
        code = int(key) if isinstance(key, int) or str(key).isdigit() else None
        if code is None or not isinstance(fields, Mapping):
            problems.append(f"xid_overrides.{key}: an Xid number mapped to fields")
            continue
        found = _problems(f"xid_overrides.{code}", fields, OVERRIDE_FIELDS)
        if found:
            problems += found
            continue
        codes[code] = replace(table.rule(code), **dict(fields))
    if problems:
        raise XidTableError("; ".join(problems))
    return XidTable(codes=codes, default=table.default, titles=table.titles)


@dataclass(frozen=True, slots=True)
class XidBurst:
    """Occurrences of one Xid on one GPU inside one window that reached its threshold."""

    gpu: str
    xid: int
    count: int
    first_ns: int
    last_ns: int
    rule: XidRule


@dataclass(slots=True)
class _Window:
    first_ns: int
    last_ns: int
    count: int = 1
    reported: bool = False


class XidTracker:
    """Counts Xids per (GPU, code): `record` is called by the event thread, `due` by the
    poll; thread-safe. `totals` never lose an occurrence; `last` is the last Xid per GPU
    (what DCGM_FI_DEV_XID_ERRORS shows)."""

    def __init__(self, table: XidTable) -> None:
        self.table = table
        self.totals: dict[tuple[str, int], int] = {}
        self.last: dict[str, int] = {}
        self._windows: dict[tuple[str, int], _Window] = {}
        self._lock = threading.Lock()

    def record(self, gpu: str, xid: int, ts_ns: int) -> None:
        key = (gpu, xid)
        window_ns = int(self.table.rule(xid).window_s * 1e9)
        with self._lock:
            self.totals[key] = self.totals.get(key, 0) + 1
            self.last[gpu] = xid
            window = self._windows.get(key)
            if window is None or ts_ns - window.first_ns > window_ns:
                self._windows[key] = _Window(first_ns=ts_ns, last_ns=ts_ns)
            else:
                window.count += 1
                window.last_ns = max(window.last_ns, ts_ns)

    def due(self, now_ns: int) -> list[XidBurst]:
        """Windows that reached their threshold since the last call (each reported once);
        windows that have closed are forgotten."""
        out = []
        with self._lock:
            for key, window in list(self._windows.items()):
                rule = self.table.rule(key[1])
                if not window.reported and window.count >= rule.count:
                    window.reported = True
                    out.append(
                        XidBurst(
                            key[0], key[1], window.count, window.first_ns, window.last_ns, rule
                        )
                    )
                if now_ns - window.first_ns > rule.window_s * 1e9:
                    del self._windows[key]
        return sorted(out, key=lambda burst: (burst.first_ns, burst.gpu, burst.xid))

    def snapshot(self) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
        with self._lock:
            return dict(self.totals), dict(self.last)
