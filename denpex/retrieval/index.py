"""The vector index: passages and their unit vectors, searched by cosine similarity with numpy
brute force (exact; at runbook and incident sizes faster than any index, see
benchmarks/bench_retrieval.py for where sqlite-vec overtakes it). A passage owns several rows
(its text, its probes) and a query several vectors (one per failure line); a passage scores
by its best pair, so one line that matches one example well is enough.

Also the shipped runbook index (built by `python -m denpex.retrieval.build_index`): vectors
keyed by the text they were computed from, so an entry whose text changed is embedded again
instead of answered with a stale vector. Never downloads and never writes into the package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from denpex.retrieval.normalise import normalise
from denpex.retrieval.passages import Passage, text_key

if TYPE_CHECKING:
    import numpy as np

    from denpex.retrieval.embedding import Embedder

DIM = 384  # all-MiniLM-L6-v2
SHIPPED_PASSAGES = "runbook.json"
SHIPPED_VECTORS = "runbook-vectors.npz"


def data_dir() -> Path:
    return Path(str(resources.files("denpex.retrieval") / "data"))


@dataclass(frozen=True, slots=True)
class Hit:
    passage: Passage
    score: float  # cosine similarity, -1…1


class VectorIndex:
    """Exact nearest passages of a query vector. A passage may own several rows (its text
    and its probes); its score is the best of them."""

    def __init__(self, passages: list[Passage], vectors: np.ndarray) -> None:
        import numpy as np

        owners = [i for i, p in enumerate(passages) for _ in p.texts]
        if len(owners) != len(vectors):
            raise ValueError(f"{len(owners)} texts in the passages but {len(vectors)} vectors")
        self.passages = passages
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.starts = np.array([owners.index(i) for i in range(len(passages))], dtype=np.int64)
        self.kinds = np.array([p.kind for p in passages])

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: np.ndarray) -> np.ndarray:
        """One cosine similarity per passage: the best over its rows and the query's vectors
        (`query` is one vector or one row per query line)."""
        import numpy as np

        lines = np.asarray(query, dtype=np.float32).reshape(-1, self.vectors.shape[1])
        rows = (self.vectors @ lines.T).max(axis=1)
        return np.maximum.reduceat(rows, self.starts) if len(self.starts) else rows

    def search(
        self, query: np.ndarray, k: int = 3, *, kinds: frozenset[str] | None = None
    ) -> list[Hit]:
        import numpy as np

        if not self.passages or k <= 0:
            return []
        scores = self.scores(query)
        if kinds is not None:
            scores = np.where(np.isin(self.kinds, list(kinds)), scores, -np.inf)
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        # ties broken by passage order, so the same query always reads the same way
        order = sorted(top, key=lambda i: (-float(scores[i]), int(i)))
        return [Hit(self.passages[i], float(scores[i])) for i in order if np.isfinite(scores[i])]


class VectorStore:
    """Vectors by the text they were computed from: the shipped ones, plus the ones this
    process computed."""

    def __init__(self, vectors: dict[str, Any] | None = None) -> None:
        self.vectors: dict[str, Any] = dict(vectors or {})
        self.computed = 0

    @classmethod
    def shipped(cls) -> VectorStore:
        """The vectors built with the package, or none when the file is absent."""
        path = data_dir() / SHIPPED_VECTORS
        if not path.is_file():
            return cls()
        import numpy as np

        with np.load(path, allow_pickle=False) as data:
            keys, rows = data["keys"], data["vectors"].astype(np.float32)
        return cls(dict(zip((str(k) for k in keys), rows, strict=True)))

    def vectors_for(self, passages: list[Passage], embedder: Embedder) -> np.ndarray:
        """The rows of `passages` in VectorIndex order, embedding what is not stored yet
        (each text as `normalise` leaves it, and keyed by that)."""
        import numpy as np

        texts = [normalise(t) for p in passages for t in p.texts]
        keys = [text_key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self.vectors}
        if missing:
            fresh = embedder.encode(list(missing.values()))
            self.vectors.update(zip(missing, fresh, strict=True))
            self.computed += len(missing)
        if not keys:
            return np.zeros((0, DIM), np.float32)
        return np.stack([self.vectors[k] for k in keys]).astype(np.float32)

    def save(self, path: Path, passages: list[Passage]) -> int:
        """Write the vectors of `passages` (half precision: cosines move by < 1e-3)."""
        import numpy as np

        keys = list(dict.fromkeys(text_key(normalise(t)) for p in passages for t in p.texts))
        rows = np.stack([self.vectors[k] for k in keys]).astype(np.float16)
        np.savez_compressed(path, keys=np.array(keys), vectors=rows)
        return len(keys)


def query_vectors(embedder: Embedder, query: str) -> np.ndarray:
    """One vector per distinct line of `query` (normalised; blank lines left out), the rows
    `VectorIndex.search` takes the best of; one vector of the whole text when it is one line."""
    lines = list(dict.fromkeys(normalise(line) for line in query.splitlines()))
    return embedder.encode([line for line in lines if line] or [normalise(query)])


def shipped_passages() -> list[Passage]:
    """The doc passages built with the package (catalog entries are taken live instead, so
    site-local signatures are searched too)."""
    path = data_dir() / SHIPPED_PASSAGES
    if not path.is_file():
        return []
    return [Passage.from_dict(d) for d in json.loads(path.read_text(encoding="utf-8"))]
