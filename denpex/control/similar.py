"""Similar past incidents and an incident's summary with its retrieval block, for the API.

The vectors live beside the incidents (table incident_vectors, one per incident and model):
the leader's pass embeds the incidents it opened or grew, and every incident still without
a current vector when a server starts leading (`index_incidents`), so a restarted server
finds them without embedding anything again. The search runs inside PostgreSQL with pgvector
where migration 0011 found it (denpex.control.pgvector_search), else as numpy brute force
over the tenant's latest incidents read per query (an incident not indexed yet is embedded
then); both are exact and give the same answer. Never changes an incident.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from denpex.control import pgvector_search
from denpex.control.timefmt import iso
from denpex.core import jsonio
from denpex.retrieval.index import Hit, VectorIndex, query_vectors
from denpex.retrieval.normalise import normalise
from denpex.retrieval.passages import Passage, incident_passage, text_key

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


def _current(rows: list[tuple[dict[str, Any], Any]]) -> tuple[list[Passage], list[int]]:
    """The incidents' passages and the positions of those whose stored vector is missing or
    was made from another text."""
    passages = [incident_passage(inc, resolution_text(inc)) for inc, _ in rows]
    stale = [
        i
        for i, ((_, stored), passage) in enumerate(zip(rows, passages, strict=True))
        if stored is None or stored[0] != text_key(normalise(passage.text))
    ]
    return passages, stale


def _embed_and_store(
    scoped: TenantStore,
    rows: list[tuple[dict[str, Any], Any]],
    passages: list[Passage],
    stale: list[int],
) -> dict[int, Any]:
    """Embed the `stale` incidents, store their vectors; {position: vector}."""
    from denpex.retrieval.embedding import MODEL_ID, shared_embedder

    texts = [normalise(passages[i].text) for i in stale]
    fresh = shared_embedder().encode(texts)
    ids = [int(rows[i][0]["id"]) for i in stale]
    scoped.store_incident_vectors(
        MODEL_ID,
        [
            (incident_id, text_key(text), row.astype("<f4").tobytes())
            for incident_id, text, row in zip(ids, texts, fresh, strict=True)
        ],
    )
    if pgvector_search.available(scoped._db):
        pgvector_search.fill(scoped, MODEL_ID, list(zip(ids, fresh, strict=True)))
    return dict(zip(stale, fresh, strict=True))


def index_incidents(scoped: TenantStore) -> int:
    """Embed and store the vector of each of the tenant's latest incidents that has none or
    a stale one (and fill pgvector's column where it is still empty); how many were
    embedded. Nothing, and 0, when retrieval is not installed on this server."""
    from denpex.retrieval.lookup import enabled

    if not enabled():
        return 0
    import numpy as np

    from denpex.retrieval.embedding import MODEL_ID

    rows = scoped.incident_vectors(MODEL_ID, SEARCHED)
    passages, stale = _current(rows)
    if stale:
        _embed_and_store(scoped, rows, passages, stale)
    if pgvector_search.available(scoped._db):
        empty = pgvector_search.unfilled(scoped, MODEL_ID)
        vectors = [(i, np.frombuffer(b, dtype="<f4")) for i, b in empty]
        pgvector_search.fill(scoped, MODEL_ID, vectors)
    return len(stale)


def similar_incidents(
    scoped: TenantStore,
    query: str,
    k: int,
    *,
    exclude: int | None = None,
    exclude_report: str | None = None,
    vector: Any = None,
) -> list[Hit]:
    """The `k` incidents nearest to `query` (a failure's own lines; `vector`: their vectors
    when the caller has them), best first; never incident `exclude` nor those opened from
    report `exclude_report`."""
    import numpy as np

    from denpex.retrieval.embedding import MODEL_ID, shared_embedder

    if vector is None:
        vector = query_vectors(shared_embedder(), query)
    if pgvector_search.available(scoped._db):
        found = pgvector_search.nearest(
            scoped,
            MODEL_ID,
            np.asarray(vector, dtype=np.float32),
            k,
            searched=SEARCHED,
            exclude=exclude,
            exclude_report=exclude_report,
        )
        return [Hit(incident_passage(inc, resolution_text(inc)), score) for inc, score in found]
    rows = scoped.incident_vectors(MODEL_ID, SEARCHED, exclude_report=exclude_report)
    rows = [(inc, stored) for inc, stored in rows if inc["id"] != exclude]
    if not rows:
        return []
    passages, stale = _current(rows)
    fresh = _embed_and_store(scoped, rows, passages, stale) if stale else {}
    vectors = [
        fresh[i] if i in fresh else np.frombuffer(stored[1], dtype="<f4")
        for i, (_, stored) in enumerate(rows)
    ]
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
