"""Reciprocal rank fusion: one ranking from the embedding index's and BM25's.

The two fail on different queries (BM25 on paraphrases, embeddings on rare exact tokens such
as an Xid number or an errno), so the fused top entries beat either alone on the labelled
corpus (benchmarks/bench_retrieval.py prints all three). Pure: lists of hits in, one out.
"""

from __future__ import annotations

from collections.abc import Sequence

from denpex.retrieval.index import Hit

RRF_K = 60  # the constant of Cormack et al. (2009): damps the weight of the very first ranks
DEPTH = 20  # how deep each ranking is read


def fuse(rankings: Sequence[Sequence[Hit]], k: int) -> list[Hit]:
    """The `k` passages with the highest sum of 1 / (RRF_K + rank) over `rankings`; each
    keeps the score (and so the displayed similarity) of the first ranking that has it."""
    total: dict[str, float] = {}
    first: dict[str, Hit] = {}
    order: dict[str, int] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking[:DEPTH], start=1):
            pid = hit.passage.id
            total[pid] = total.get(pid, 0.0) + 1.0 / (RRF_K + rank)
            first.setdefault(pid, hit)
            order.setdefault(pid, len(order))
    best = sorted(total, key=lambda pid: (-total[pid], order[pid]))
    return [first[pid] for pid in best[:k]]
