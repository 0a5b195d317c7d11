"""Similar past incidents and an incident's summary with its retrieval block, for the API.

The vectors live beside the incidents (table incident_vectors, one per incident and model);
an incident without one, or whose text changed, is embedded on first use and stored. The
search is numpy brute force over the tenant's latest incidents read per query: at the sizes
a tenant has (thousands) that is milliseconds, and benchmarks/bench_retrieval.py measures
where sqlite-vec would overtake it. Never changes an incident.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from denpex.control.timefmt import iso
from denpex.core import jsonio
from denpex.retrieval.index import Hit, VectorIndex
from denpex.retrieval.passages import incident_passage, text_key

if TYPE_CHECKING:
    from denpex.catalog import Catalog
    from denpex.control.store import TenantStore
    from denpex.retrieval.block import RetrievalBlock

SEARCHED = 5000  # the tenant's latest incidents searched, newest first


def resolution_text(incident: dict[str, Any]) -> str:
    """How it ended: `resolved by alice at 2026-11-02T10:00:00Z: reseated the GPU`."""
    status = incident.get("status")
    if status == "resolved":
        done = incident.get("resolved") or {}
        when = f" at {iso(done['ns'])}" if done.get("ns") else ""
        note = f": {done['note']}" if done.get("note") else ""
        return f"resolved by {done.get('by') or 'someone'}{when}{note}"
    if status == "acknowledged":
        by = (incident.get("acknowledged") or {}).get("by") or "someone"
        return f"acknowledged by {by}, not resolved yet"
    return "open, not resolved yet"


def similar_incidents(
    scoped: TenantStore,
    query: str,
    k: int,
    *,
    exclude: int | None = None,
    exclude_report: str | None = None,
    vector: Any = None,
) -> list[Hit]:
    """The `k` incidents nearest to `query` (a failure's own lines), best first; never
    incident `exclude` nor those opened from report `exclude_report`."""
    import numpy as np

    from denpex.retrieval.embedding import MODEL_ID, shared_embedder

    embedder = shared_embedder()
    rows = scoped.incident_vectors(MODEL_ID, SEARCHED, exclude_report=exclude_report)
    rows = [(inc, stored) for inc, stored in rows if inc["id"] != exclude]
    passages = [incident_passage(inc, resolution_text(inc)) for inc, _ in rows]
    vectors: list[Any] = [None] * len(rows)
    stale = []
    for i, ((_, stored), passage) in enumerate(zip(rows, passages, strict=True)):
        if stored is not None and stored[0] == text_key(passage.text):
            vectors[i] = np.frombuffer(stored[1], dtype="<f4")
        else:
            stale.append(i)
    if stale:
        fresh = embedder.encode([passages[i].text for i in stale])
        for i, row in zip(stale, fresh, strict=True):
            vectors[i] = row
        scoped.store_incident_vectors(
            MODEL_ID,
            [
                (int(rows[i][0]["id"]), text_key(passages[i].text), row.astype("<f4").tobytes())
                for i, row in zip(stale, fresh, strict=True)
            ],
        )
    if not rows:
        return []
    if vector is None:
        vector = embedder.encode([query])[0]
    return VectorIndex(passages, np.stack(vectors)).search(vector, k)


def incident_diagnosis(scoped: TenantStore, incident: dict[str, Any]) -> dict[str, Any]:
    """The diagnosis an incident was opened from (its first report's), or one made of the
    incident's own title and explanation when no report is linked."""
    for report_id in incident.get("reports") or []:
        try:
            report = scoped.report(report_id)
        except LookupError:
            continue
        diagnosis = report.get("diagnosis")
        if isinstance(diagnosis, str):
            diagnosis = jsonio.loads(diagnosis)
        if isinstance(diagnosis, dict):
            return diagnosis
    return {
        "status": "failed",
        "summary": f"{incident.get('title', '')}. {incident.get('explanation', '')}".strip(),
        "root_cause": {"category": incident.get("category"), "evidence": []},
        "timeline": [],
    }


def incident_block(
    scoped: TenantStore, incident: dict[str, Any], catalog: Catalog
) -> RetrievalBlock | None:
    """The retrieval block of an incident: its nearest runbook entries and the similar past
    incidents other than itself. None when retrieval is not installed on this server."""
    from denpex.retrieval.lookup import retrieval_block

    def others(query: str, vector: Any, k: int) -> list[Hit]:
        return similar_incidents(scoped, query, k, exclude=int(incident["id"]), vector=vector)

    return retrieval_block(incident_diagnosis(scoped, incident), catalog, incidents=others)
