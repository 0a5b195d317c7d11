"""`denpex run`'s link to a node agent on the same host, over the agent's local HTTP API.

Registers the job's process so the agent attributes what it sees (the kernel OOM victim,
cgroup kills, eBPF findings) to it, and fetches that evidence when the job ends. Optional by
design: when no agent answers within a fraction of a second, the run goes on without it.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from urllib.parse import urlencode

from denpex.core import jsonio
from denpex.core.events import Evidence
from denpex.core.wire import Registration, WireError, evidence_from_dict

DEFAULT_AGENT_URL = "http://127.0.0.1:9478"
TIMEOUT_S = 0.5
FRESH_TIMEOUT_S = 3.0  # the agent waits up to 2 s for its collectors, then answers


class AgentLink:
    """A local agent at `url`; `reason` says why the last call failed."""

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.reason = ""

    @classmethod
    def from_env(cls) -> AgentLink | None:
        """DENPEX_AGENT_URL (default: the agent's default address); 'off' disables the link."""
        url = os.environ.get("DENPEX_AGENT_URL", DEFAULT_AGENT_URL)
        return None if url.lower() in ("", "off", "none", "0") else cls(url)

    def _call(
        self, method: str, path: str, body: bytes | None = None, timeout_s: float | None = None
    ) -> bytes | None:
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            self.reason = f"agent at {self.url} answered {exc.code} to {method} {path}"
        except (OSError, ValueError) as exc:
            self.reason = f"no agent at {self.url} ({getattr(exc, 'reason', exc)})"
        return None

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
            self.reason = f"agent at {self.url} sent evidence denpex cannot read: {exc}"
            return []


def job_name(pid: int) -> str:
    """The job this run belongs to: the scheduler's id when there is one."""
    for variable in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID"):
        value = os.environ.get(variable)
        if value:
            step = os.environ.get("SLURM_STEP_ID")
            return f"{value}.{step}" if variable == "SLURM_JOB_ID" and step else value
    return f"run-{os.uname().nodename}-{pid}"
