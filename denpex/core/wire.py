"""Messages processes exchange over the wire (DESIGN §2): JSON-able dataclasses, no I/O.

`Registration` is what `denpex run` (or the SDK) tells a node agent about a job process so
that the agent's evidence for that pid or cgroup carries the job, rank and tenant. The
Event/Evidence JSON form below is what the spool stores and the control plane ingests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from denpex.core.events import SEVERITIES, Event, Evidence


class WireError(ValueError):
    """A message that does not have the fields and types its kind requires."""


@dataclass(frozen=True, slots=True)
class Registration:
    pid: int
    job: str | None = None
    rank: int | None = None
    tenant: str | None = None
    cgroup: str | None = None  # as /proc/<pid>/cgroup names it, e.g. "/slurm/uid_0/job_42"
    started_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> Registration:
        if not isinstance(data, dict):
            raise WireError("a registration is a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise WireError(f"unknown registration field(s): {', '.join(unknown)}")
        pid = data.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise WireError("registration needs a positive integer 'pid'")
        for name in ("rank", "started_ns"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise WireError(f"registration field {name!r} must be an integer")
        for name in ("job", "tenant", "cgroup"):
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise WireError(f"registration field {name!r} must be a string")
        return cls(**data)


# --- Event and Evidence -------------------------------------------------------------------
#
# The JSON form of an Event is one flat object: the Event's fields at the top level (None and
# empty values left out), `attrs` as one flat object of scalars. Evidence adds its own fields
# beside them, so an evidence object is an event object plus `id`, `signature`, `category`,
# `severity`, `captures`, `summary`, `action`. `id` is the stable event id that receivers
# deduplicate by. Unknown fields are refused: a misspelt field must not vanish silently.

EVENT_KINDS = ("line", "metric", "state", "signal")
_EVENT_STR_FIELDS = ("host", "job", "tenant")
_EVENT_INT_FIELDS = ("ts_ns", "rank", "pid")
_EVENT_FIELDS = frozenset(
    ("body", "source", "kind", "attrs", "seq", *_EVENT_STR_FIELDS, *_EVENT_INT_FIELDS)
)
_EVIDENCE_STR_FIELDS = ("signature", "category", "summary", "action")
_EVIDENCE_FIELDS = frozenset(("id", "severity", "captures", *_EVIDENCE_STR_FIELDS))


def event_to_dict(event: Event) -> dict[str, Any]:
    """The flat JSON form of `event`; None fields, `seq` 0 and empty `attrs` are left out."""
    data: dict[str, Any] = {"body": event.body, "source": event.source, "kind": event.kind}
    for name in (*_EVENT_INT_FIELDS, *_EVENT_STR_FIELDS):
        value = getattr(event, name)
        if value is not None:
            data[name] = value
    if event.seq:
        data["seq"] = event.seq
    if event.attrs:
        data["attrs"] = dict(event.attrs)
    return data


def event_from_dict(data: Any) -> Event:
    """The Event a JSON object describes; raises WireError naming the first bad field."""
    if not isinstance(data, dict):
        raise WireError("an event is a JSON object")
    unknown = sorted(set(data) - _EVENT_FIELDS)
    if unknown:
        raise WireError(f"unknown event field(s): {', '.join(unknown)}")
    return _event_fields(data)


def evidence_to_dict(evidence: Evidence) -> dict[str, Any]:
    """The flat JSON form of `evidence`: its event's fields plus the evidence's own."""
    data = event_to_dict(evidence.event)
    data["id"] = evidence.id
    data["signature"] = evidence.signature
    data["category"] = evidence.category
    data["severity"] = evidence.severity
    if evidence.captures:
        data["captures"] = dict(evidence.captures)
    if evidence.summary:
        data["summary"] = evidence.summary
    if evidence.action != "none":
        data["action"] = evidence.action
    return data


def evidence_from_dict(data: Any) -> Evidence:
    """The Evidence a JSON object describes; raises WireError naming the first bad field."""
    if not isinstance(data, dict):
        raise WireError("an evidence record is a JSON object")
    unknown = sorted(set(data) - _EVENT_FIELDS - _EVIDENCE_FIELDS)
    if unknown:
        raise WireError(f"unknown evidence field(s): {', '.join(unknown)}")
    evidence_id = data.get("id")
    if not isinstance(evidence_id, str) or not evidence_id:
        raise WireError("evidence needs a non-empty string 'id' (the stable event id)")
    severity = data.get("severity")
    if severity not in SEVERITIES:
        raise WireError(f"evidence field 'severity' must be one of {', '.join(SEVERITIES)}")
    for name in ("signature", "category"):
        if not isinstance(data.get(name), str):
            raise WireError(f"evidence needs a string {name!r}")
    for name in ("summary", "action"):
        if name in data and not isinstance(data[name], str):
            raise WireError(f"evidence field {name!r} must be a string")
    captures = data.get("captures", {})
    if not isinstance(captures, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in captures.items()
    ):
        raise WireError("evidence field 'captures' must be an object of strings")
    event = _event_fields({k: v for k, v in data.items() if k in _EVENT_FIELDS})
    return Evidence(
        id=evidence_id,
        event=event,
        signature=data["signature"],
        category=data["category"],
        severity=severity,
        captures=dict(captures),
        summary=data.get("summary", ""),
        action=data.get("action", "none"),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _event_fields(data: dict[str, Any]) -> Event:
    body = data.get("body")
    if not isinstance(body, str):
        raise WireError("event needs a string 'body'")
    source = data.get("source", "log")
    if not isinstance(source, str) or not source:
        raise WireError("event field 'source' must be a non-empty string")
    kind = data.get("kind", "line")
    if kind not in EVENT_KINDS:
        raise WireError(f"event field 'kind' must be one of {', '.join(EVENT_KINDS)}")
    for name in _EVENT_INT_FIELDS:
        value = data.get(name)
        if value is not None and not _is_int(value):
            raise WireError(f"event field {name!r} must be an integer")
    for name in _EVENT_STR_FIELDS:
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise WireError(f"event field {name!r} must be a string")
    seq = data.get("seq", 0)
    if not _is_int(seq):
        raise WireError("event field 'seq' must be an integer")
    attrs = data.get("attrs", {})
    if not isinstance(attrs, dict):
        raise WireError("event field 'attrs' must be a flat object")
    for key, value in attrs.items():
        if not isinstance(key, str) or not _is_scalar(value):
            raise WireError(f"event attribute {key!r} must be a scalar under a string key")
    return Event(
        body=body,
        ts_ns=data.get("ts_ns"),
        host=data.get("host"),
        source=source,
        kind=kind,
        rank=data.get("rank"),
        pid=data.get("pid"),
        job=data.get("job"),
        tenant=data.get("tenant"),
        attrs=dict(attrs),
        seq=seq,
    )
