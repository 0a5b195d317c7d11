"""Passages, the vector index, the shipped vectors and the BM25 baseline."""

from __future__ import annotations

import numpy as np
import pytest

from denpex.catalog import load_catalog
from denpex.retrieval.bm25 import Bm25Index, query_terms
from denpex.retrieval.embedding import shared_embedder
from denpex.retrieval.index import Hit, VectorIndex, VectorStore, shipped_passages
from denpex.retrieval.normalise import normalise
from denpex.retrieval.passages import (
    Passage,
    catalog_passages,
    chunk_markdown,
    folder_passages,
    site_runbook_dirs,
    text_key,
)
from denpex.retrieval.runbook import runbook_index, runbook_passages


def _unit(*values: float) -> np.ndarray:
    v = np.array(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def test_every_catalog_entry_is_a_passage_with_its_examples():
    catalog = load_catalog()
    passages = {p.id: p for p in catalog_passages(catalog)}
    assert set(passages) == {f"runbook:{i}" for i in catalog.explanations()}
    sig = catalog.signatures[0]
    entry = passages[f"runbook:{sig.id}"]
    assert sig.explain in entry.text and entry.category == sig.category
    assert entry.probes == tuple(t.strip() for t in sig.examples_match[:2])
    assert "{" not in entry.title  # summary placeholders are taken out


def test_markdown_is_cut_at_headings_then_paragraphs():
    text = (
        "# Top\nintro\n\n## A\n" + ("word " * 50 + "\n\n") * 6 + "## B\n```\n# not a heading\n```\n"
    )
    pieces = chunk_markdown(text, limit=400)
    assert pieces[0] == ("Top", "intro")
    assert {h for h, _ in pieces} == {"Top", "A", "B"}
    assert all(len(body) <= 400 for _, body in pieces)
    assert pieces[-1] == ("B", "```\n# not a heading\n```")


def test_site_runbooks_come_from_the_folders_named(tmp_path, monkeypatch):
    (tmp_path / "gpu.md").write_text("# Xid 79\nReseat the GPU, then call the vendor.\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    monkeypatch.setenv("DENPEX_RUNBOOKS", f"{tmp_path}:{tmp_path / 'absent'}")
    assert site_runbook_dirs() == [tmp_path]
    (site,) = folder_passages(tmp_path, "site", "site")
    assert site.id == "site:gpu.md#1" and "Reseat the GPU" in site.text
    ids = {p.id for p in runbook_passages(load_catalog())}
    assert "site:gpu.md#1" in ids and any(i.startswith("doc:DESIGN.md#") for i in ids)


def test_a_passage_scores_by_its_best_row_and_ties_keep_their_order():
    passages = [
        Passage("a", "signature", "a", "text a", probes=("probe a",)),
        Passage("b", "doc", "b", "text b"),
        Passage("c", "doc", "c", "text c"),
    ]
    vectors = np.stack([_unit(1, 0, 0), _unit(0, 1, 0), _unit(0, 0, 1), _unit(0, 0, 1)])
    index = VectorIndex(passages, vectors)
    hits = index.search(_unit(0, 1, 0), k=2)
    assert [h.passage.id for h in hits] == ["a", "b"]  # a through its probe
    assert hits[0].score == pytest.approx(1.0)
    tied = index.search(_unit(0, 0, 1), k=2)
    assert [h.passage.id for h in tied] == ["b", "c"]
    assert [h.passage.id for h in index.search(_unit(0, 1, 0), 3, kinds=frozenset({"doc"}))] == [
        "b",
        "c",
    ]
    with pytest.raises(ValueError, match="4 texts"):
        VectorIndex(passages, vectors[:3])


def test_the_shipped_vectors_cover_the_shipped_runbook():
    """Built by `python -m denpex.retrieval.build_index`; entries edited since are embedded
    at run time, which is correct but slow: keep the file nearly current."""
    store = VectorStore.shipped()
    passages = runbook_passages(load_catalog(), site_dirs=[])
    keys = [text_key(normalise(t)) for p in passages for t in p.texts]  # what it is keyed by
    stale = sum(k not in store.vectors for k in keys)
    assert shipped_passages(), "no doc passages shipped"
    assert stale <= 0.1 * len(keys), f"{stale} stale: run python -m denpex.retrieval.build_index"


def test_a_changed_entry_is_embedded_again_not_answered_stale():
    store = VectorStore.shipped()
    fresh = Passage("x", "site", "x", "The GPU fell off the PCIe bus: reseat it (Xid 79).")
    stale_free = store.vectors_for([fresh], shared_embedder())
    assert store.computed == 1 and stale_free.shape == (1, 384)
    store.vectors_for([fresh], shared_embedder())
    assert store.computed == 1  # kept for the rest of the process


def test_the_runbook_index_finds_the_entry_of_a_log_line():
    catalog = load_catalog()
    index = runbook_index(catalog, shared_embedder(), site_dirs=[])
    query = shared_embedder().encode(
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 79.15 GiB of which 1.02 GiB is free."
        ]
    )[0]
    hits = index.search(query, 3)
    assert "cuda.oom" in {h.passage.category for h in hits}, [h.passage.id for h in hits]


def test_bm25_quotes_every_word_and_ranks_lexically():
    assert query_terms('say "AND" OR NOT x 4096 NEAR') == [
        '"say"',
        '"and"',
        '"or"',
        '"not"',
        '"4096"',
        '"near"',
    ]
    passages = [
        Passage("p1", "doc", "disk", "No space left on device while writing"),
        Passage("p2", "doc", "gpu", "GPU has fallen off the bus"),
    ]
    bm25 = Bm25Index(passages)
    assert [h.passage.id for h in bm25.search("OSError: [Errno 28] No space left on device")] == [
        "p1"
    ]
    assert bm25.search("!!! ---") == []


def test_fusion_rewards_agreement_and_keeps_the_first_score():
    from denpex.retrieval.fusion import fuse

    a, b, c = (Passage(i, "doc", i, i) for i in "abc")
    vec = [Hit(a, 0.9), Hit(b, 0.8), Hit(c, 0.7)]
    words = [Hit(c, 12.0), Hit(b, 11.0)]
    fused = fuse([vec, words], 2)
    # both rankings have b and c; c's ranks (3 + 1) sum higher than b's (2 + 2) under RRF
    assert [h.passage.id for h in fused] == ["c", "b"]
    assert fused[0].score == 0.7  # the embedding's cosine, not BM25's score
    assert [h.passage.id for h in fuse([vec, []], 3)] == ["a", "b", "c"]


def test_bm25_answers_from_any_thread():
    import threading

    bm25 = Bm25Index([Passage("p1", "doc", "disk", "No space left on device")])
    got: list = []
    worker = threading.Thread(target=lambda: got.extend(bm25.search("space left")))
    worker.start()
    worker.join()
    assert [h.passage.id for h in got] == ["p1"]
