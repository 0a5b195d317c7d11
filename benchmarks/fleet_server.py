"""The fleet replay through a real `denpex server` (bench_fleet.py --server): every OTLP log
request and job report goes over HTTP into the server's ingest and store (embedded SQLite);
host state goes as the agents' metrics (denpex_host_info, the diagnostics' last pass); the
fleet rules run in the server's leader (`--replay`: each pass at the replayed fleet time,
asked for by POST /api/v1/replay/tick) and the incidents are read back from its API.

The server is a child process on a loopback port with a temporary database and topology
file; it is stopped (and the files removed) when the replay ends, whatever happens.
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
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleet_fabric import fabric_events
from fleet_replay import TENANT

from denpex.agent.otlp import encode_metrics, serialise
from denpex.control.fleet.model import HostState, Incident, Placement
from denpex.core import jsonio
from denpex.core.events import metric

PROTOBUF = "application/x-protobuf"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _denpex(*args: str) -> list[str]:
    return [sys.executable, "-m", "denpex", *args]


def topology_file(topology: dict[str, Placement]) -> bytes:
    """The site topology file `denpex server --topology` reads (JSON is YAML)."""
    hosts = {
        host: {
            k: v
            for k, v in (("rack", p.rack), ("switch", p.switch), ("pdu", p.pdu), ("pool", p.pool))
            if v
        }
        | ({"rails": dict(p.rails)} if p.rails else {})
        for host, p in sorted(topology.items())
    }
    return jsonio.dumps({"hosts": hosts})


@dataclass
class ServerControlPlane:
    """Ingest, correlation and incidents all in a `denpex server` process."""

    topology: dict[str, Placement]
    # --fabric agents: the placements whose switches and rails the agents report (as
    # host_port_peer / host_rail, sent with each host_info), the site file lacking them
    fabric: dict[str, Placement] | None = None
    url: str = ""
    requests: int = 0
    http_s: float = 0.0
    ingested: int = 0
    _token: str = ""
    _tmp: str = ""
    _process: subprocess.Popen | None = None
    _sent_hosts: dict[str, tuple[Any, int | None]] = field(default_factory=dict)

    def start(self) -> ServerControlPlane:
        self._tmp = tempfile.mkdtemp(prefix="bench-fleet-")
        db = f"sqlite:///{os.path.join(self._tmp, 'cp.db')}"
        topology = os.path.join(self._tmp, "topology.json")
        with open(topology, "wb") as f:
            f.write(topology_file(self.topology))
        self._token = subprocess.run(
            _denpex("server", "token", "--db", db, "--tenant", TENANT, "--role", "admin"),
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = ("--db", db, "--listen", f"127.0.0.1:{port}", "--quota", "1e9")
        with open(os.path.join(self._tmp, "server.log"), "wb") as log:
            self._process = subprocess.Popen(
                _denpex("server", *args, "--topology", topology, "--replay"),
                stdout=subprocess.DEVNULL,
                stderr=log,
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
            with urllib.request.urlopen(request, timeout=120) as reply:
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
            self._call("POST", "/v1/logs", body, PROTOBUF)
        else:
            self._call("POST", "/api/v1/reports", body, "application/json")
        self.ingested += 1

    def _send_host_state(self, now_ns: int, hosts: dict[str, HostState]) -> None:
        """What the agents would have sent since the last pass: a host's labels when they
        changed, the time its diagnostics last passed when they passed again."""
        points = []
        for host, state in sorted(hosts.items()):
            sent = (tuple(sorted(state.labels.items())), state.diagnostics_passed_ns)
            if self._sent_hosts.get(host) == sent:
                continue
            self._sent_hosts[host] = sent
            labels = {k: str(v) for k, v in state.labels.items()}
            points.append(
                metric("host_info", 1, source="agent", labels=labels, host=host, ts_ns=now_ns)
            )
            if self.fabric is not None:  # the agent sends its fabric rows with its host_info
                points += fabric_events(self.fabric, host, now_ns)
            if state.diagnostics_passed_ns is not None:
                points.append(
                    metric(
                        "diagnostics_last_pass_timestamp_seconds",
                        state.diagnostics_passed_ns / 1e9,
                        source="dcgm",
                        host=host,
                        ts_ns=now_ns,
                    )
                )
        if points:
            body = serialise(encode_metrics(points, now_ns=now_ns), "http/protobuf")
            self._call("POST", "/v1/metrics", body, PROTOBUF)

    def correlate(
        self, now_ns: int, hosts: dict[str, HostState], on_change: Callable[[Incident, str], None]
    ) -> dict[str, list[int]]:
        """One leader pass in the server at fleet time `now_ns`; every incident it opened,
        grew or resolved is read back from the API."""
        self._send_host_state(now_ns, hosts)
        done = self._call("POST", f"/api/v1/replay/tick?now_ns={now_ns}")["tenants"].get(TENANT, {})
        for how in ("opened", "updated", "resolved"):
            for incident_id in done.get(how, []):
                on_change(_incident(self._call("GET", f"/api/v1/incidents/{incident_id}")), how)
        return done


def _incident(item: dict[str, Any]) -> Incident:
    """An incident as the API shows it, as the fleet's record the benchmark scores."""
    return Incident(
        id=str(item["id"]),
        kind=item["component"]["kind"],
        component=item["component"]["id"],
        category=item["category"],
        confidence=float(item["confidence"]),
        rules=tuple(item["rules"]),
        evidence=tuple(item["evidence"]),
        jobs=tuple(item["jobs"]),
        hosts=tuple(item["hosts"]),
        first_ns=item["first_ns"],
        last_ns=item["last_ns"],
        explanation=item["explanation"],
        state=item["status"],
        action=item["action"],
        tenants=(TENANT,),
        score=float(item["score"]),
    )
