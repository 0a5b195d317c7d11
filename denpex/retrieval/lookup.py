"""One call for a report: the retrieval block of a diagnosis, or None when retrieval is not
installed, turned off (DENPEX_RAG=off) or has nothing to say about a run that did not fail.

Never raises for a missing or broken model: a report must come out whole whatever happens
here. The past incidents come from a callable the caller gives (the control plane's API for
`denpex run`/`scan`, the store itself inside the server), so this module does no I/O of its
own beyond loading the model.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from denpex.retrieval.block import INCIDENT_K, RUNBOOK_K, RetrievalBlock, assemble, query_text
from denpex.retrieval.bm25 import Bm25Index
from denpex.retrieval.fusion import DEPTH, fuse
from denpex.retrieval.index import Hit, VectorIndex, query_vectors

if TYPE_CHECKING:
    from denpex.catalog import Catalog

log = logging.getLogger("denpex.retrieval.lookup")

# (query text, its vectors (one a line), how many) → hits; raises OSError when the source is down
IncidentSource = Callable[[str, Any, int], Sequence[Hit]]
OFF = frozenset({"0", "off", "no", "false"})
_INDEXES: dict[int, tuple[VectorIndex, Bm25Index]] = {}


def enabled() -> bool:
    """Whether a report should carry a retrieval block: the extra is installed and the
    environment does not turn it off. Says nothing about why not: silence is the contract."""
    if os.environ.get("DENPEX_RAG", "").strip().lower() in OFF:
        return False
    from denpex.retrieval.embedding import unavailable_reason

    return unavailable_reason() is None


def _indexes_for(catalog: Catalog) -> tuple[VectorIndex, Bm25Index]:
    from denpex.retrieval.embedding import shared_embedder
    from denpex.retrieval.runbook import runbook_index

    key = id(catalog)  # catalogs live as long as the process; one index each
    if key not in _INDEXES:
        vectors = runbook_index(catalog, shared_embedder())
        _INDEXES[key] = (vectors, Bm25Index(vectors.passages))
    return _INDEXES[key]


def prepare(catalog: Catalog) -> None:
    """Load the model and the runbook's index ahead of `retrieval_block` (a caller overlaps
    the ~0.3 s with its own work); never raises: retrieval_block reports what failed."""
    if not enabled():
        return
    try:
        _indexes_for(catalog)
    except Exception:  # a broken model: retrieval_block meets it again and says so
        log.debug("retrieval could not be prepared", exc_info=True)


def search_runbook(catalog: Catalog, query: str, vector: Any, k: int = RUNBOOK_K) -> list[Hit]:
    """The runbook entries nearest a query: the embedding ranking fused with BM25's (the
    fusion finds the cause's own entry most often: benchmarks/bench_retrieval.py)."""
    vectors, words = _indexes_for(catalog)
    return fuse([vectors.search(vector, DEPTH), words.search(query, DEPTH)], k)


def retrieval_block(
    diag: Mapping[str, Any],
    catalog: Catalog,
    *,
    incidents: IncidentSource | None = None,
) -> RetrievalBlock | None:
    if diag.get("status") != "failed" or not enabled():
        return None
    from denpex.retrieval.embedding import shared_embedder

    notes: list[str] = []
    try:
        query = query_text(diag)
        vector = query_vectors(shared_embedder(), query)
        runbook = search_runbook(catalog, query, vector)
    except Exception as exc:  # a broken model file or library: the report goes on without it
        return RetrievalBlock(evidence=[], notes=[f"retrieval failed: {exc}"[:200]])
    past: Sequence[Hit] = ()
    if incidents is not None:
        try:
            past = incidents(query, vector, INCIDENT_K)
        except OSError as exc:
            notes.append(f"past incidents unavailable: {exc}"[:200])
    return assemble(diag, runbook, past, notes)
