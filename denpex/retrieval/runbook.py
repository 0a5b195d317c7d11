"""The runbook index a diagnosis is looked up in: the catalog's entries (live, so site-local
signatures count), the shipped doc sections and a site's runbook folders.

Builds the index only; what is shown of it is the retrieval block's job (block.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from denpex.retrieval.index import VectorIndex, VectorStore, shipped_passages
from denpex.retrieval.normalise import normalise_ahead
from denpex.retrieval.passages import Passage, catalog_passages, folder_passages, site_runbook_dirs

if TYPE_CHECKING:
    from denpex.catalog import Catalog
    from denpex.retrieval.embedding import Embedder

_SHIPPED: VectorStore | None = None


def shipped_store() -> VectorStore:
    """One store of shipped vectors per process (it also keeps what was embedded since)."""
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = VectorStore.shipped()
    return _SHIPPED


def runbook_passages(
    catalog: Catalog, *, docs: Path | None = None, site_dirs: Iterable[Path] | None = None
) -> list[Passage]:
    """Every runbook passage: catalog entries, doc sections (`docs` folder when given, else
    the shipped ones) and the site folders (default: DENPEX_RUNBOOKS)."""
    from denpex.core.taxonomy import load_taxonomy

    passages = catalog_passages(catalog, load_taxonomy())
    if docs is not None:
        passages += folder_passages(docs, "doc", "doc")
    else:
        passages += shipped_passages()
    for folder in site_runbook_dirs() if site_dirs is None else site_dirs:
        passages += folder_passages(Path(folder), "site", "site")
    return passages


def runbook_index(
    catalog: Catalog,
    embedder: Embedder,
    *,
    docs: Path | None = None,
    site_dirs: Iterable[Path] | None = None,
    store: VectorStore | None = None,
) -> VectorIndex:
    passages = runbook_passages(catalog, docs=docs, site_dirs=site_dirs)
    normalise_ahead([t for p in passages for t in (p.title, *p.texts)])  # for BM25 too
    vectors = (store or shipped_store()).vectors_for(passages, embedder)
    return VectorIndex(passages, vectors)
