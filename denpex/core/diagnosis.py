"""The Diagnosis record and its JSON contract `denpex.diagnosis/v1` (DESIGN §4).

Tools and external evaluations parse this JSON: never remove or rename a field; add freely.
The JSON Schema lives beside this module in schemas/diagnosis.v1.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_ID = "denpex.diagnosis/v1"


@dataclass(slots=True)
class RootCause:
    category: str = "unknown"
    signature: str | None = None
    confidence: float = 0.0
    host: str | None = None
    rank: int | None = None
    evidence: list[str] = field(default_factory=list)
    explanation: str = ""
    rule: str = "no_evidence"
    title: str = ""
    attribution: str | None = None  # "host": host context, not tied to this job; else None
    frame: str | None = None  # innermost frame of the cause's traceback, `data.py:17 in collate`


@dataclass(slots=True)
class Contributing:
    category: str
    signature: str
    role: str  # "symptom" | "related" | "observed" | "context" | "finding"
    evidence: list[str]
    host: str | None = None
    rank: int | None = None
    count: int = 1


@dataclass(slots=True)
class TimelineEntry:
    id: str
    ts: str | None
    host: str | None
    rank: int | None
    source: str
    signature: str
    category: str
    line: str
    role: str  # "cause" | "symptom" | "related" | "observed" | "context" | "finding"
    severity: str = "error"
    attribution: str | None = None  # host records: "job" or "host" (contract 3)
    file: str | None = None  # the input the line came from (a file name, stdout, kmsg)
    lineno: int | None = None  # its line number there, from 1
    frame: str | None = None  # for a traceback: its innermost frame


@dataclass(slots=True)
class Action:
    action: str
    target: str | None
    reason: str


@dataclass(slots=True)
class Diagnosis:
    status: str = "ok"  # "failed" | "ok"
    exit_code: int | None = None
    exit_signal: str | None = None
    root_cause: RootCause = field(default_factory=RootCause)
    findings: list[RootCause] = field(default_factory=list)  # independent failures, not merged
    contributing: list[Contributing] = field(default_factory=list)
    timeline: list[TimelineEntry] = field(default_factory=list)
    summary: str = ""
    actions: list[Action] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # checks that stopped running during the run: {check, since_step, reason, host, rank}
    coverage_lost: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        stats = {"bytes": 0, "lines": 0, "matches": 0, "dropped_analysis_bytes": 0}
        stats.update(self.stats)
        return {
            "schema": SCHEMA_ID,
            "status": self.status,
            "exit": {"code": self.exit_code, "signal": self.exit_signal},
            "root_cause": asdict(self.root_cause),
            "findings": [asdict(f) for f in self.findings],
            "contributing": [asdict(c) for c in self.contributing],
            "timeline": [asdict(t) for t in self.timeline],
            "summary": self.summary,
            "actions": [asdict(a) for a in self.actions],
            "stats": stats,
            "notes": list(self.notes),
            "coverage_lost": [dict(c) for c in self.coverage_lost],
        }


# The remediation vocabulary (DESIGN §7): every signature's `action` and every diagnosis
# action is one of these.
ACTIONS = (
    "none",
    "retry_job",
    "fix_code",
    "fix_config",
    "reduce_memory",
    "check_data",
    "drain_node",
    "reset_gpu",
    "run_diagnostics",
    "check_fabric",
    "rma",
)
