"""Event (one observation) and Evidence (an event that matched a signature), DESIGN §3.

Events map 1:1 onto OTLP log records; keep every field a scalar or a flat dict of scalars.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

SEVERITIES = ("info", "warning", "error", "critical")

# Where an event can come from (DESIGN §3); `ebpf.*` sources are prefixed.
SOURCES = (
    "log",
    "kmsg",
    "journal",
    "syslog",
    "psi",
    "cgroup",
    "proc",
    "numa",
    "disk",
    "pcie",
    "agent",
    "nvml",
    "dcgm",
    "ib",
    "roce",
    "ufm",
    "gnmi",
    "nccl_topo",
    "sdk",
    "scheduler",
)
_SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


def severity_rank(severity: str) -> int:
    """0 for info … 3 for critical; unknown names rank as info."""
    return _SEVERITY_RANK.get(severity, 0)


@dataclass(slots=True)
class Event:
    """One observation from any source.

    `ts_ns` is UTC nanoseconds when the source gave a wall-clock time, else None; `seq` is the
    arrival order within one analysis, which orders events that carry no time.
    """

    body: str
    ts_ns: int | None = None
    host: str | None = None
    source: str = "log"
    kind: str = "line"
    rank: int | None = None
    pid: int | None = None
    job: str | None = None
    tenant: str | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    seq: int = 0


@dataclass(slots=True)
class Evidence:
    """An event that matched a signature (or a detector), with what the match captured."""

    id: str
    event: Event
    signature: str
    category: str
    severity: str
    captures: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    action: str = "none"

    @property
    def is_failure(self) -> bool:
        return severity_rank(self.severity) >= _SEVERITY_RANK["error"]


METRIC_RESERVED = ("value", "type")


def metric(
    name: str,
    value: float,
    *,
    source: str,
    counter: bool = False,
    labels: dict[str, str] | None = None,
    host: str | None = None,
    ts_ns: int | None = None,
    job: str | None = None,
    rank: int | None = None,
    pid: int | None = None,
) -> Event:
    """A `kind="metric"` event: `body` is the metric's name in Prometheus form without the
    `denpex_` prefix (`psi_some_avg10_ratio`); `attrs` hold `value`, `type` (`gauge` or
    `counter`) and, under every other key, its labels (strings)."""
    attrs: dict[str, Any] = {"value": float(value), "type": "counter" if counter else "gauge"}
    for key, label in (labels or {}).items():
        if key in METRIC_RESERVED:
            raise ValueError(f"metric label {key!r} is reserved")
        attrs[key] = str(label)
    return Event(
        body=name,
        ts_ns=ts_ns,
        host=host,
        source=source,
        kind="metric",
        job=job,
        rank=rank,
        pid=pid,
        attrs=attrs,
    )


def format_ts(ts_ns: int | None) -> str | None:
    """ISO 8601 UTC with milliseconds (`2026-11-30T04:56:09.123Z`), as the JSON writes times."""
    if ts_ns is None:
        return None
    dt = datetime.fromtimestamp(ts_ns // 1_000_000_000, UTC)
    millis = (ts_ns // 1_000_000) % 1000
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis:03d}Z"
