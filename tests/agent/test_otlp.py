"""OTLP encoders round-trip through opentelemetry-proto (protobuf and JSON); the exporter
against a real receiver on loopback: success, partial success, retryable, permanent."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2

from denpex.agent.otlp import (
    OtlpHttpExporter,
    encode_logs,
    encode_metrics,
    parse_retry_after,
    serialise,
)
from denpex.core.events import Event, Evidence, metric
from tests.agent.otlp_receiver import OtlpReceiver, any_value


def evidence(i: int, *, host: str = "node-1", severity: str = "error") -> Evidence:
    event = Event(
        body=f"line {i}",
        ts_ns=1_700_000_000_000_000_000 + i,
        host=host,
        job="j1",
        tenant="t1",
        rank=2,
        pid=99,
        source="log",
        attrs={"line_no": i, "ok": True, "x": 0.5},
    )
    return Evidence(
        f"ev-{i}",
        event,
        "nccl.timeout",
        "comm.nccl",
        severity,
        captures={"peer": "3"},
        summary="NCCL timed out",
        action="restart",
    )


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.stop()


def attrs_of(record) -> dict:
    return {kv.key: any_value(kv.value) for kv in record.attributes}


def test_log_record_fields_and_resource_grouping() -> None:
    items = [evidence(1), evidence(2, host="node-2", severity="critical"), evidence(3)]
    items.append(Event(body="state change", kind="state", host="node-1", job="j1", tenant="t1"))
    request = encode_logs(items, observed_ns=42)
    assert len(request.resource_logs) == 2
    first = request.resource_logs[0]
    resource = {kv.key: any_value(kv.value) for kv in first.resource.attributes}
    assert resource == {
        "service.name": "denpex",
        "host.name": "node-1",
        "denpex.job": "j1",
        "denpex.tenant": "t1",
    }
    assert first.scope_logs[0].scope.name == "denpex"
    records = first.scope_logs[0].log_records
    assert len(records) == 3
    one = records[0]
    assert (one.time_unix_nano, one.observed_time_unix_nano) == (1_700_000_000_000_000_001, 42)
    assert (one.severity_number, one.severity_text, one.body.string_value) == (
        17,
        "ERROR",
        "line 1",
    )
    assert attrs_of(one) == {
        "line_no": 1,
        "ok": True,
        "x": 0.5,
        "denpex.source": "log",
        "denpex.kind": "line",
        "denpex.rank": 2,
        "process.pid": 99,
        "denpex.event_id": "ev-1",
        "denpex.signature": "nccl.timeout",
        "denpex.category": "comm.nccl",
        "denpex.action": "restart",
        "denpex.summary": "NCCL timed out",
        "denpex.capture.peer": "3",
    }
    assert request.resource_logs[1].scope_logs[0].log_records[0].severity_number == 21
    assert records[2].severity_number == 0 and "denpex.event_id" not in attrs_of(records[2])


@pytest.mark.parametrize(
    "severity,number,text",
    [
        ("info", 9, "INFO"),
        ("warning", 13, "WARN"),
        ("error", 17, "ERROR"),
        ("critical", 21, "FATAL"),
    ],
)
def test_severity_mapping(severity: str, number: int, text: str) -> None:
    record = encode_logs([evidence(0, severity=severity)]).resource_logs[0].scope_logs[0]
    assert (record.log_records[0].severity_number, record.log_records[0].severity_text) == (
        number,
        text,
    )


def test_logs_round_trip_protobuf_and_json() -> None:
    request = encode_logs([evidence(i) for i in range(5)], observed_ns=7)
    decoded = ExportLogsServiceRequest.FromString(serialise(request, "http/protobuf"))
    assert decoded == request
    text = serialise(request, "http/json")
    assert json_format.Parse(text, ExportLogsServiceRequest()) == request
    doc = json.loads(text)
    record = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert record["severityNumber"] == 17  # enums as integers (OTLP JSON)
    assert record["timeUnixNano"] == "1700000000000000000"  # 64-bit integers as strings
    assert "observedTimeUnixNano" in record


def test_metrics_gauge_and_counter_round_trip() -> None:
    events = [
        metric("psi_some_avg10_ratio", 0.25, source="psi", labels={"resource": "cpu"}, host="h"),
        metric("psi_some_avg10_ratio", 0.5, source="psi", labels={"resource": "io"}, host="h"),
        metric("xid_errors_total", 3, source="nvml", counter=True, labels={"gpu": "0"}, host="h"),
    ]
    request = encode_metrics(events, now_ns=1000, start_ns=10)
    metrics = {m.name: m for m in request.resource_metrics[0].scope_metrics[0].metrics}
    gauge = metrics["denpex_psi_some_avg10_ratio"]
    assert gauge.WhichOneof("data") == "gauge"
    assert [p.as_double for p in gauge.gauge.data_points] == [0.25, 0.5]
    assert attrs_of(gauge.gauge.data_points[1]) == {"resource": "io"}
    total = metrics["denpex_xid_errors_total"].sum
    assert total.is_monotonic
    assert total.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    point = total.data_points[0]
    assert (point.as_double, point.start_time_unix_nano, point.time_unix_nano) == (3.0, 10, 1000)
    assert ExportMetricsServiceRequest.FromString(serialise(request, "http/protobuf")) == request
    text = serialise(request, "http/json")
    assert json_format.Parse(text, ExportMetricsServiceRequest()) == request
    assert (
        json.loads(text)["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][1]["sum"][
            "aggregationTemporality"
        ]
        == 2
    )
    with pytest.raises(ValueError, match="not 'metric'"):
        encode_metrics([Event(body="x")])


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_exporter_delivers_to_a_real_receiver(receiver, protocol, compression) -> None:
    exporter = OtlpHttpExporter(receiver.url, protocol=protocol, compression=compression)
    result = exporter.export_logs(encode_logs([evidence(i) for i in range(3)]))
    assert result.ok and result.status == 200 and result.rejected == 0
    assert receiver.ids() == {"ev-0", "ev-1", "ev-2"}
    got = receiver.records["ev-1"]
    assert got["resource"]["host.name"] == "node-1" and got["severity_number"] == 17
    result = exporter.export_metrics(encode_metrics([metric("up", 1, source="agent")]))
    assert result.ok and len(receiver.metric_requests) == 1
    assert receiver.content_types[-1] == (
        "application/json" if protocol == "http/json" else "application/x-protobuf"
    )


def test_exporter_partial_success_is_counted(receiver) -> None:
    receiver.partial_reject = 2
    result = OtlpHttpExporter(receiver.url).export_logs(encode_logs([evidence(1)]))
    assert result.ok and result.rejected == 2
    result = OtlpHttpExporter(receiver.url).export_metrics(
        encode_metrics([metric("up", 1, source="agent")])
    )
    assert result.ok and result.rejected == 2


@pytest.mark.parametrize(
    "status,outcome",
    [
        (503, "retryable"),
        (429, "retryable"),
        (502, "retryable"),
        (504, "retryable"),
        (500, "retryable"),
        (408, "retryable"),
        (302, "retryable"),  # a redirect is a failed delivery, never followed
        (413, "too_large"),
        (400, "permanent"),
        (401, "permanent"),
        (403, "permanent"),
        (404, "permanent"),
        (422, "permanent"),
    ],
)
def test_exporter_classifies_failures(receiver, status, outcome) -> None:
    receiver.status = status
    receiver.retry_after = "7"
    result = OtlpHttpExporter(receiver.url).export_logs(encode_logs([evidence(1)]))
    assert (result.outcome, result.status, result.retry_after_s) == (outcome, status, 7.0)
    assert not receiver.ids()


def test_exporter_connection_refused_is_retryable() -> None:
    receiver = OtlpReceiver().start()
    url = receiver.url
    receiver.stop()
    result = OtlpHttpExporter(url, timeout_s=2).export_logs(encode_logs([evidence(1)]))
    assert result.outcome == "retryable" and result.status is None and result.message


def test_retry_after_forms() -> None:
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    when = "Wed, 21 Oct 2015 07:28:30 GMT"
    assert parse_retry_after(when, now=1445412480.0) == 30.0
    assert parse_retry_after(when, now=1445412600.0) == 0.0


def test_exporter_refuses_unknown_options() -> None:
    with pytest.raises(ValueError, match="protocol"):
        OtlpHttpExporter("http://127.0.0.1:1", protocol="grpc")
    with pytest.raises(ValueError, match="compression"):
        OtlpHttpExporter("http://127.0.0.1:1", compression="zstd")
