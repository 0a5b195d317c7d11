"""Sample diagnosis dicts (denpex.diagnosis/v1), built by hand, for the report tests.

Every call returns fresh dicts, so a test may change what it gets without touching others.
"""

from __future__ import annotations

from typing import Any

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
    "capacity of 79.10 GiB of which 1.21 GiB is free."
)
WATCHDOG = (
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=18344, "
    "OpType=ALLREDUCE) ran for 600012 milliseconds before timing out."
)
ELASTIC = "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1)"


def entry(
    eid: str, clock: str | None, host: str | None, rank: int | None, role: str, cat: str, line: str
) -> dict[str, Any]:
    """One timeline entry on 2026-03-01 (UTC) at `clock`, or without a time when it is None."""
    ts = f"2026-03-01T{clock}Z" if clock else None
    return {
        "id": eid,
        "ts": ts,
        "host": host,
        "rank": rank,
        "source": "log",
        "role": role,
        "signature": f"{cat}.sig",
        "category": cat,
        "line": line,
        "severity": "error",
    }


def watchdog_symptom() -> dict[str, Any]:
    """The NCCL watchdog timeouts on node1 (evidence e12, e13), seen 7 times."""
    return {
        "category": "nccl.timeout",
        "signature": "nccl.timeout.watchdog",
        "role": "symptom",
        "evidence": ["e12", "e13"],
        "host": "node1",
        "rank": 0,
        "count": 7,
    }


def oom_cascade(**fields: Any) -> dict[str, Any]:
    """A failed run whose root cause is an OOM on rank 3 of node2 (evidence e7).

    `fields` replace top-level keys; each report's tests pass their own timeline and summary.
    """
    diag: dict[str, Any] = {
        "schema": "denpex.diagnosis/v1",
        "status": "failed",
        "exit": {"code": 1, "signal": None},
        "root_cause": {
            "category": "cuda.oom",
            "signature": "cuda.oom.torch_out_of_memory",
            "confidence": 0.91,
            "host": "node2",
            "rank": 3,
            "evidence": ["e7"],
            "explanation": "The GPU ran out of memory.",
            "rule": "first_failing_rank",
            "title": "CUDA out of memory on rank 3 (node2): tried to allocate 2.00 GiB",
        },
        "contributing": [watchdog_symptom()],
        "timeline": [],
        "summary": "",
        "actions": [
            {
                "action": "reduce_memory",
                "target": "node2",
                "reason": "lower the micro-batch size or enable activation checkpointing",
            },
        ],
        "stats": {"bytes": 1_234_567, "lines": 18_250, "matches": 37, "dropped_analysis_bytes": 0},
        "notes": [],
    }
    diag.update(fields)
    return diag


def no_cause(**extra: Any) -> dict[str, Any]:
    """A root cause that names nothing, with `extra` keys added."""
    return {
        "category": "unknown",
        "signature": None,
        "confidence": 0.0,
        "host": None,
        "rank": None,
        "evidence": [],
        "explanation": "",
        **extra,
    }


def finished_ok(
    summary: str, observed: int = 0, timeline: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A run that finished OK; `observed` loss spikes (evidence e1) were seen when above 0."""
    contributing = (
        [
            {
                "category": "train.loss_spike",
                "signature": "train.loss_spike.x",
                "role": "observed",
                "evidence": ["e1"],
                "count": observed,
            },
        ]
        if observed
        else []
    )
    return oom_cascade(
        status="ok",
        exit={"code": 0, "signal": None},
        root_cause=no_cause(),
        contributing=contributing,
        timeline=timeline or [],
        actions=[],
        summary=summary,
    )


def unknown_run(**root_cause_extra: Any) -> dict[str, Any]:
    """A run killed by SIGKILL (exit 137) with no known signature and no evidence."""
    return oom_cascade(
        exit={"code": 137, "signal": "SIGKILL"},
        root_cause=no_cause(**root_cause_extra),
        contributing=[],
        timeline=[],
        actions=[],
        summary="",
    )
