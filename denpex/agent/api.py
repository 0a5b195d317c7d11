"""The agent's local HTTP API: `/metrics`, `/healthz`, `/v1/evidence`, `/v1/register`.

Serves on loopback by default. Registration changes what the agent attributes, so it is
accepted from loopback clients only, whatever the listen address. Handlers only read
snapshots: a slow client never holds a lock a collector needs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from denpex.agent.config import parse_listen
from denpex.agent.exposition import AgentView, render
from denpex.core import jsonio
from denpex.core.wire import Registration, WireError, evidence_to_dict

MAX_BODY = 64 * 1024
FRESH_TIMEOUT_S = 2.0  # `fresh=1`: the longest a caller waits for every collector to poll
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class AgentApi:
    """The HTTP server in a background thread."""

    def __init__(
        self,
        listen: str,
        view: AgentView,
        health: Callable[[], dict[str, Any]],
        refresh: Callable[[float], list[str]] | None = None,
    ) -> None:
        host, port = parse_listen(listen)
        self.view = view
        self.health = health
        self.refresh = refresh
        api = self

        class Handler(_Handler):
            owner = api

        server_class = _V6Server if ":" in host else ThreadingHTTPServer
        self.server = server_class((host, port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        address, port = self.server.server_address[:2]
        host = address.decode() if isinstance(address, bytes) else str(address)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            # requests wake the loop at once; the interval only paces its shutdown check,
            # which stop() hurries along with a connection of its own
            target=self.server.serve_forever,
            kwargs={"poll_interval": 30.0},
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        stopping = threading.Thread(target=self.server.shutdown, daemon=True)
        stopping.start()
        with contextlib.suppress(OSError):  # wakes the select() the loop sleeps in
            host, port = self.server.server_address[:2]
            host = host.decode() if isinstance(host, bytes | bytearray) else str(host)
            socket.create_connection((host, port), timeout=1).close()
        stopping.join(5)
        self.server.server_close()

    # -- routes -------------------------------------------------------------------------
    def get(self, path: str, query: dict[str, list[str]]) -> tuple[HTTPStatus, str, bytes]:
        if path == "/metrics":
            return HTTPStatus.OK, PROMETHEUS_TEXT, render(self.view)
        if path == "/healthz":
            report = self.health()
            status = HTTPStatus.OK if report["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE
            return status, "application/json", jsonio.dumps(report)
        if path == "/v1/evidence":
            since = _int_param(query, "since") or 0
            pid = _int_param(query, "pid")
            job = query.get("job", [None])[0]
            late: list[str] = []
            if query.get("fresh", ["0"])[0] == "1" and self.refresh is not None:
                late = self.refresh(FRESH_TIMEOUT_S)  # poll everything now: nothing in flight
            found = self.view.pipeline.evidence_since(since, pid=pid, job=job)
            body = {
                "host": self.view.host,
                "evidence": [evidence_to_dict(e) for e in found],
                "not_refreshed": late,
            }
            return HTTPStatus.OK, "application/json", jsonio.dumps(body)
        if path == "/v1/jobs":
            jobs = [r.to_dict() for r in self.view.pipeline.jobs.snapshot()]
            return HTTPStatus.OK, "application/json", jsonio.dumps({"jobs": jobs})
        raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")

    def post(self, path: str, body: bytes) -> tuple[HTTPStatus, str, bytes]:
        if path != "/v1/register":
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        try:
            registration = Registration.from_dict(jsonio.loads(body))
        except WireError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        except ValueError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        stored = self.view.pipeline.jobs.register(registration)
        return HTTPStatus.CREATED, "application/json", jsonio.dumps(stored.to_dict())

    def delete(self, path: str) -> tuple[HTTPStatus, str, bytes]:
        head, _, pid = path.rpartition("/")
        if head != "/v1/register" or not pid.isdigit():
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        found = self.view.pipeline.jobs.unregister(int(pid))
        if not found:
            raise ApiError(HTTPStatus.NOT_FOUND, f"pid {pid} is not registered")
        return HTTPStatus.NO_CONTENT, "application/json", b""


def _int_param(query: dict[str, list[str]], name: str) -> int | None:
    values = query.get(name)
    if not values:
        return None
    try:
        return int(values[0])
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{name} must be an integer") from None


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    owner: AgentApi
    server_version = "denpex-agent"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the agent's log

    def _respond(self, call: Callable[[], tuple[HTTPStatus, str, bytes]]) -> None:
        try:
            status, content_type, body = call()
        except ApiError as exc:
            status, content_type = exc.status, "application/json"
            body = jsonio.dumps({"error": str(exc)})
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        self._respond(lambda: self.owner.get(url.path, parse_qs(url.query)))

    def do_POST(self) -> None:
        self._respond(lambda: self.owner.post(urlsplit(self.path).path, self._body()))

    def do_DELETE(self) -> None:
        def delete() -> tuple[HTTPStatus, str, bytes]:
            self._local_only()
            return self.owner.delete(urlsplit(self.path).path)

        self._respond(delete)

    def _local_only(self) -> None:
        if not ipaddress.ip_address(self.client_address[0].split("%")[0]).is_loopback:
            raise ApiError(HTTPStatus.FORBIDDEN, "registration is accepted from this host only")

    def _body(self) -> bytes:
        self._local_only()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        return self.rfile.read(length)
