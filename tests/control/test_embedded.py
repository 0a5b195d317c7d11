"""`denpex agent --control-plane embedded`: one process on the head node runs the agent and
the control plane (SQLite under the agent's state dir). The agent's evidence (a GPU falling
off the bus, from the fake NVML of a scenario) reaches the embedded server over OTLP and
becomes an incident there; a restart reuses the agent's token; SIGTERM stops both."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenarios" / "xid79_at_start.yaml"


class HeadNode:
    """A real `denpex agent --control-plane embedded` process on loopback ports."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "denpex", "agent", "--listen", "127.0.0.1:0"),
                *("--state-dir", str(state), "--collectors", "nvml"),
                *("--control-plane", "embedded", "--control-plane-listen", "127.0.0.1:0"),
            ],
            stderr=subprocess.PIPE,
            text=True,
            env={
                "PATH": "/usr/bin:/bin",
                "DENPEX_NVML_SHIM": "1",
                "DENPEX_NVML_SCENARIO": str(SCENARIO),
            },
        )
        self.log: list[str] = []
        self.base = ""
        deadline = time.monotonic() + 90
        while not self.base and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            found = re.search(r"embedded control plane on (http://\S+)", line)
            if found:
                self.base = found.group(1)
        assert self.base, f"no embedded control plane: {''.join(self.log)}"
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def token(self) -> str:
        return (self.state / "control-plane" / "agent.token").read_text().strip()

    def get(self, path: str):
        request = urllib.request.Request(
            self.base + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture
def head_nodes():
    started: list[HeadNode] = []
    yield started
    for node in started:
        node.stop()


def wait_for(fetch, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fetch()
        if value:
            return value
        time.sleep(0.2)
    return fetch()


@pytest.mark.slow  # two real control plane starts (migrations) and an agent
def test_the_agents_evidence_becomes_an_incident_in_its_own_process(tmp_path, head_nodes):
    node = HeadNode(tmp_path / "state")
    head_nodes.append(node)
    token_file = tmp_path / "state" / "control-plane" / "agent.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert node.token not in "".join(node.log)  # never printed

    incidents = wait_for(lambda: node.get("/api/v1/incidents")["items"], timeout=60)
    assert incidents, f"no incident; log: {''.join(node.log)}"
    assert incidents[0]["category"] == "gpu.fallen_off_bus"
    assert incidents[0]["component"]["kind"] == "host"
    evidence = node.get("/api/v1/evidence")["items"]
    assert any(e["source"] == "nvml" for e in evidence)
    # one process: no second daemon serves the control plane
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(node.proc.pid)], capture_output=True, text=True
    ).stdout.split()
    assert not [c for c in children if "denpex" in Path(f"/proc/{c}/cmdline").read_text()]

    first_token = node.token
    assert node.stop() == 0, "".join(node.log)

    again = HeadNode(tmp_path / "state")
    head_nodes.append(again)
    assert again.token == first_token  # the stored token is still valid: reused
    assert again.get("/api/v1/incidents")["items"][0]["id"] == incidents[0]["id"]
    assert again.stop() == 0, "".join(again.log)


def test_once_refuses_the_embedded_control_plane(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "denpex", "agent", "--once", "--control-plane", "embedded"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--control-plane goes with the daemon" in result.stderr
