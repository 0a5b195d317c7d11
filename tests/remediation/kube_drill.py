"""The detect → cordon drill on the Kubernetes backend: kmock's API server on loopback (with
the Eviction API, tests/remediation/kube_server.py) holding a few Ready GPU nodes, a real
`denpex server` whose remediation backend is the official Kubernetes client (pointed at the
API server by a kubeconfig, as a site's would be), a policy of AutoSafe, and one real
`denpex agent` per node whose kernel log is a FIFO the drill writes (the agent's fixture
source: nothing goes into the host's kernel log).

A drill writes an Xid 79 into one node's kernel log and times how long until that node's
`spec.unschedulable` reads true from the API server: the agent's evidence → the ingest →
an incident → a plan → the cordon. Everything started here is stopped in close(), by pid.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from denpex.core import jsonio
from denpex.core.kmsg import TEST_KMSG_ENV, TEST_MARKER, KmsgRecord, format_record
from tests.control.conftest import ServerProcess, mint
from tests.control.pg import free_port
from tests.remediation.kube_server import KubeServer

TENANT = "acme"
# AutoSafe; the blast radius opened wide so that drills on the same pool are not held
POLICY = {
    "tier": "autosafe",
    "guards": {
        "blast_radius": {"max_nodes": 100, "max_percent": 100, "window_s": 1},
        "unhealthy_stop_percent": 101,
    },
}
READY = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}


class KubeDrill:
    def __init__(self, root: Path, nodes: int = 3) -> None:
        self.root = root
        self.nodes = [f"gpu-node{i}" for i in range(1, nodes + 1)]
        self.kube = KubeServer()
        self.db = f"sqlite:///{root / 'cp.db'}"
        self.server: ServerProcess | None = None
        self.agents: list[subprocess.Popen] = []
        self.kmsg: list[int] = []  # the write end of each node's kernel-log FIFO
        self.seq = 0
        self.core: Any = None
        self.viewer = ""

    # --- set-up ----------------------------------------------------------------------------

    def start(self) -> KubeDrill:
        from kubernetes import client

        self.kube.start()
        cfg = client.Configuration()
        cfg.host = self.kube.url
        self.core = client.CoreV1Api(client.ApiClient(cfg))
        for name in self.nodes:
            self.core.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": {"denpex.io/pool": "gpu"}},
                    "spec": {},
                    "status": READY,
                }
            )
        kubeconfig = self.root / "kubeconfig"
        kubeconfig.write_text(
            jsonio.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "drill", "cluster": {"server": self.kube.url}}],
                    "users": [{"name": "denpex", "user": {}}],
                    "contexts": [
                        {"name": "drill", "context": {"cluster": "drill", "user": "denpex"}}
                    ],
                    "current-context": "drill",
                },
                pretty=True,
            ).decode()
        )
        admin, operator = mint(self.db, TENANT, "admin"), mint(self.db, TENANT, "operator")
        self.viewer = mint(self.db, TENANT, "viewer")
        (self.root / "token").write_text(operator + "\n")
        self.server = ServerProcess(
            self.db,
            self.root / "server.log",
            *("--remediation-backend", "kubernetes"),
            *("--diagnostics-command", "sh -c 'exit 0'"),
        )
        before = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(kubeconfig)  # the server's client reads it, as a site's
        try:
            self.server.start()
        finally:
            if before is None:
                os.environ.pop("KUBECONFIG")
            else:
                os.environ["KUBECONFIG"] = before
        self._call(admin, "PUT", "/api/v1/remediation/policy", POLICY)
        for name in self.nodes:
            self._start_agent(name)
        return self

    def _call(self, token: str, method: str, path: str, body: Any = None) -> Any:
        assert self.server is not None
        request = urllib.request.Request(
            self.server.base + path,
            data=None if body is None else jsonio.dumps(body),
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            return jsonio.loads(reply.read())

    def _start_agent(self, name: str) -> None:
        assert self.server is not None
        state = self.root / name
        dev = state / "dev"
        dev.mkdir(parents=True)
        os.mkfifo(dev / "kmsg")
        # held open for writing by the drill: the agent never sees end of file
        self.kmsg.append(os.open(dev / "kmsg", os.O_RDWR | os.O_NONBLOCK))
        config = state / "agent.yaml"
        config.write_text(
            jsonio.dumps(
                {
                    "server": {"url": self.server.base, "token_file": str(self.root / "token")},
                    "api": {"socket": str(state / "agent.sock")},
                },
                pretty=True,
            ).decode()
        )
        argv = [
            *(sys.executable, "-m", "denpex", "agent", "--config", str(config)),
            *("--host", name, "--listen", f"127.0.0.1:{free_port()}"),
            *("--state-dir", str(state), "--devfs", str(dev), "--collectors", "kmsg"),
        ]
        # its kernel log is the FIFO, never the host's: it may read marked lines
        with open(state / "agent.log", "ab") as log:
            self.agents.append(
                subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, TEST_KMSG_ENV: "1"},
                )
            )
        deadline = time.monotonic() + 60
        while not (state / "agent.sock").exists():
            if time.monotonic() > deadline or self.agents[-1].poll() is not None:
                raise RuntimeError(
                    f"agent {name} did not start: {(state / 'agent.log').read_text()}"
                )
            time.sleep(0.1)

    # --- a drill ---------------------------------------------------------------------------

    def unschedulable(self, name: str) -> bool:
        return bool(self.core.read_node(name).spec.unschedulable)

    def drill(self, index: int, timeout_s: float = 120.0) -> dict[str, float]:
        """An Xid 79 in node `index`'s kernel log → seconds until the control plane holds its
        evidence, an incident names the node, a plan exists, and the node is unschedulable
        (`cordon`, the drill's number)."""
        name = self.nodes[index]
        assert not self.unschedulable(name), f"{name} is cordoned before its drill"
        self.seq += 1
        message = (
            f"NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus. {TEST_MARKER}"
        )
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        probes = {
            "evidence": lambda: self.read(f"/api/v1/evidence?host={name}"),
            "incident": lambda: self.read(f"/api/v1/incidents?host={name}"),
            "plan": lambda: [
                p for p in self.read("/api/v1/remediation/plans") if p["host"] == name
            ],
            "cordon": lambda: self.unschedulable(name),
        }
        seen: dict[str, float] = {}
        started = time.monotonic()
        os.write(self.kmsg[index], format_record(KmsgRecord(0, 3, self.seq, usec, "-", message)))
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            for stage, probe in probes.items():
                if stage not in seen and probe():
                    seen[stage] = round(time.monotonic() - started, 3)
            if "cordon" in seen:
                return seen
            time.sleep(0.05)
        raise TimeoutError(f"{name} was not cordoned within {timeout_s:g} s (seen: {seen})")

    def read(self, path: str) -> list[Any]:
        return list(self._call(self.viewer, "GET", path)["items"])

    def node(self, name: str) -> Any:
        return self.core.read_node(name)

    def close(self) -> None:
        for proc in self.agents:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for fd in self.kmsg:
            os.close(fd)
        if self.server is not None:
            self.server.stop()
        self.kube.stop()
