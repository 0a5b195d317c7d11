"""A UFM Enterprise REST server on loopback for tests: serves the documented JSON shapes of
/ufmRest/resources/ports, /ufmRest/app/alarms and /ufmRest/app/events from fixtures.

Checks basic auth (and the access token under /ufmRestV3) like UFM, can answer 5xx or stall
on demand; never listens on anything but 127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

FIXTURES = Path(__file__).parent / "fixtures" / "ufm"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeUfm:
    """The server's data and switches; tests change them between polls."""

    def __init__(self, username: str = "denpex", password: str = "s3cret", token: str = "") -> None:
        self.username = username
        self.password = password
        self.token = token
        self.ports: list[dict[str, Any]] = fixture("ports.json")
        self.alarms: list[dict[str, Any]] = fixture("alarms.json")
        self.events: list[dict[str, Any]] = fixture("events.json")
        self.fail_status: int | None = None  # answer every request with this status
        self.delay_s = 0.0  # stall before answering (client timeout tests)
        self.requests: list[tuple[str, str | None]] = []  # (path with query, Authorization)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeUfm:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def port(self, name: str) -> dict[str, Any]:
        return next(p for p in self.ports if p["name"] == name)

    def authorised(self, base: str, header: str | None) -> bool:
        if base == "/ufmRestV3":
            return bool(self.token) and header == f"Basic {self.token}"
        pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return header == f"Basic {pair}"

    def answer(self, path: str, query: dict[str, list[str]]) -> Any:
        if path == "/resources/ports":
            wanted = query.get("system", [None])[0]
            if wanted is None:
                return self.ports
            keys = ("system_id", "guid", "system_name")
            return [p for p in self.ports if wanted in (p.get(k) for k in keys)]
        if path == "/app/alarms":
            return self.alarms
        if path == "/app/events":
            return self.events
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        ufm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                auth = self.headers.get("Authorization")
                ufm.requests.append((self.path, auth))
                if ufm.delay_s:
                    time.sleep(ufm.delay_s)
                if ufm.fail_status:
                    self._send(ufm.fail_status, {"error": "Internal Server Error"})
                    return
                base, _, rest = parts.path.partition("/resources")
                if not rest:
                    base, _, rest = parts.path.partition("/app")
                    rest = "/app" + rest
                else:
                    rest = "/resources" + rest
                if base not in ("/ufmRest", "/ufmRestV3"):
                    self._send(404, {"error": "Not Found"})
                    return
                if not ufm.authorised(base, auth):
                    # UFM answers 401 with a JSON body and a basic-auth challenge
                    self._send(401, {"error": "Unauthorized"}, challenge=True)
                    return
                data = ufm.answer(rest, parse_qs(parts.query))
                if data is None:
                    self._send(404, {"error": "Not Found"})
                    return
                self._send(200, data)

            def _send(self, status: int, data: Any, challenge: bool = False) -> None:
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if challenge:
                    self.send_header("WWW-Authenticate", 'Basic realm="UFM"')
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout test)

        return Handler
