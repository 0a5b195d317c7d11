"""The SDK wire format: versioned JSON lines, the stderr form, and a decoder that skips and
counts what it cannot read instead of failing the stream."""

from __future__ import annotations

import orjson
import pytest

from denpex.core.events import Event, Evidence, metric
from denpex.core.sdk_wire import (
    MAX_LINE_BYTES,
    STDERR_PREFIX,
    WIRE_VERSION,
    LineDecoder,
    SdkWireError,
    decode_message,
    encode_message,
    stderr_line,
    stderr_payload,
)
from denpex.core.wire import WireError


def sdc(summary: str = "rank 2's copy of fc.weight differs") -> Evidence:
    event = Event(
        body="replica mismatch",
        ts_ns=1_796_000_000_000_000_000,
        host="node7",
        source="sdk",
        kind="state",
        rank=2,
        pid=4242,
        attrs={"step": 120, "param": "fc.weight", "exact": True},
    )
    return Evidence(
        id="sdk-abc",
        event=event,
        signature="train.sdc.replica_mismatch",
        category="train.sdc",
        severity="error",
        captures={"rank": "2", "param": "fc.weight"},
        summary=summary,
        action="drain_node",
    )


def test_evidence_round_trip() -> None:
    line = encode_message(sdc())
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    data = orjson.loads(line)
    assert data["v"] == WIRE_VERSION and data["type"] == "evidence"
    assert decode_message(line) == sdc()


def test_event_and_metric_round_trip() -> None:
    event = metric("sdk_dropped_messages", 7, source="sdk", counter=True, rank=1, pid=3)
    decoded = decode_message(encode_message(event))
    assert isinstance(decoded, Event) and not isinstance(decoded, Evidence)
    assert decoded == event
    assert orjson.loads(encode_message(event))["type"] == "event"


def test_unknown_version_is_refused_with_a_clear_error() -> None:
    data = orjson.loads(encode_message(sdc()))
    data["v"] = 99
    with pytest.raises(SdkWireError, match=r"version 99 is not supported.*same denpex version"):
        decode_message(orjson.dumps(data))
    del data["v"]
    with pytest.raises(SdkWireError, match="version None"):
        decode_message(orjson.dumps(data))


def test_bad_type_and_bad_fields_are_wire_errors() -> None:
    data = orjson.loads(encode_message(sdc()))
    with pytest.raises(SdkWireError, match="'type'"):
        decode_message(orjson.dumps({**data, "type": "command"}))
    with pytest.raises(WireError, match="severity"):
        decode_message(orjson.dumps({**data, "severity": "fatal"}))
    with pytest.raises(SdkWireError, match="not JSON"):
        decode_message(b"{nope")
    with pytest.raises(SdkWireError):
        encode_message("not an event")  # type: ignore[arg-type]


def test_stderr_form_is_one_prefixed_line_found_behind_a_rank_prefix() -> None:
    line = stderr_line(sdc())
    assert line.startswith(STDERR_PREFIX) and line.count(b"\n") == 1
    payload = stderr_payload(b"[rank3]:" + line.rstrip(b"\n"))
    assert payload is not None and decode_message(payload) == sdc()
    assert stderr_payload(b"denpex-sdk: is mentioned in prose") is None
    assert stderr_payload(b"an ordinary line") is None


def test_decoder_skips_and_counts_garbage_across_chunk_boundaries() -> None:
    good = encode_message(sdc())
    stream = b"garbage\n" + good + b'{"v": 1}\n\n' + b"[1, 2]\n" + good
    decoder = LineDecoder()
    got = []
    for at in range(0, len(stream), 7):  # split mid-line everywhere
        got += decoder.feed(stream[at : at + 7])
    got += decoder.finish()
    assert got == [sdc(), sdc()]
    assert decoder.stats.messages == 2
    assert decoder.stats.garbage_lines == 3
    assert decoder.stats.last_error


def test_huge_lines_are_capped_and_the_stream_goes_on() -> None:
    decoder = LineDecoder()
    huge = b"x" * (3 * MAX_LINE_BYTES)
    good = encode_message(sdc())
    got = decoder.feed(huge[: MAX_LINE_BYTES // 2])
    got += decoder.feed(huge[MAX_LINE_BYTES // 2 :] + b"\n" + good)
    assert got == [sdc()]
    assert decoder.stats.oversized_lines == 1
    with pytest.raises(SdkWireError, match="exceeds"):
        decode_message(b"{" + b" " * MAX_LINE_BYTES + b"}")


def test_encoder_shrinks_a_message_that_would_exceed_the_cap() -> None:
    line = encode_message(sdc(summary="s" * (2 * MAX_LINE_BYTES)))
    assert len(line) <= MAX_LINE_BYTES
    decoded = decode_message(line)
    assert isinstance(decoded, Evidence)
    assert decoded.event.attrs["truncated"] is True
    assert decoded.summary.startswith("sss") and len(decoded.summary) < MAX_LINE_BYTES
