"""The OTLP log reader: the compiled wire reader and its protobuf-based twin agree on every
request (hypothesis), refuse the same bad bytes, and the compiled one hands array and map
values back to the twin (NotImplementedError)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from denpex._native import otlp_logs_ref
from tests.native.native_support import native_module

TEXT = st.text(max_size=12)
SCALARS = st.one_of(
    st.none(),
    TEXT,
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.binary(max_size=6),
)


def any_value(value) -> AnyValue:
    if value is None:
        return AnyValue()
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    return AnyValue(string_value=value)


ATTRS = st.lists(st.tuples(TEXT, SCALARS), max_size=5)
RECORD = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 24), TEXT, SCALARS, ATTRS)
REQUEST = st.lists(st.tuples(ATTRS, st.lists(st.lists(RECORD, max_size=3), max_size=2)), max_size=3)


def build(spec) -> bytes:
    request = ExportLogsServiceRequest()
    for resource_attrs, scopes in spec:
        resource_logs = request.resource_logs.add()
        resource_logs.resource.attributes.extend(
            KeyValue(key=k, value=any_value(v)) for k, v in resource_attrs
        )
        for records in scopes:
            scope = resource_logs.scope_logs.add()
            scope.scope.name = "denpex"
            for time_ns, severity, text, body, attrs in records:
                record = scope.log_records.add()
                record.time_unix_nano = time_ns
                record.observed_time_unix_nano = 7
                record.severity_number = severity  # type: ignore[assignment]
                record.severity_text = text
                record.body.CopyFrom(any_value(body))
                record.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in attrs)
                record.trace_id = b"\x01" * 16
    return request.SerializeToString()


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict | list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(
                same(x, y)
                for x, y in (
                    zip(a.items(), b.items(), strict=True)
                    if isinstance(a, dict)
                    else zip(a, b, strict=True)
                )
            )
        )
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(REQUEST)
def test_native_agrees_with_the_reference(spec):
    wire = native_module("otlp_logs")
    data = build(spec)
    assert same(wire.decode_logs_request(data), otlp_logs_ref.decode_logs_request(data))


@settings(max_examples=300, deadline=None)
@given(REQUEST, st.data())
def test_corrupt_bytes(spec, data):
    """A truncated body is refused by both; after a flipped bit or trailing garbage, what the
    compiled reader returns is what the twin returns (it may refuse more, or hand the request
    over as it does arrays and maps: the caller then asks the twin; it may accept corruption
    inside a field it never reads, as protobuf does for unknown fields)."""
    wire = native_module("otlp_logs")
    body = bytearray(build(spec) or b"\x0a\x00")
    how = data.draw(st.sampled_from(["truncate", "flip", "append"]))
    if how == "truncate":
        body = body[: data.draw(st.integers(0, max(0, len(body) - 1)))]
    elif how == "flip":
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] ^= 1 << data.draw(st.integers(0, 7))
    else:
        body += data.draw(st.binary(min_size=1, max_size=4))
    try:
        expected = otlp_logs_ref.decode_logs_request(bytes(body))
    except ValueError:
        expected = None
    try:
        got = wire.decode_logs_request(bytes(body))
    except (ValueError, NotImplementedError):  # a flipped tag can make an array or a map
        got = None
    if how == "truncate":
        assert (got is None) == (expected is None)
    if got is not None and expected is not None:
        assert same(got, expected)


def test_arrays_and_maps_go_to_the_reference():
    wire = native_module("otlp_logs")
    request = ExportLogsServiceRequest()
    record = request.resource_logs.add().scope_logs.add().log_records.add()
    value = AnyValue()
    value.array_value.values.add().string_value = "a"
    record.attributes.add(key="list", value=value)
    data = request.SerializeToString()
    with pytest.raises(NotImplementedError):
        wire.decode_logs_request(data)
    ((_, [(_, _, _, _, attrs)]),) = otlp_logs_ref.decode_logs_request(data)
    assert attrs == {"list": '{"arrayValue": {"values": [{"stringValue": "a"}]}}'}
