"""Payloads as denpex's own senders make them: evidence through the agent's OTLP encoder,
job reports around a real denpex.diagnosis/v1 document."""

from __future__ import annotations

import time
import uuid
from typing import Any

from denpex.agent.otlp import encode_logs, encode_metrics, serialise
from denpex.core.events import Event, Evidence, metric

T0 = 1_796_000_000_000_000_000  # 2026-11-30, inside any retention window the tests use


def evidence(
    n: int, *, host: str = "node1", job: str | None = None, prefix: str = "ev", ts: int = T0
) -> list[Evidence]:
    out = []
    for i in range(n):
        event = Event(
            body=f"NVRM: Xid (PCI:0000:3b:00): 79, pid={1000 + i}, GPU has fallen off the bus.",
            ts_ns=ts + i * 1_000_000,
            host=host,
            source="kmsg",
            job=job,
            rank=i % 8,
            pid=1000 + i,
            attrs={"attribution": "host", "pci": "0000:3b:00"},
        )
        out.append(
            Evidence(
                id=f"{prefix}-{host}-{i}",
                event=event,
                signature="gpu.fallen_off_bus.xid79",
                category="gpu.fallen_off_bus",
                severity="critical",
                captures={"pci": "0000:3b:00"},
                summary="GPU 0000:3b:00 fell off the bus (Xid 79)",
                action="drain_node",
            )
        )
    return out


def logs_body(items: list[Evidence], protocol: str = "http/protobuf") -> bytes:
    return serialise(encode_logs(items, observed_ns=time.time_ns()), protocol)


def metrics_body(host: str = "node1", value: float = 0.25) -> bytes:
    events = [
        metric(
            "psi_some_avg10_ratio",
            value,
            source="psi",
            labels={"resource": "cpu"},
            host=host,
            ts_ns=T0,
        )
    ]
    return serialise(encode_metrics(events, now_ns=T0), "http/protobuf")


def diagnosis(
    *, status: str = "failed", category: str = "gpu.fallen_off_bus", host: str = "node1"
) -> dict[str, Any]:
    return {
        "schema": "denpex.diagnosis/v1",
        "status": status,
        "exit": {"code": 1, "signal": None},
        "root_cause": {
            "category": category if status == "failed" else "unknown",
            "signature": "gpu.fallen_off_bus.xid79" if status == "failed" else None,
            "confidence": 0.93 if status == "failed" else 0.0,
            "host": host if status == "failed" else None,
            "rank": 3 if status == "failed" else None,
            "evidence": ["e2"] if status == "failed" else [],
            "explanation": "GPU fell off the bus",
            "rule": "hardware_before_software",
            "title": "GPU fell off the bus",
        },
        "contributing": [
            {
                "category": "nccl.timeout",
                "signature": "nccl.timeout.watchdog",
                "role": "symptom",
                "evidence": ["e1"],
            }
        ]
        if status == "failed"
        else [],
        "timeline": [
            {
                "id": "e1",
                "ts": "2026-11-30T04:56:09.123Z",
                "host": "node0",
                "rank": 0,
                "source": "log",
                "signature": "nccl.timeout.watchdog",
                "category": "nccl.timeout",
                "line": "Watchdog caught collective operation timeout",
                "role": "symptom",
                "severity": "error",
            },
            {
                "id": "e2",
                "ts": "2026-11-30T04:56:01.000Z",
                "host": host,
                "rank": 3,
                "source": "kmsg",
                "signature": "gpu.fallen_off_bus.xid79",
                "category": "gpu.fallen_off_bus",
                "line": "NVRM: Xid (PCI:0000:3b:00): 79",
                "role": "cause",
                "severity": "critical",
            },
        ]
        if status == "failed"
        else [],
        "summary": "GPU 0000:3b:00 on node1 fell off the bus; the NCCL timeout is a symptom.",
        "actions": [],
        "stats": {"bytes": 0, "lines": 0, "matches": 0, "dropped_analysis_bytes": 0},
        "notes": [],
    }


def report(
    *,
    job: str = "job-1",
    user: str = "alice",
    status: str = "failed",
    host: str = "node1",
    category: str = "gpu.fallen_off_bus",
    report_id: str | None = None,
    ended_ns: int = T0 + 10_000_000_000,
    timeline: bool = True,
) -> dict[str, Any]:
    body = diagnosis(status=status, category=category, host=host)
    if not timeline:
        body["timeline"] = []
    return {
        "id": report_id or str(uuid.uuid4()),
        "job": job,
        "user": user,
        "hosts": ["node0", host],
        "ranks": [0, 1, 2, 3],
        "scheduler": {"slurm_job_id": "4242"},
        "ended_ns": ended_ns,
        "diagnosis": body,
    }
