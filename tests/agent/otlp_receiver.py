"""A real OTLP/HTTP receiver for tests: POST /v1/logs and /v1/metrics, protobuf or JSON,
decoded with opentelemetry-proto; records log records deduplicated by denpex.event_id.

It can be "down" on demand (answering 503, or stopped and later restarted on the same port),
answer a scripted sequence of statuses (each with Retry-After, a redirect's Location), and
refuse a request holding more than `max_records` records with 413, as real collectors cap a
request's size. It must never be used outside tests: it keeps everything it receives in
memory.
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from denpex.agent.otlp import parse


def any_value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.lock = threading.Lock()
        self.records: dict[str, dict[str, Any]] = {}  # event id → the first copy received
        self.duplicates = 0
        self.log_requests: list[ExportLogsServiceRequest] = []
        self.metric_requests: list[ExportMetricsServiceRequest] = []
        self.content_types: list[str] = []
        self.status = 200  # what to answer; 503 makes it "down" while still listening
        self.retry_after: str | None = None
        self.partial_reject = 0  # reject this many records per request (partial success)
        self.script: list[int] = []  # statuses for the next requests, one each, then `status`
        self.max_records: int | None = None  # a request with more records: 413
        self.location = "/elsewhere"  # where a 3xx points
        self.answers: list[tuple[int, int]] = []  # (status answered, records in the request)
        self.gets = 0  # requests that were not POSTs (a followed redirect arrives as a GET)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        server = _QuietServer(("127.0.0.1", self.port), _handler_for(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ids(self) -> set[str]:
        with self.lock:
            return set(self.records)

    def log_records(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.records.values())

    def _accept_logs(self, request: ExportLogsServiceRequest) -> None:
        with self.lock:
            self.log_requests.append(request)
            for resource_logs in request.resource_logs:
                resource = {kv.key: any_value(kv.value) for kv in resource_logs.resource.attributes}
                for scope_logs in resource_logs.scope_logs:
                    for record in scope_logs.log_records:
                        attrs = {kv.key: any_value(kv.value) for kv in record.attributes}
                        event_id = attrs.get("denpex.event_id") or f"noid-{len(self.records)}"
                        if event_id in self.records:
                            self.duplicates += 1
                            continue
                        self.records[event_id] = {
                            "body": record.body.string_value,
                            "attrs": attrs,
                            "resource": resource,
                            "severity_number": int(record.severity_number),
                            "scope": scope_logs.scope.name,
                        }


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client killed mid-request (the kill -9 test) is expected, not an error


def _count_records(body: bytes, content_type: str) -> int:
    try:
        logs = parse(body, ExportLogsServiceRequest(), content_type or "application/x-protobuf")
    except Exception:
        return 0
    assert isinstance(logs, ExportLogsServiceRequest)
    return sum(len(s.log_records) for r in logs.resource_logs for s in r.scope_logs)


def _handler_for(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def do_GET(self) -> None:
            with receiver.lock:
                receiver.gets += 1
            self._reply(200, b"a page, not a receiver", "text/plain")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            content_type = self.headers.get("Content-Type", "")
            count = _count_records(body, content_type) if self.path == "/v1/logs" else 0
            with receiver.lock:
                status = receiver.script.pop(0) if receiver.script else receiver.status
                if status == 200 and receiver.max_records is not None:
                    status = 413 if count > receiver.max_records else 200
                receiver.answers.append((status, count))
            if status != 200:
                extra = {"Retry-After": receiver.retry_after} if receiver.retry_after else {}
                if 300 <= status < 400:
                    extra["Location"] = receiver.location
                return self._reply(status, b"refused", "text/plain", extra)
            if content_type not in ("application/x-protobuf", "application/json"):
                return self._reply(415, b"unsupported content type", "text/plain")
            receiver.content_types.append(content_type)
            if self.path == "/v1/logs":
                logs = parse(body, ExportLogsServiceRequest(), content_type)
                assert isinstance(logs, ExportLogsServiceRequest)
                receiver._accept_logs(logs)
                response: Any = ExportLogsServiceResponse()
                if receiver.partial_reject:
                    response.partial_success.rejected_log_records = receiver.partial_reject
            elif self.path == "/v1/metrics":
                metrics = parse(body, ExportMetricsServiceRequest(), content_type)
                assert isinstance(metrics, ExportMetricsServiceRequest)
                with receiver.lock:
                    receiver.metric_requests.append(metrics)
                response = ExportMetricsServiceResponse()
                if receiver.partial_reject:
                    response.partial_success.rejected_data_points = receiver.partial_reject
            else:
                return self._reply(404, b"not found", "text/plain")
            self._reply(200, response.SerializeToString(), "application/x-protobuf")

        def _reply(
            self, status: int, data: bytes, content_type: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler
