"""Pure-Python twin of `denpex._native.otlp_logs` (the test oracle and the fallback): an
OTLP ExportLogsServiceRequest (protobuf bytes) → plain Python values, through the
opentelemetry-proto classes.

`decode_logs_request(data)` returns one `(resource attributes, records)` pair per
ResourceLogs, the records of all its ScopeLogs in order, each
`(time_unix_nano, severity_number, severity_text, body, attributes)`; attribute and body
values are str, bool, int, float, bytes (as hex) or None, arrays and maps as OTLP JSON
text. Bad bytes raise ValueError. `walk(request)` does the same for a parsed message (the
JSON path). It never does I/O.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError

_SIMPLE = frozenset(("string_value", "bool_value", "int_value", "double_value"))
Record = tuple[int, int, str, Any, dict[str, Any]]


def scalar(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which in _SIMPLE:
        return getattr(value, which)
    if which == "bytes_value":
        return value.bytes_value.hex()
    return json_format.MessageToJson(value, indent=None)  # arrays and maps: JSON text


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        value = kv.value
        which = value.WhichOneof("value")
        out[kv.key] = getattr(value, which) if which in _SIMPLE else scalar(value)
    return out


def walk(request: Any) -> list[tuple[dict[str, Any], list[Record]]]:
    out = []
    for resource_logs in request.resource_logs:
        records: list[Record] = []
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                records.append(
                    (
                        record.time_unix_nano,
                        int(record.severity_number),
                        record.severity_text,
                        scalar(record.body),
                        attributes(record.attributes),
                    )
                )
        out.append((attributes(resource_logs.resource.attributes), records))
    return out


def decode_logs_request(data: bytes) -> list[tuple[dict[str, Any], list[Record]]]:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    request = ExportLogsServiceRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"not an OTLP ExportLogsServiceRequest: {exc}") from None
    return walk(request)
