"""Shipping a job's diagnosis to the control plane from `denpex run` / `denpex scan`, when
DENPEX_SERVER_URL (and DENPEX_TOKEN or DENPEX_TOKEN_FILE) is set.

Never delays the job's exit by more than its bound (DENPEX_SERVER_TIMEOUT, 2 s by default;
a refused connection returns at once): each report is first written to an outbox folder
(one file per report, written atomically), then POSTed; what cannot be delivered now stays
there and goes out with the next report shipped from this host. The server dedupes by the
report id, so a report sent twice is stored once.

Why not the agent's spool (denpex/agent/spool.py): it has one owner, locked with flock,
while every rank of a job may run its own `denpex run` on one node at the same moment; a
file per report needs no lock and gives the same at-least-once delivery.
It imports only the standard library (and denpex.core): `denpex run` stays fast.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denpex.control.paths import default_state_dir
from denpex.core import jsonio

DEFAULT_TIMEOUT_S = 2.0
MAX_PENDING = 1000  # reports kept undelivered at most; the oldest go first
MAX_AGE_S = 7 * 24 * 3600
SCHEDULER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "JOB_ID",
)
FACT_FIELDS = ("started_ns", "name", "gpus", "labels")  # what the run adds to its report
RETRYABLE = frozenset((408, 429, 500, 502, 503, 504))


@dataclass(frozen=True, slots=True)
class ShipResult:
    delivered: int  # reports the server accepted in this call (this one and older ones)
    pending: int  # still in the outbox
    message: str = ""


def default_outbox() -> Path:
    return default_state_dir() / "reports-outbox"


def job_fields(diagnosis: dict[str, Any], environ: dict[str, str] | None = None) -> dict:
    """Job id, user, hosts, ranks and scheduler ids of this run, from its environment and
    its diagnosis's timeline."""
    env = os.environ if environ is None else environ
    scheduler = {k.lower(): env[k] for k in SCHEDULER_VARIABLES if env.get(k)}
    job = env.get("DENPEX_JOB") or next(
        (env[k] for k in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID") if env.get(k)),
        None,
    )
    hosts = {socket.gethostname()}
    ranks = set()
    for entry in diagnosis.get("timeline") or []:
        if entry.get("host"):
            hosts.add(entry["host"])
        if isinstance(entry.get("rank"), int):
            ranks.add(entry["rank"])
    # a wrapper started per rank (RANK set by the launcher for it): its rank, even when the
    # rank printed nothing (a stopped rank's report is the only trace of it)
    if env.get("RANK", "").isdigit():
        ranks.add(int(env["RANK"]))
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return {
        "job": job,
        "user": user,
        "hosts": sorted(hosts),
        "ranks": sorted(ranks),
        "scheduler": scheduler,
    }


class ReportShipper:
    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        outbox: Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.outbox = outbox or default_outbox()
        self.timeout_s = timeout_s
        self.last_report_id: str | None = None  # this run's own, once shipped

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ReportShipper | None:
        """None unless DENPEX_SERVER_URL is set."""
        env = os.environ if environ is None else environ
        url = env.get("DENPEX_SERVER_URL")
        if not url:
            return None
        token = env.get("DENPEX_TOKEN")
        if not token and env.get("DENPEX_TOKEN_FILE"):
            try:
                token = Path(env["DENPEX_TOKEN_FILE"]).read_text().strip()
            except OSError:
                token = None
        try:
            timeout = float(env.get("DENPEX_SERVER_TIMEOUT") or DEFAULT_TIMEOUT_S)
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        outbox = Path(env["DENPEX_OUTBOX"]) if env.get("DENPEX_OUTBOX") else None
        return cls(url, token, outbox=outbox, timeout_s=timeout)

    def ship(self, diagnosis: dict[str, Any], facts: dict[str, Any] | None = None) -> ShipResult:
        """Queue this run's report, then deliver what the outbox holds within the bound.
        `facts` are the run's started_ns, name, gpus and labels (denpex.lite.run_facts)."""
        report = {
            "id": str(uuid.uuid4()),
            **job_fields(diagnosis),
            **{k: v for k, v in (facts or {}).items() if k in FACT_FIELDS},
            "diagnosis": diagnosis,
        }
        self.last_report_id = report["id"]
        report["ended_ns"] = time.time_ns()
        self._queue(report)
        return self.deliver()

    def deliver(self) -> ShipResult:
        """POST queued reports, oldest first, until the outbox is empty, the server fails,
        or the time bound is spent."""
        deadline = time.monotonic() + self.timeout_s
        delivered, message = 0, ""
        for path in self._pending():
            left = deadline - time.monotonic()
            if left <= 0.05:
                message = "time bound reached"
                break
            outcome, message = self._post(path, left)
            if outcome == "retry":
                break
            path.unlink(missing_ok=True)  # delivered, or refused for good (said in message)
            delivered += outcome == "ok"
        return ShipResult(delivered, len(self._pending()), message)

    def _queue(self, report: dict[str, Any]) -> None:
        self.outbox.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{report['id']}.json"
        tmp = self.outbox / f".{name}.tmp"
        tmp.write_bytes(jsonio.dumps(report))
        os.replace(tmp, self.outbox / name)
        pending = self._pending()
        for old in pending[: max(0, len(pending) - MAX_PENDING)]:
            old.unlink(missing_ok=True)

    def _pending(self) -> list[Path]:
        if not self.outbox.is_dir():
            return []
        cutoff = time.time() - MAX_AGE_S
        out = []
        for path in sorted(self.outbox.glob("*.json")):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
                    continue
            except OSError:
                continue
            out.append(path)
        return out

    def _post(self, path: Path, timeout_s: float) -> tuple[str, str]:
        try:
            body = path.read_bytes()
        except OSError as exc:
            return "retry", f"cannot read {path}: {exc}"
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + "/api/v1/reports", body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=max(0.05, timeout_s)) as reply:
                reply.read()
            return "ok", ""
        except urllib.error.HTTPError as err:
            if err.code in RETRYABLE:
                return "retry", f"server answered {err.code}"
            return "refused", f"server refused the report ({err.code}): {_detail(err)}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return "retry", f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}"


def _detail(err: urllib.error.HTTPError) -> str:
    try:
        return (err.read() or b"")[:200].decode(errors="replace")
    except OSError:
        return ""


def similar_incidents_source(shipper: ReportShipper | None) -> Any:
    """For a configured server: a function (query, vector, k) → the control plane's similar
    past incidents, for the retrieval block of `denpex run`/`scan` (never the incident this
    run's own report opened); None without a server. It raises OSError when the server is
    down or refuses (the block then says so)."""
    if shipper is None:
        return None
    import urllib.parse

    def search(query: str, vector: Any, k: int) -> list:
        from denpex.retrieval.index import Hit
        from denpex.retrieval.passages import Passage

        fields: dict[str, Any] = {"q": query[:8000], "k": k}
        if shipper.last_report_id:
            fields["exclude_report"] = shipper.last_report_id
        params = urllib.parse.urlencode(fields)
        headers = {"Authorization": f"Bearer {shipper.token}"} if shipper.token else {}
        request = urllib.request.Request(
            f"{shipper.url}/api/v1/incidents/similar?{params}", headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=shipper.timeout_s) as reply:
                items = jsonio.loads(reply.read())["items"]
            return [Hit(Passage.from_dict(item), float(item.get("score", 0.0))) for item in items]
        except urllib.error.HTTPError as err:
            raise OSError(f"{shipper.url} answered {err.code}: {_detail(err)}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise OSError(f"{shipper.url} sent an unreadable answer ({exc})") from None

    return search
