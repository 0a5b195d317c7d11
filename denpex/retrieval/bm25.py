"""The lexical baseline: BM25 over the same passages with SQLite's FTS5, in memory.

Used to measure the embeddings against (benchmarks/bench_retrieval.py) and fused with them in
the retrieval block (fusion.py). It indexes and searches what `normalise` leaves of each text,
as the embedding index does, so both rankers see the same words.
"""

from __future__ import annotations

import re
import sqlite3
import threading

from denpex.retrieval.index import Hit
from denpex.retrieval.normalise import normalise
from denpex.retrieval.passages import Passage

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]+|[0-9]{2,}")
MAX_TERMS = 64  # FTS5 query length grows the cost linearly; a log line rarely needs more


def query_terms(text: str) -> list[str]:
    """The words of `text` as FTS5 strings (quoted, so no word is read as an operator)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text):
        seen.setdefault(word.lower(), None)
    return ['"' + w.replace('"', '""') + '"' for w in list(seen)[:MAX_TERMS]]


class Bm25Index:
    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        # one index serves every request thread of the server: one query at a time
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.lock = threading.Lock()
        # porter stemming: "timed out" meets "timeout", "allocating" meets "allocate"
        self.db.execute("CREATE VIRTUAL TABLE fts USING fts5(body, tokenize='porter unicode61')")
        self.db.executemany(
            "INSERT INTO fts(rowid, body) VALUES (?, ?)",
            (
                (i, "\n".join(normalise(t) for t in (p.title, *p.texts)))
                for i, p in enumerate(passages)
            ),
        )

    def search(self, text: str, k: int = 3) -> list[Hit]:
        terms = query_terms(normalise(text))
        if not terms or k <= 0:
            return []
        with self.lock:
            rows = self.db.execute(
                "SELECT rowid, bm25(fts) FROM fts WHERE fts MATCH ? "
                "ORDER BY bm25(fts), rowid LIMIT ?",
                (" OR ".join(terms), k),
            ).fetchall()
        # FTS5's bm25() is lower-is-better; a Hit's score is higher-is-better
        return [Hit(self.passages[i], -float(score)) for i, score in rows]
