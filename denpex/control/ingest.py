"""Ingest decoding: OTLP/HTTP log and metric requests (protobuf or OTLP JSON, what
denpex.agent.otlp encodes) and `POST /api/v1/reports` bodies → rows for the store.

Pure functions: no I/O, no clock (callers pass `received_ns`). A payload that cannot be
stored whole raises IngestError with the HTTP status to answer (400, 403, 413, 415) and a
message naming what was wrong; the tenant always comes from the caller's Principal, never
from the payload.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from denpex import _native
from denpex._native import otlp_logs_ref as _otlp_ref
from denpex.control.timefmt import parse_iso_ns
from denpex.core import jsonio
from denpex.core.diagnosis import SCHEMA_ID
from denpex.core.events import SEVERITIES

MAX_BODY_BYTES = 16 * 1024 * 1024  # after decompression
MAX_ID_CHARS = 256
CONTENT_TYPES = {"application/x-protobuf": "protobuf", "application/json": "json"}
# OTLP SeverityNumber ranges → denpex severities (FATAL 21-24, ERROR 17-20, WARN 13-16).
_SEVERITY_FLOOR = ((21, "critical"), (17, "error"), (13, "warning"))
_RESERVED = {
    "denpex.event_id",
    "denpex.signature",
    "denpex.category",
    "denpex.action",
    "denpex.summary",
    "denpex.source",
    "denpex.kind",
    "denpex.rank",
    "process.pid",
}
_CAPTURE = "denpex.capture."
_CAPTURE_LEN = len(_CAPTURE)
_otlp_wire = _native.load("otlp_logs")


class IngestError(Exception):
    """A payload refused whole: `status` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class LogBatch:
    rows: list[tuple[Any, ...]]  # evidence rows in denpex.control.schema.evidence order
    hosts: dict[str, tuple[int, int]] = field(default_factory=dict)  # host → (first, last) ns


@dataclass(slots=True)
class Report:
    id: str
    job: str | None
    user: str | None
    hosts: list[str]
    ranks: list[int]
    scheduler: dict[str, str]
    ended_ns: int
    diagnosis: dict[str, Any]
    evidence: LogBatch
    # the job's placement beyond its hosts (optional; the fleet rules read it)
    started_ns: int | None = None
    name: str | None = None  # the workload's name: reruns of one workload share it
    gpus: list[dict[str, Any]] = field(default_factory=list)  # [{host, pci, serial, uuid, …}]
    labels: dict[str, str] = field(default_factory=dict)  # {driver, image, …}


# --- bodies ---------------------------------------------------------------------------------


def body_bytes(data: bytes, content_encoding: str | None) -> bytes:
    """The request body after Content-Encoding (gzip, deflate or none), size-checked."""
    encoding = (content_encoding or "identity").strip().lower()
    try:
        if encoding == "gzip":
            data = _bounded(gzip.GzipFile(fileobj=io.BytesIO(data)))
        elif encoding == "deflate":
            data = zlib.decompressobj().decompress(data, MAX_BODY_BYTES + 1)
        elif encoding != "identity":
            raise IngestError(415, f"Content-Encoding {encoding!r}: use gzip, deflate or none")
    except (OSError, EOFError, zlib.error) as exc:
        raise IngestError(400, f"body is not valid {encoding}: {exc}") from None
    if len(data) > MAX_BODY_BYTES:
        raise IngestError(413, f"body over {MAX_BODY_BYTES} bytes after decompression")
    return data


def _bounded(stream: gzip.GzipFile) -> bytes:
    data = stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        raise IngestError(413, f"body over {MAX_BODY_BYTES} bytes after decompression")
    return data


def body_format(content_type: str | None) -> str:
    kind = CONTENT_TYPES.get((content_type or "").split(";")[0].strip().lower())
    if kind is None:
        raise IngestError(415, "Content-Type must be application/x-protobuf or application/json")
    return kind


# --- OTLP logs ------------------------------------------------------------------------------


def decode_logs(data: bytes, fmt: str, *, tenant: str, received_ns: int) -> LogBatch:
    """Evidence rows from an ExportLogsServiceRequest; raises IngestError for a bad one."""
    rows: list[tuple[Any, ...]] = []
    hosts: dict[str, tuple[int, int]] = {}
    for resource, records in _log_records(data, fmt):
        _check_tenant(resource, tenant)
        host = _opt_str(resource.get("host.name"), "resource host.name")
        job = _opt_str(resource.get("denpex.job"), "resource denpex.job")
        start = len(rows)
        rows.extend(_log_row(record, tenant, host, job, received_ns) for record in records)
        if host is not None and len(rows) > start:
            times = [row[2] or received_ns for row in rows[start:]]
            first, last = hosts.get(host, (min(times), max(times)))
            hosts[host] = (min(first, *times), max(last, *times))
    return LogBatch(rows, hosts)


def _log_records(data: bytes, fmt: str) -> list[tuple[dict[str, Any], list[Any]]]:
    """The request as plain values: the compiled wire reader for protobuf (its twin, through
    the protobuf classes, for what it does not handle), json_format for OTLP JSON."""
    if fmt == "json":
        request = ExportLogsServiceRequest()
        _parse(data, fmt, request)
        return _otlp_ref.walk(request)
    try:
        return _otlp_wire.decode_logs_request(data)
    except (ValueError, NotImplementedError):
        request = ExportLogsServiceRequest()
        _parse(data, fmt, request)  # says what is wrong, or decodes what the reader left
        return _otlp_ref.walk(request)


def _parse(data: bytes, fmt: str, message: Any) -> None:
    try:
        if fmt == "json":
            json_format.Parse(data, message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(data)
    except (DecodeError, json_format.ParseError, ValueError, TypeError) as exc:
        what = "OTLP JSON" if fmt == "json" else "OTLP protobuf"
        raise IngestError(
            400, f"body is not a valid {what} {message.DESCRIPTOR.name}: {exc}"
        ) from None


def _check_tenant(resource: dict[str, Any], tenant: str) -> None:
    claimed = resource.get("denpex.tenant")
    if claimed is not None and claimed != tenant:
        raise IngestError(403, f"resource denpex.tenant {claimed!r} is not this token's tenant")


def _opt_str(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise IngestError(400, f"{what} must be a string")


def _opt_int(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise IngestError(400, f"{what} must be an integer")


def _severity(number: int, text: str) -> str:
    lowered = text.lower()
    if lowered in SEVERITIES:
        return lowered
    for floor, name in _SEVERITY_FLOOR:
        if number >= floor:
            return name
    return "info"


def _log_row(
    record: tuple[int, int, str, Any, dict[str, Any]],
    tenant: str,
    host: str | None,
    job: str | None,
    received_ns: int,
) -> tuple[Any, ...]:
    ts_ns, severity_number, severity_text, body, attributes = record
    attrs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    captures: dict[str, Any] = {}
    for key, item in attributes.items():
        if key in _RESERVED:
            attrs[key] = item
        elif key.startswith(_CAPTURE):
            captures[key[_CAPTURE_LEN:]] = item
        else:
            extra[key] = item
    body = "" if body is None else str(body)
    event_id = attrs.get("denpex.event_id")
    if event_id is None:
        # Not denpex evidence (another OTLP sender): a content id, so a resend dedupes too.
        everything = sorted(attributes.items())
        digest = hashlib.sha256(jsonio.dumps([host, job, ts_ns, body, everything])).hexdigest()
        event_id = "otlp:" + digest[:32]
    elif not isinstance(event_id, str) or not event_id or len(event_id) > MAX_ID_CHARS:
        raise IngestError(400, f"denpex.event_id must be a string of 1..{MAX_ID_CHARS} chars")
    get = attrs.get
    return (
        tenant,
        event_id,
        ts_ns,
        received_ns,
        host,
        job,
        _opt_int(get("denpex.rank"), "denpex.rank"),
        _opt_int(get("process.pid"), "process.pid"),
        str(get("denpex.source") or "otlp"),
        str(get("denpex.kind") or "line"),
        str(get("denpex.signature") or ""),
        str(get("denpex.category") or ""),
        _severity(severity_number, severity_text),
        str(get("denpex.summary") or ""),
        str(get("denpex.action") or "none"),
        body,
        jsonio.dumps({"attrs": extra, "captures": captures}).decode(),
    )


# --- OTLP metrics ---------------------------------------------------------------------------


def decode_metrics(data: bytes, fmt: str, *, tenant: str) -> list[tuple[Any, ...]]:
    """(tenant, host, name, labels JSON, ts_ns, value) for each gauge/sum point."""
    request = ExportMetricsServiceRequest()
    _parse(data, fmt, request)
    out: list[tuple[Any, ...]] = []
    for resource_metrics in request.resource_metrics:
        resource = _otlp_ref.attributes(resource_metrics.resource.attributes)
        _check_tenant(resource, tenant)
        host = _opt_str(resource.get("host.name"), "resource host.name") or ""
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in _points(metric):
                    labels = jsonio.dumps(
                        dict(sorted(_otlp_ref.attributes(point.attributes).items()))
                    )
                    value = point.as_double if point.HasField("as_double") else point.as_int
                    out.append(
                        (
                            tenant,
                            host,
                            metric.name,
                            labels.decode(),
                            int(point.time_unix_nano),
                            float(value),
                        )
                    )
    return out


def _points(metric: Any) -> Iterator[Any]:
    which = metric.WhichOneof("data")
    if which in ("gauge", "sum"):
        yield from getattr(metric, which).data_points
    # histograms and summaries: the agent sends none; other senders' are not stored


# --- reports --------------------------------------------------------------------------------


def decode_report(data: bytes, *, tenant: str, received_ns: int) -> Report:
    """A `POST /api/v1/reports` body: {id, job, user, hosts, ranks, scheduler, ended_ns,
    diagnosis: denpex.diagnosis/v1} and optionally the job's placement {started_ns, name,
    gpus: [{host, pci, serial, uuid, vbios, rank}], labels: {driver, image, …}}. The diagnosis's
    timeline becomes evidence rows whose ids are `<report id>/<timeline id>` (timeline ids
    are only unique within one report)."""
    try:
        body = jsonio.loads(data)
    except ValueError as exc:
        raise IngestError(400, f"report body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise IngestError(400, "a report is a JSON object")
    known = {"id", "job", "user", "hosts", "ranks", "scheduler", "ended_ns", "diagnosis"}
    known |= {"started_ns", "name", "gpus", "labels"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise IngestError(400, f"unknown report field(s): {', '.join(unknown)}")
    report_id = body.get("id")
    if not isinstance(report_id, str) or not 1 <= len(report_id) <= MAX_ID_CHARS:
        raise IngestError(400, "report needs an 'id' (1..256 chars): the idempotency key")
    job = _opt_str(body.get("job"), "report field 'job'")
    user = _opt_str(body.get("user"), "report field 'user'")
    hosts = _str_list(body.get("hosts", []), "hosts")
    ranks = body.get("ranks", [])
    if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
        raise IngestError(400, "report field 'ranks' must be a list of integers")
    scheduler = body.get("scheduler", {})
    if not isinstance(scheduler, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int) for k, v in scheduler.items()
    ):
        raise IngestError(400, "report field 'scheduler' must be an object of ids")
    ended_ns = body.get("ended_ns", received_ns)
    if not _is_int(ended_ns) or ended_ns < 0:
        raise IngestError(400, "report field 'ended_ns' must be a non-negative integer")
    started_ns = body.get("started_ns")
    if started_ns is not None and (not _is_int(started_ns) or started_ns < 0):
        raise IngestError(400, "report field 'started_ns' must be a non-negative integer")
    name = _opt_str(body.get("name"), "report field 'name'")
    gpus = _gpus(body.get("gpus", []))
    labels = body.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise IngestError(400, "report field 'labels' must be an object of strings")
    diagnosis = _check_diagnosis(body.get("diagnosis"))
    rows, seen_hosts = _timeline_rows(report_id, diagnosis, tenant, job, received_ns)
    for host in hosts:
        seen_hosts.setdefault(host, (ended_ns, ended_ns))
    return Report(
        id=report_id,
        job=job,
        user=user,
        hosts=sorted(set(hosts) | set(seen_hosts)),
        ranks=sorted(set(ranks)),
        scheduler={k: str(v) for k, v in scheduler.items()},
        ended_ns=ended_ns,
        diagnosis=diagnosis,
        evidence=LogBatch(rows, seen_hosts),
        started_ns=started_ns,
        name=name,
        gpus=gpus,
        labels=labels,
    )


GPU_FIELDS = ("host", "pci", "serial", "uuid", "vbios", "rank")


def _gpus(value: Any) -> list[dict[str, Any]]:
    """The report's GPUs: [{host, pci, serial, uuid, vbios, rank}], host required, the rest
    optional."""
    message = "report field 'gpus' must be a list of {host, pci, serial, uuid, vbios, rank}"
    if not isinstance(value, list):
        raise IngestError(400, message)
    out = []
    for item in value:
        if not isinstance(item, dict) or set(item) - set(GPU_FIELDS):
            raise IngestError(400, message)
        host, rank = item.get("host"), item.get("rank")
        if not isinstance(host, str) or not host or (rank is not None and not _is_int(rank)):
            raise IngestError(400, message)
        for key in ("pci", "serial", "uuid", "vbios"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise IngestError(400, message)
        out.append({k: item[k] for k in GPU_FIELDS if item.get(k) is not None or k == "host"})
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise IngestError(400, f"report field {name!r} must be a list of non-empty strings")
    return value


def _check_diagnosis(diagnosis: Any) -> dict[str, Any]:
    if not isinstance(diagnosis, dict):
        raise IngestError(400, f"report needs a 'diagnosis' object ({SCHEMA_ID})")
    if diagnosis.get("schema") != SCHEMA_ID:
        raise IngestError(400, f"diagnosis 'schema' must be {SCHEMA_ID!r}")
    if diagnosis.get("status") not in ("failed", "ok"):
        raise IngestError(400, "diagnosis 'status' must be 'failed' or 'ok'")
    root = diagnosis.get("root_cause")
    if not isinstance(root, dict) or not isinstance(root.get("category"), str):
        raise IngestError(400, "diagnosis needs a 'root_cause' object with a 'category'")
    confidence = root.get("confidence", 0.0)
    if not isinstance(confidence, int | float) or not 0.0 <= confidence <= 1.0:
        raise IngestError(400, "diagnosis root_cause 'confidence' must be a number in [0, 1]")
    if not isinstance(root.get("evidence", []), list):
        raise IngestError(400, "diagnosis root_cause 'evidence' must be a list of ids")
    if not isinstance(diagnosis.get("timeline", []), list):
        raise IngestError(400, "diagnosis 'timeline' must be a list")
    return diagnosis


def _timeline_rows(
    report_id: str, diagnosis: dict[str, Any], tenant: str, job: str | None, received_ns: int
) -> tuple[list[tuple[Any, ...]], dict[str, tuple[int, int]]]:
    rows: list[tuple[Any, ...]] = []
    hosts: dict[str, tuple[int, int]] = {}
    for n, entry in enumerate(diagnosis.get("timeline") or []):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise IngestError(400, f"diagnosis timeline[{n}] needs a string 'id'")
        try:
            ts_ns = parse_iso_ns(entry["ts"]) if entry.get("ts") else 0
        except (ValueError, TypeError, AttributeError):
            raise IngestError(
                400, f"diagnosis timeline[{n}] 'ts' is not an ISO 8601 time"
            ) from None
        host = _opt_str(entry.get("host"), f"timeline[{n}] 'host'")
        rank = entry.get("rank")
        if rank is not None and not _is_int(rank):
            raise IngestError(400, f"diagnosis timeline[{n}] 'rank' must be an integer")
        severity = entry.get("severity", "error")
        if severity not in SEVERITIES:
            raise IngestError(400, f"diagnosis timeline[{n}] 'severity' is not a severity")
        rows.append(
            (
                tenant,
                f"{report_id}/{entry['id']}",
                ts_ns,
                received_ns,
                host,
                job,
                rank,
                None,
                str(entry.get("source") or "log"),
                "line",
                str(entry.get("signature") or ""),
                str(entry.get("category") or ""),
                severity,
                "",
                "none",
                str(entry.get("line") or ""),
                jsonio.dumps({"attrs": {"role": entry.get("role")}, "captures": {}}).decode(),
            )
        )
        if host is not None:
            ts = ts_ns or received_ns
            first, last = hosts.get(host, (ts, ts))
            hosts[host] = (min(first, ts), max(last, ts))
    return rows, hosts


def report_evidence_ids(report_id: str, ids: list[Any]) -> list[str]:
    """The stored ids of a report's own evidence ids (root cause, contributing)."""
    return [f"{report_id}/{i}" for i in ids if isinstance(i, str)]
