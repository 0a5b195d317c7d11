"""OTLP/HTTP for the node agent: pure encoders from Evidence/Event to OTLP log and metric
requests (protobuf or OTLP JSON), and an exporter that POSTs them to any OTLP endpoint.

Encoders never do I/O; the exporter never retries by itself, never follows a redirect (a 3xx
is a failed delivery, not a success) and never raises for a failed export: it says what the
status means (retry later, split the batch, or refused for good) and the caller decides.

Metric names and descriptions follow denpex.agent.metric_names, the rule /metrics uses
(`denpex_psi_some_avg10_ratio`, counters ending in `_total`), so that a series scraped from
/metrics and the same series received over OTLP have one name and one description.
"""

from __future__ import annotations

import email.utils
import gzip
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1 import metrics_pb2

from denpex.agent.metric_names import help_text, series_name
from denpex.core.events import METRIC_RESERVED, Event, Evidence

SCOPE_NAME = "denpex"
# Evidence.severity → (SeverityNumber, SeverityText), per the OTLP log data model.
SEVERITY = {"info": (9, "INFO"), "warning": (13, "WARN"), "error": (17, "ERROR")}
SEVERITY["critical"] = (21, "FATAL")
PROTOCOLS = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}
Outcome = Literal["success", "retryable", "too_large", "permanent"]


def outcome_of(status: int) -> Outcome:
    """What an HTTP status means for a batch: 2xx delivered; 408, 429 and 5xx later again
    (with backoff, after any Retry-After); 413 smaller; a 3xx is a misconfigured endpoint,
    retried like an outage (the batch stays); any other 4xx will refuse the same bytes
    again (400, 401, 403, 404, 422: the dead-letter segment)."""
    if 200 <= status < 300:
        return "success"
    if status in (408, 429) or status >= 500 or 300 <= status < 400:
        return "retryable"
    if status == 413:
        return "too_large"
    return "permanent"


_Resource = tuple[str | None, str | None, str | None]  # host, job, tenant


# --- encoders ------------------------------------------------------------------------------


def _any_value(value: Any) -> AnyValue | None:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    return None  # None (and anything not a scalar) has no attribute value


def attributes(mapping: Mapping[str, Any]) -> list[KeyValue]:
    """OTLP attributes for a flat mapping; None values are left out."""
    out = []
    for key, value in mapping.items():
        any_value = _any_value(value)
        if any_value is not None:
            out.append(KeyValue(key=key, value=any_value))
    return out


def _resource_attributes(resource: _Resource) -> list[KeyValue]:
    host, job, tenant = resource
    return attributes(
        {"service.name": "denpex", "host.name": host, "denpex.job": job, "denpex.tenant": tenant}
    )


def log_record(item: Evidence | Event, *, observed_ns: int) -> LogRecord:
    """One LogRecord for evidence or for an event of kind line/state/signal."""
    event = item.event if isinstance(item, Evidence) else item
    attrs: dict[str, Any] = dict(event.attrs)
    attrs.update(
        {
            "denpex.source": event.source,
            "denpex.kind": event.kind,
            "denpex.rank": event.rank,
            "process.pid": event.pid,
        }
    )
    severity_number, severity_text = 0, ""
    if isinstance(item, Evidence):
        severity_number, severity_text = SEVERITY.get(item.severity, SEVERITY["info"])
        attrs.update(
            {
                "denpex.event_id": item.id,
                "denpex.signature": item.signature,
                "denpex.category": item.category,
                "denpex.action": item.action,
                "denpex.summary": item.summary or None,
            }
        )
        attrs.update({f"denpex.capture.{k}": v for k, v in item.captures.items()})
    return LogRecord(
        time_unix_nano=event.ts_ns or 0,
        observed_time_unix_nano=observed_ns,
        severity_number=severity_number,  # type: ignore[arg-type]
        severity_text=severity_text,
        body=AnyValue(string_value=event.body),
        attributes=attributes(attrs),
    )


def encode_logs(
    items: Iterable[Evidence | Event], *, observed_ns: int | None = None
) -> ExportLogsServiceRequest:
    """Evidence and non-metric events → one request, LogRecords grouped by resource."""
    observed = observed_ns if observed_ns is not None else time.time_ns()
    groups: dict[_Resource, list[LogRecord]] = {}
    for item in items:
        event = item.event if isinstance(item, Evidence) else item
        key = (event.host, event.job, event.tenant)
        groups.setdefault(key, []).append(log_record(item, observed_ns=observed))
    request = ExportLogsServiceRequest()
    for resource, records in groups.items():
        resource_logs = request.resource_logs.add()
        resource_logs.resource.attributes.extend(_resource_attributes(resource))
        scope_logs = resource_logs.scope_logs.add()
        scope_logs.scope.name = SCOPE_NAME
        scope_logs.log_records.extend(records)
    return request


def encode_metrics(
    events: Iterable[Event],
    *,
    now_ns: int | None = None,
    start_ns: int = 0,
    helps: Mapping[str, str] | None = None,
) -> ExportMetricsServiceRequest:
    """Metric events (from denpex.core.events.metric) → one request: gauges as Gauge, counters
    as monotonic cumulative Sum starting at `start_ns`; labels become point attributes; the
    collectors' HELP texts (`helps`, by event name) become descriptions."""
    now = now_ns if now_ns is not None else time.time_ns()
    groups: dict[_Resource, dict[tuple[str, str], metrics_pb2.Metric]] = {}
    for event in events:
        if event.kind != "metric":
            raise ValueError(f"event {event.body!r} is of kind {event.kind!r}, not 'metric'")
        counter = event.attrs.get("type") == "counter"
        kind = "counter" if counter else "gauge"
        name = series_name(event.body, counter=counter)
        by_name = groups.setdefault((event.host, event.job, event.tenant), {})
        metric = by_name.get((name, kind))
        if metric is None:
            description = help_text(event.body, event.source, helps or {})
            metric = by_name[(name, kind)] = metrics_pb2.Metric(name=name, description=description)
            if kind == "counter":
                metric.sum.is_monotonic = True
                metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        points = metric.sum.data_points if kind == "counter" else metric.gauge.data_points
        point = points.add()
        point.as_double = float(event.attrs.get("value", 0.0))
        point.time_unix_nano = event.ts_ns or now
        if kind == "counter":
            point.start_time_unix_nano = start_ns
        labels = {k: v for k, v in event.attrs.items() if k not in METRIC_RESERVED}
        point.attributes.extend(attributes(labels))
    request = ExportMetricsServiceRequest()
    for resource, by_name in groups.items():
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.attributes.extend(_resource_attributes(resource))
        scope_metrics = resource_metrics.scope_metrics.add()
        scope_metrics.scope.name = SCOPE_NAME
        scope_metrics.metrics.extend(by_name.values())
    return request


def serialise(request: Message, protocol: str) -> bytes:
    """Bytes for the wire: protobuf, or OTLP JSON (lowerCamelCase, enums as integers)."""
    if protocol == "http/protobuf":
        return request.SerializeToString()
    if protocol == "http/json":
        text = json_format.MessageToJson(request, use_integers_for_enums=True, indent=None)
        return text.encode()
    raise ValueError(f"OTLP protocol must be one of {', '.join(PROTOCOLS)}")


def parse(data: bytes, message: Message, content_type: str) -> Message:
    """Fill `message` from a protobuf or OTLP JSON body (the receiving side's decoder)."""
    if content_type.split(";")[0].strip() == "application/json":
        return json_format.Parse(data, message, ignore_unknown_fields=True)
    message.ParseFromString(data)
    return message


# --- exporter ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What one POST achieved. `rejected` counts records a partial success refused."""

    outcome: Outcome
    status: int | None = None
    retry_after_s: float | None = None
    rejected: int = 0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


class OtlpHttpExporter:
    """POSTs requests to <endpoint>/v1/logs and <endpoint>/v1/metrics (urllib, no session)."""

    def __init__(
        self,
        endpoint: str,
        *,
        protocol: str = "http/protobuf",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        compression: str | None = None,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"OTLP protocol must be one of {', '.join(PROTOCOLS)}")
        if compression not in (None, "gzip"):
            raise ValueError("OTLP compression must be 'gzip' or none")
        self.endpoint = endpoint.rstrip("/")
        self.protocol = protocol
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.compression = compression
        self._opener = urllib.request.build_opener(_RefuseRedirects)

    def export_logs(
        self, request: ExportLogsServiceRequest, *, timeout_s: float | None = None
    ) -> ExportResult:
        return self._post("/v1/logs", request, ExportLogsServiceResponse(), timeout_s)

    def export_metrics(
        self, request: ExportMetricsServiceRequest, *, timeout_s: float | None = None
    ) -> ExportResult:
        return self._post("/v1/metrics", request, ExportMetricsServiceResponse(), timeout_s)

    def _post(
        self, path: str, request: Message, response: Message, timeout_s: float | None
    ) -> ExportResult:
        body = serialise(request, self.protocol)
        headers = {"Content-Type": PROTOCOLS[self.protocol], **self.headers}
        if self.compression == "gzip":
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
        req = urllib.request.Request(self.endpoint + path, body, headers, method="POST")
        timeout = self.timeout_s if timeout_s is None else max(0.05, timeout_s)
        try:
            with self._opener.open(req, timeout=timeout) as reply:
                data = reply.read()
                status, content_type = reply.status, reply.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            detail = _safe_read(err)[:200].decode(errors="replace")
            retry_after = parse_retry_after(err.headers.get("Retry-After"))
            message = f"HTTP {err.code}: {detail}"
            if 300 <= err.code < 400:
                where = err.headers.get("Location") or "elsewhere"
                message = f"HTTP {err.code}: redirected to {where}, not followed: fix the endpoint"
            return ExportResult(outcome_of(err.code), err.code, retry_after, 0, message)
        except (urllib.error.URLError, OSError, ValueError) as err:
            return ExportResult("retryable", None, None, 0, f"{path}: {err}")
        return ExportResult("success", status, None, _rejected(data, response, content_type))


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is never followed: urllib would re-send a POST as a GET without its body
    and report the redirect target's 200 as a delivery."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


def _safe_read(err: urllib.error.HTTPError) -> bytes:
    try:
        return err.read() or b""
    except OSError:
        return b""


def _rejected(data: bytes, response: Message, content_type: str) -> int:
    """Records a partial-success response refused (0 when the body is empty or unreadable)."""
    if not data:
        return 0
    try:
        parse(data, response, content_type or "application/x-protobuf")
    except (DecodeError, json_format.ParseError, ValueError):
        return 0
    partial = response.partial_success  # type: ignore[attr-defined]
    if isinstance(response, ExportLogsServiceResponse):
        return int(partial.rejected_log_records)
    return int(partial.rejected_data_points)
