"""`denpex run`'s link to a node agent on the same host, over the agent's Unix socket.

Registers the job's process so the agent attributes what it sees (the kernel OOM victim,
cgroup kills, eBPF findings) to it, and fetches that evidence when the job ends. The socket,
not TCP: there the agent knows the caller's uid from the kernel and lets a user register
only their own processes and read only their own jobs' evidence. Optional by design: when
no agent answers within a fraction of a second, the run goes on without it.
"""

from __future__ import annotations

import http.client
import os
import socket
from urllib.parse import urlencode

from denpex.core import jsonio
from denpex.core.events import Evidence
from denpex.core.wire import Registration, WireError, evidence_from_dict

DEFAULT_AGENT_SOCKET = "/var/lib/denpex/agent/agent.sock"
TIMEOUT_S = 0.5
FRESH_TIMEOUT_S = 3.0  # the agent waits up to 2 s for its collectors, then answers
OFF = ("", "off", "none", "0")


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (a path, or `@name` for an abstract one)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        address = (
            "\0" + self.socket_path[1:] if self.socket_path.startswith("@") else self.socket_path
        )
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AgentLink:
    """A local agent on the socket `path`; `reason` says why the last call failed."""

    def __init__(self, path: str, timeout_s: float = TIMEOUT_S) -> None:
        self.path = path or DEFAULT_AGENT_SOCKET
        self.timeout_s = timeout_s
        self.reason = ""

    @classmethod
    def from_env(cls) -> AgentLink | None:
        """DENPEX_AGENT_SOCKET (default: the agent's default socket); 'off' disables the
        link, and so does DENPEX_AGENT_URL=off (its earlier name)."""
        if os.environ.get("DENPEX_AGENT_URL", "").lower() in OFF[1:]:
            return None
        path = os.environ.get("DENPEX_AGENT_SOCKET", DEFAULT_AGENT_SOCKET)
        return None if path.lower() in OFF else cls(path)

    def _call(
        self, method: str, path: str, body: bytes | None = None, timeout_s: float | None = None
    ) -> bytes | None:
        connection = _UnixConnection(self.path, timeout_s or self.timeout_s)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.reason = f"no agent on {self.path} ({exc})"
            return None
        finally:
            connection.close()
        if response.status >= 300:
            detail = data[:200].decode(errors="replace")
            self.reason = (
                f"agent on {self.path} answered {response.status} to {method} {path}: {detail}"
            )
            return None
        return data

    def register(self, registration: Registration) -> bool:
        return self._call("POST", "/v1/register", jsonio.dumps(registration.to_dict())) is not None

    def unregister(self, pid: int) -> bool:
        return self._call("DELETE", f"/v1/register/{pid}") is not None

    def evidence(self, since_ns: int, pid: int) -> list[Evidence]:
        """The agent's evidence about `pid` (and the job it registered) since `since_ns`,
        after the agent polled its sources once more: the kernel's last word on a job that
        just died (its OOM victim record) is often younger than the agent's last poll."""
        query = urlencode({"since": since_ns, "pid": pid, "fresh": 1})
        body = self._call("GET", "/v1/evidence?" + query, timeout_s=FRESH_TIMEOUT_S)
        if body is None:
            return []
        try:
            items = jsonio.loads(body).get("evidence", [])
            return [evidence_from_dict(item) for item in items]
        except (ValueError, AttributeError, WireError) as exc:
            self.reason = f"agent on {self.path} sent evidence denpex cannot read: {exc}"
            return []

    def requeue_dead_letter(self) -> int | None:
        """Ask the agent to move its dead-letter records back into its spool (root only)."""
        body = self._call("POST", "/v1/spool/requeue", b"{}", timeout_s=30.0)
        if body is None:
            return None
        return int(jsonio.loads(body).get("requeued", 0))


def job_name(pid: int) -> str:
    """The job this run belongs to: the scheduler's id when there is one."""
    for variable in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID"):
        value = os.environ.get(variable)
        if value:
            step = os.environ.get("SLURM_STEP_ID")
            return f"{value}.{step}" if variable == "SLURM_JOB_ID" and step else value
    return f"run-{os.uname().nodename}-{pid}"
