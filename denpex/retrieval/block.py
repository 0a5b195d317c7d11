"""The retrieval block printed under a diagnosis: "similar past incidents" (with how they were
resolved) and "runbook", each line citing its passage id and the evidence ids it was found for.

Reads a `denpex.diagnosis/v1` dict and never changes it: the deterministic summary stays first
and whole, and nothing here can alter the root cause.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from denpex.retrieval.index import Hit

RUNBOOK_K = 3
INCIDENT_K = 3
QUERY_LINES = 3  # the cause's first lines: a traceback's last line usually says it all
SNIPPET = 220
MIN_INCIDENT_SCORE = 0.35  # below it a "similar" incident is not similar: leave it out


def _rows(diag: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for r in diag.get("timeline") or [] if isinstance(r, dict)]


def query_evidence(diag: Mapping[str, Any]) -> list[str]:
    """The evidence ids the query is made of: the root cause's own (or, with no root, the
    first failure lines of the timeline)."""
    root = diag.get("root_cause") or {}
    ids = [str(i) for i in root.get("evidence") or []]
    if not ids:
        ids = [str(r["id"]) for r in _rows(diag) if r.get("severity") in ("error", "critical")]
    return ids[:QUERY_LINES]


def query_lines(diag: Mapping[str, Any]) -> list[str]:
    """The failure as the log tells it: the distinct raw lines of the cause's evidence, in the
    order the diagnosis cites them (its own signature's line first)."""
    by_id = {str(r.get("id")): str(r.get("line") or "").strip() for r in _rows(diag)}
    lines = (by_id.get(i, "") for i in query_evidence(diag))
    return list(dict.fromkeys(line for line in lines if line))


def query_text(diag: Mapping[str, Any]) -> str:
    """The query both rankers search with: the cause's lines, one a line; the summary when
    there are none (a failure no signature matched)."""
    return "\n".join(query_lines(diag)) or str(diag.get("summary") or "")


def _snippet(text: str, limit: int = SNIPPET) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


@dataclass
class RetrievalBlock:
    """What retrieval found for one diagnosis, ready to print or to send as JSON."""

    evidence: list[str]
    runbook: list[Hit] = field(default_factory=list)
    incidents: list[Hit] = field(default_factory=list)
    own_entry: str | None = None  # the root cause's own runbook id, marked when listed
    notes: list[str] = field(default_factory=list)

    def citations(self) -> set[str]:
        """Every id a rewrite of this block must keep: passages and evidence."""
        return {h.passage.id for h in self.runbook + self.incidents} | set(self.evidence)

    def to_dict(self) -> dict[str, Any]:
        def hit(h: Hit) -> dict[str, Any]:
            return {**h.passage.to_dict(), "score": round(h.score, 4)}

        return {
            "evidence": list(self.evidence),
            "runbook": [hit(h) for h in self.runbook],
            "incidents": [hit(h) for h in self.incidents],
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """Plain lines (no colour, no wrapping): headings flush left, entries indented."""
        cited = ", ".join(self.evidence)
        about = f" (for evidence {cited})" if cited else ""
        out: list[str] = []
        if self.incidents:
            out.append(f"similar past incidents{about}")
            for h in self.incidents:
                p = h.passage
                how = p.resolution or "not resolved yet"
                out.append(f"  [{p.id}] {p.category} — {_snippet(p.title, 120)} ({how})")
        if self.runbook:
            out.append(f"runbook{about}")
            for h in self.runbook:
                p = h.passage
                mark = " (this cause)" if p.id == self.own_entry else ""
                out.append(f"  [{p.id}]{mark} {_snippet(p.text)}")
        out.extend(f"note: {n}" for n in self.notes)
        return out


def own_entry(diag: Mapping[str, Any]) -> str | None:
    signature = (diag.get("root_cause") or {}).get("signature")
    return f"runbook:{signature}" if signature else None


def assemble(
    diag: Mapping[str, Any],
    runbook: Sequence[Hit],
    incidents: Sequence[Hit] = (),
    notes: Sequence[str] = (),
) -> RetrievalBlock:
    return RetrievalBlock(
        evidence=query_evidence(diag),
        runbook=list(runbook)[:RUNBOOK_K],
        incidents=[h for h in incidents if h.score >= MIN_INCIDENT_SCORE][:INCIDENT_K],
        own_entry=own_entry(diag),
        notes=list(notes),
    )
