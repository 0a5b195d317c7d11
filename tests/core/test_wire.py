"""The flat JSON form of Event and Evidence: round trips, stability, and WireError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from denpex.core import jsonio
from denpex.core.events import SEVERITIES, Event, Evidence, metric
from denpex.core.wire import (
    EVENT_KINDS,
    WireError,
    event_from_dict,
    event_to_dict,
    evidence_from_dict,
    evidence_to_dict,
)

text = st.text(max_size=20)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    text,
    st.floats(allow_nan=False, allow_infinity=False),
)
events = st.builds(
    Event,
    body=text,
    ts_ns=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
    host=st.one_of(st.none(), text),
    source=st.sampled_from(["log", "kmsg", "ebpf.oom", "nvml"]),
    kind=st.sampled_from(EVENT_KINDS),
    rank=st.one_of(st.none(), st.integers(0, 4096)),
    pid=st.one_of(st.none(), st.integers(1, 2**22)),
    job=st.one_of(st.none(), text),
    tenant=st.one_of(st.none(), text),
    attrs=st.dictionaries(text, scalar, max_size=5),
    seq=st.integers(0, 10**6),
)
evidences = st.builds(
    Evidence,
    id=st.text(min_size=1, max_size=20),
    event=events,
    signature=text,
    category=text,
    severity=st.sampled_from(SEVERITIES),
    captures=st.dictionaries(text, text, max_size=3),
    summary=text,
    action=st.sampled_from(["none", "restart", "drain"]),
)


@given(events)
def test_event_round_trips_through_json(event: Event) -> None:
    assert event_from_dict(jsonio.loads(jsonio.dumps(event_to_dict(event)))) == event


@given(evidences)
def test_evidence_round_trips_through_json(evidence: Evidence) -> None:
    assert evidence_from_dict(jsonio.loads(jsonio.dumps(evidence_to_dict(evidence)))) == evidence


def test_the_form_is_flat_and_stable() -> None:
    event = Event(body="Xid 79", ts_ns=5, host="n1", source="kmsg", rank=0, attrs={"xid": 79})
    evidence = Evidence("e1", event, "nvidia.xid79", "gpu.fell_off_bus", "critical")
    assert evidence_to_dict(evidence) == {
        "id": "e1",
        "body": "Xid 79",
        "ts_ns": 5,
        "host": "n1",
        "source": "kmsg",
        "kind": "line",
        "rank": 0,
        "attrs": {"xid": 79},
        "signature": "nvidia.xid79",
        "category": "gpu.fell_off_bus",
        "severity": "critical",
    }
    m = metric("psi_some_avg10_ratio", 0.5, source="psi", labels={"resource": "cpu"})
    assert event_from_dict(event_to_dict(m)) == m


GOOD = {"id": "e1", "body": "b", "signature": "s", "category": "c", "severity": "error"}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"id": ""}, "'id'"),
        ({"severity": "fatal"}, "severity"),
        ({"signature": 3}, "signature"),
        ({"body": None}, "body"),
        ({"kind": "trace"}, "kind"),
        ({"ts_ns": "5"}, "ts_ns"),
        ({"rank": True}, "rank"),
        ({"host": 1}, "host"),
        ({"attrs": {"a": [1]}}, "attribute 'a'"),
        ({"attrs": [1]}, "attrs"),
        ({"captures": {"a": 1}}, "captures"),
        ({"extra": 1}, "unknown evidence field"),
        ({"summary": 1}, "summary"),
    ],
)
def test_bad_evidence_raises_wire_error(change: dict, message: str) -> None:
    with pytest.raises(WireError, match=message):
        evidence_from_dict({**GOOD, **change})


def test_non_finite_floats_travel_as_null() -> None:
    # JSON has no infinity: orjson writes null, which reads back as a missing value.
    data = jsonio.loads(jsonio.dumps(event_to_dict(Event(body="b", attrs={"v": float("inf")}))))
    assert event_from_dict(data).attrs == {"v": None}


def test_bad_event_raises_wire_error() -> None:
    with pytest.raises(WireError, match="JSON object"):
        event_from_dict([1])
    with pytest.raises(WireError, match="unknown event field"):
        event_from_dict({"body": "b", "id": "x"})
    with pytest.raises(WireError, match="JSON object"):
        evidence_from_dict("x")
    assert evidence_from_dict(GOOD).event.source == "log"
