"""The fleet replay through a real `denpex server` (bench_fleet.py --server): every OTLP log
request and job report goes over HTTP into the server's ingest and store (embedded SQLite),
and the FleetView is built from what the server stored and serves back on its API
(/api/v1/evidence/{id}, /api/v1/reports/{id}) — not from what was sent.

The server is a child process on a loopback port with a temporary database; it is stopped
(and the database removed) when the replay ends, whatever happens.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from fleet_replay import TENANT, InProcessControlPlane, records_from_otlp

from denpex.control.fleet.model import EvidenceRecord
from denpex.control.fleet.reports import outcome_from_report, parse_ts
from denpex.core import jsonio

# the report fields `POST /api/v1/reports` accepts; the simulator's others are left out
REPORT_FIELDS = ("id", "job", "user", "hosts", "ranks", "scheduler", "ended_ns", "diagnosis")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _denpex(*args: str) -> list[str]:
    return [sys.executable, "-m", "denpex", *args]


@dataclass
class ServerControlPlane(InProcessControlPlane):
    """The same correlation pass as in-process, over what a real server ingested."""

    url: str = ""
    dropped_fields: set[str] = field(default_factory=set)
    requests: int = 0
    http_s: float = 0.0
    _token: str = ""
    _tmp: str = ""
    _process: subprocess.Popen | None = None

    def start(self) -> ServerControlPlane:
        self._tmp = tempfile.mkdtemp(prefix="bench-fleet-")
        db = f"sqlite:///{os.path.join(self._tmp, 'cp.db')}"
        self._token = subprocess.run(
            _denpex("server", "token", "--db", db, "--tenant", TENANT, "--role", "operator"),
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._process = subprocess.Popen(
            _denpex("server", "--db", db, "--listen", f"127.0.0.1:{port}", "--quota", "1e9"),
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self._tmp, "server.log"), "wb"),  # noqa: SIM115
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise SystemExit(f"denpex server exited at start: {self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"denpex server did not answer /healthz in 60 s: {self._log_tail()}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self._tmp, "server.log"), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def _call(self, method: str, path: str, body: bytes | None = None, ctype: str = "") -> Any:
        headers = {"Authorization": f"Bearer {self._token}"}
        if ctype:
            headers["Content-Type"] = ctype
        request = urllib.request.Request(self.url + path, body, headers, method=method)
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                data = reply.read()
        except urllib.error.HTTPError as err:
            detail = err.read()[:300].decode(errors="replace")
            message = f"denpex server refused {method} {path}: HTTP {err.code} {detail}"
            raise SystemExit(message) from None
        finally:
            self.requests += 1
            self.http_s += time.perf_counter() - start
        return jsonio.loads(data) if data else None

    def ingest(self, kind: str, body: bytes) -> None:
        if kind == "logs":
            self._call("POST", "/v1/logs", body, "application/x-protobuf")
            for sent in records_from_otlp(body):
                path = "/api/v1/evidence/" + urllib.parse.quote(sent.id, safe="")
                self.events[sent.id] = _stored_evidence(self._call("GET", path))
            self.ingested += 1
            return
        report = jsonio.loads(body)
        self.dropped_fields.update(k for k in report if k not in REPORT_FIELDS)
        accepted = {k: v for k, v in report.items() if k in REPORT_FIELDS}
        self._call("POST", "/api/v1/reports", jsonio.dumps(accepted), "application/json")
        stored = self._call("GET", "/api/v1/reports/" + urllib.parse.quote(report["id"], safe=""))
        self.jobs[report["id"]] = outcome_from_report(stored, tenant=TENANT)
        self.ingested += 1


def _stored_evidence(row: dict[str, Any]) -> EvidenceRecord:
    """An evidence row as the server's API returns it."""
    captures = row.get("captures") or {}
    attrs = row.get("attrs") or {}
    return EvidenceRecord(
        id=row["id"],
        ts_ns=row.get("ts_ns") or parse_ts(row.get("ts")),
        host=row.get("host"),
        category=str(row.get("category") or "unknown"),
        severity=str(row.get("severity") or "info"),
        source=str(row.get("source") or "agent"),
        signature=str(row.get("signature") or ""),
        rank=row.get("rank"),
        gpu_pci=captures.get("pci") or attrs.get("pci"),
        gpu_serial=attrs.get("gpu_serial"),
        job=row.get("job"),
        tenant=TENANT,
        body=str(row.get("body") or row.get("summary") or ""),
    )
