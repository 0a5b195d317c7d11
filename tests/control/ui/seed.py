"""A small fleet for the web UI's tests and screenshots, sent to a running `denpex server`
through its real ingest API (job reports and OTLP/HTTP logs, as `denpex run` and the agent
send them), then read back until the leader has correlated it.

Tenant `acme`: 24 hosts in one training cluster, three failed jobs (a GPU off the bus
with NCCL timeouts on the other ranks, an InfiniBand error, a CUDA OOM), one clean job and
kernel evidence from an agent. Tenant `globex`: one failed job (another tenant's incident).
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from tests.control.helpers import T0, logs_body

HOSTS = [f"gpu-a{n:02d}" for n in range(1, 25)]
S = 1_000_000_000


def _ts(offset_s: float) -> str:
    ns = T0 + int(offset_s * S)
    whole, frac = divmod(ns, S)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{frac // 1000:06d}Z"


def _entry(
    eid: str, at: float, host: str, rank: int | None, source: str, category: str, signature: str,
    role: str, line: str, *, file: str | None = None, lineno: int | None = None,
    severity: str = "error",
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, Any] = {
        "id": eid, "ts": _ts(at), "host": host, "rank": rank, "source": source,
        "category": category, "signature": signature, "role": role, "line": line,
        "severity": severity,
    }  # fmt: skip
    if file:
        out["file"], out["lineno"] = file, lineno
    return out


def _diagnosis(root: dict[str, Any], timeline: list[dict[str, Any]], summary: str,
               actions: list[dict[str, Any]], contributing: list[dict[str, Any]]) -> dict:  # fmt: skip
    return {
        "schema": "denpex.diagnosis/v1",
        "status": "failed",
        "exit": {"code": 1, "signal": None},
        "root_cause": root,
        "contributing": contributing,
        "timeline": timeline,
        "summary": summary,
        "actions": actions,
        "stats": {"bytes": 18_204_113, "lines": 140_233, "matches": len(timeline)},
        "notes": [],
    }


def gpu_job() -> dict[str, Any]:
    hosts = HOSTS[:8]
    timeline = [
        _entry("e1", 0.0, "gpu-a07", 3, "kmsg", "gpu.fallen_off_bus", "gpu.fallen_off_bus.xid79",
               "cause", "NVRM: Xid (PCI:0000:3b:00): 79, pid=41822, GPU has fallen off the bus.",
               file="/var/log/kern.log", lineno=88412, severity="critical"),
        _entry("e2", 2.5, "gpu-a07", 3, "log", "cuda.launch_failure", "cuda.launch_failure.unspecified",
               "symptom", "RuntimeError: CUDA error: unspecified launch failure",
               file="logs/rank3.log", lineno=20931),
    ]  # fmt: skip
    for n, host in enumerate(hosts[:4]):
        timeline.append(
            _entry(f"e{3 + n}", 600.0 + n * 0.2, host, n * 8, "log", "nccl.timeout",
                   "nccl.timeout.watchdog", "symptom",
                   f"[rank{n * 8}]:[E ProcessGroupNCCL.cpp:616] [Rank {n * 8}] Watchdog caught "
                   "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for "
                   "600014 milliseconds before timing out.",
                   file=f"logs/rank{n * 8}.log", lineno=20950 + n)
        )  # fmt: skip
    root = {
        "category": "gpu.fallen_off_bus",
        "signature": "gpu.fallen_off_bus.xid79",
        "confidence": 0.94,
        "host": "gpu-a07",
        "rank": 3,
        "evidence": ["e1"],
        "rule": "hardware_before_software",
        "title": "GPU 0000:3b:00 on gpu-a07 fell off the bus",
        "explanation": "Xid 79 on gpu-a07 came before every rank's failure; the NCCL watchdog "
        "timeouts on the other ranks are its symptoms.",
    }
    actions = [
        {"action": "drain_node", "target": "gpu-a07", "reason": "GPU lost (Xid 79): take the "
         "node out of scheduling and run field diagnostics"},
        {"action": "retry_job", "target": "train-llama-70b", "reason": "restart on "
         "healthy nodes from the last checkpoint"},
    ]  # fmt: skip
    contributing = [
        {"category": "nccl.timeout", "signature": "nccl.timeout.watchdog", "role": "symptom",
         "evidence": ["e3", "e4", "e5", "e6"], "count": 4},
    ]  # fmt: skip
    summary = (
        "GPU 0000:3b:00 on gpu-a07 fell off the bus (Xid 79) at rank 3; the collective "
        "watchdog timeouts on ranks 0, 8, 16 and 24 followed ten minutes later."
    )
    return _report("r-llama-0142", "train-llama-70b", "alice", hosts, 160.0,
                   _diagnosis(root, timeline, summary, actions, contributing))  # fmt: skip


def ib_job() -> dict[str, Any]:
    hosts = HOSTS[10:14]
    timeline = [
        _entry("e1", 1000.0, "gpu-a12", 5, "log", "net.ib_error", "net.ib_error.retry_exceeded",
               "cause", "NET/IB : Got completion from peer 10.0.3.12 with status=12 "
               "(IBV_WC_RETRY_EXC_ERR) opcode=0", file="logs/rank5.log", lineno=7712),
        _entry("e2", 1001.0, "gpu-a11", 1, "log", "nccl.system_error", "nccl.system_error.remote",
               "symptom", "NCCL WARN Call to ibv_poll_cq failed: remote process exited",
               file="logs/rank1.log", lineno=7790),
    ]  # fmt: skip
    root = {
        "category": "net.ib_error", "signature": "net.ib_error.retry_exceeded",
        "confidence": 0.81, "host": "gpu-a12", "rank": 5, "evidence": ["e1"],
        "rule": "fabric_before_collective", "title": "InfiniBand retry exceeded on gpu-a12",
        "explanation": "The HCA on gpu-a12 gave up retransmitting to its peer; NCCL failed on "
        "the ranks that talked to it.",
    }  # fmt: skip
    actions = [{"action": "check_fabric", "target": "gpu-a12/mlx5_1", "reason": "look at the "
                "port's symbol and link-down counters before the next run"}]  # fmt: skip
    return _report("r-bert-0031", "bert-finetune", "bob", hosts, 1100.0,
                   _diagnosis(root, timeline, "InfiniBand retry exceeded on gpu-a12.", actions, []))  # fmt: skip


def oom_job() -> dict[str, Any]:
    timeline = [
        _entry("e1", 2000.0, "gpu-a03", 0, "log", "cuda.oom", "cuda.oom.torch", "cause",
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
               file="logs/rank0.log", lineno=3301),
    ]  # fmt: skip
    root = {
        "category": "cuda.oom", "signature": "cuda.oom.torch", "confidence": 0.97,
        "host": "gpu-a03", "rank": 0, "evidence": ["e1"], "rule": "single_cause",
        "title": "CUDA out of memory on rank 0", "explanation": "The job asked for more GPU "
        "memory than was free.",
    }  # fmt: skip
    actions = [{"action": "reduce_memory", "target": "resnet-sweep", "reason": "lower the batch "
                "size or enable activation checkpointing"}]  # fmt: skip
    return _report("r-resnet-0007", "resnet-sweep", "alice", ["gpu-a03"], 2010.0,
                   _diagnosis(root, timeline, "CUDA out of memory on rank 0.", actions, []))  # fmt: skip


def ok_job() -> dict[str, Any]:
    body = {
        "schema": "denpex.diagnosis/v1", "status": "ok", "exit": {"code": 0, "signal": None},
        "root_cause": {"category": "unknown", "confidence": 0.0, "evidence": []},
        "timeline": [], "summary": "The job finished.", "actions": [],
    }  # fmt: skip
    return _report("r-eval-0100", "eval-7b", "carol", HOSTS[16:24], 3000.0, body)


def globex_job() -> dict[str, Any]:
    report = gpu_job()
    report["id"], report["job"], report["user"] = "r-globex-1", "globex-train", "mallory"
    report["hosts"] = ["gx-01", "gx-02"]
    for entry in report["diagnosis"]["timeline"]:
        entry["host"] = "gx-01"
    report["diagnosis"]["root_cause"]["title"] = "globex GPU fell off the bus"
    return report


def _report(rid: str, job: str, user: str, hosts: list[str], end_s: float, diag: dict) -> dict:
    return {
        "id": rid, "job": job, "user": user, "hosts": hosts,
        "ranks": list(range(len(hosts) * 8)), "scheduler": {"slurm_job_id": rid[-4:]},
        "ended_ns": T0 + int(end_s * S), "diagnosis": diag,
    }  # fmt: skip


@dataclass(frozen=True)
class Seeded:
    base: str
    acme_token: str  # operator
    acme_viewer: str
    globex_token: str
    incidents: dict[str, int]  # job → incident id (acme), plus "globex"


def _post(base: str, path: str, token: str, body: bytes, content_type: str) -> Any:
    request = urllib.request.Request(
        base + path,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read() or b"{}")


def _get(base: str, path: str, token: str) -> Any:
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def seed(base: str, tokens: dict[str, str], timeout_s: float = 30.0) -> Seeded:
    """Send the fleet to the server at `base` (tokens: acme operator/viewer, globex operator)
    and wait until every failed job has its incident."""
    acme, globex = tokens["acme"], tokens["globex"]
    from tests.control.helpers import evidence

    kernel = evidence(2, host="gpu-a07", prefix="agent-kmsg", ts=T0 - 30 * S)
    _post(base, "/v1/logs", acme, logs_body(kernel), "application/x-protobuf")
    for report in (gpu_job(), ib_job(), oom_job(), ok_job()):
        _post(base, "/api/v1/reports", acme, json.dumps(report).encode(), "application/json")
    _post(base, "/api/v1/reports", globex, json.dumps(globex_job()).encode(), "application/json")
    deadline = time.monotonic() + timeout_s
    found: dict[str, int] = {}
    while time.monotonic() < deadline:
        found = {}
        for token, key in ((acme, None), (globex, "globex")):
            for item in _get(base, "/api/v1/incidents", token)["items"]:
                detail = _get(base, f"/api/v1/incidents/{item['id']}", token)
                for job in detail["jobs"]:
                    found[key or job] = item["id"]
        if len(found) == 4:
            return Seeded(base, acme, tokens["acme_viewer"], globex, found)
        time.sleep(0.2)
    raise AssertionError(f"the leader did not correlate the seeded fleet in time: {found}")
