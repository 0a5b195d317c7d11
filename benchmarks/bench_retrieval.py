"""Runbook retrieval on the labelled corpus: how often the top-3 runbook entries hold the root
cause's own entry, for the embedding index and for a BM25 baseline (SQLite FTS5) on the same
queries, and where sqlite-vec overtakes numpy brute force as the index grows.

Each failed log of tests/corpus (synthetic) and tests/corpus/real is diagnosed as `denpex scan`
would; the query is what the retrieval block searches with (the distinct raw lines of the
cause's evidence; the embeddings take one vector a line and the best line, BM25 the lines
together; both see the texts `normalise` leaves). A hit is a top-3 entry of the labelled
category (`category`); `own` asks more: the entry of the very signature the diagnosis named,
counted on the logs it diagnosed right. The real logs are scored as their two splits (`dev`,
which retrieval was tuned on with the synthetic logs, and `holdout`, which it never was).
Target: category recall@3 >= 0.90 for the embeddings, and above BM25's. Prints JSON.
The PostgreSQL crossover (`--pg-sizes`) runs on pgserver's PostgreSQL 16 + pgvector in a
temporary folder: pgvector's exact `<=>` scan against numpy over the bytea vectors read out
of PostgreSQL each query (the fallback's way), both over one tenant's rows.
Usage: python benchmarks/bench_retrieval.py [--k 3] [--no-crossover] [--sizes 1000,10000]
       [--pg-sizes 1000,10000] [--no-recall]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from denpex.catalog import load_catalog
from denpex.retrieval.block import query_text
from denpex.retrieval.bm25 import Bm25Index
from denpex.retrieval.embedding import Embedder
from denpex.retrieval.fusion import DEPTH, fuse
from denpex.retrieval.index import query_vectors
from denpex.retrieval.runbook import runbook_index
from tests.test_corpus import REAL_PART, SYNTHETIC, diagnose_file

TARGET = 0.90


def cases(part, split: str | None = None) -> list[tuple[dict, dict]]:
    out = []
    for entry in part.labels:
        if entry.get("status", "failed") != "failed" or entry["category"] == "unknown":
            continue
        if split is not None and entry.get("split") != split:
            continue
        out.append((entry, diagnose_file(part.folder, entry)))
    return out


def score_part(name: str, items, index, bm25, embedder, k: int) -> dict:
    queries = [query_text(diag) for _, diag in items]
    started = time.perf_counter()
    vectors = [query_vectors(embedder, q) for q in queries]
    embed_s = time.perf_counter() - started
    totals = {"embedding": [0, 0, 0], "bm25": [0, 0, 0], "hybrid": [0, 0, 0]}
    own_total = 0
    misses: list[str] = []
    for (entry, diag), query, vec in zip(items, queries, vectors, strict=True):
        want = entry["category"]
        signature = diag["root_cause"].get("signature")
        right = diag["root_cause"]["category"] == want and signature
        own_total += bool(right)
        deep_vec, deep_bm25 = index.search(vec, DEPTH), bm25.search(query, DEPTH)
        for ranker, hits in (
            ("embedding", deep_vec[:k]),
            ("bm25", deep_bm25[:k]),
            ("hybrid", fuse([deep_vec, deep_bm25], k)),
        ):
            cats = [h.passage.category for h in hits]
            totals[ranker][0] += want in cats
            totals[ranker][2] += bool(right) and want in cats
            totals[ranker][1] += bool(right) and f"runbook:{signature}" in {
                h.passage.id for h in hits
            }
            if ranker == "embedding" and want not in cats and "real" not in name:
                misses.append(f"{entry['file']}: want {want}, got {cats}")
    n = len(items)
    result = {"part": name, "queries": n, "own_entry_queries": own_total}
    for ranker, (cat_hits, own_hits, right_hits) in totals.items():
        result[ranker] = {
            f"category_recall_at_{k}": round(cat_hits / n, 3) if n else None,
            f"category_recall_at_{k}_diagnosed_right": (
                round(right_hits / own_total, 3) if own_total else None
            ),
            f"own_entry_recall_at_{k}": round(own_hits / own_total, 3) if own_total else None,
        }
    result["embed_ms_per_query"] = round(1000 * embed_s / max(n, 1), 2)
    result["embedding_misses"] = misses[:12]
    return result


def per_query(fn, queries) -> float:
    """Mean ms of one call of `fn` over `queries` (after one warm-up call)."""
    fn(queries[0])
    started = time.perf_counter()
    for q in queries:
        fn(q)
    return round(1000 * (time.perf_counter() - started) / len(queries), 3)


def crossover(sizes: list[int], dim: int = 384, queries: int = 20) -> list[dict]:
    """ms per top-10 query: numpy over vectors read from SQLite each query (what a store
    without a cache does), numpy over vectors kept in memory, and sqlite-vec's vec0 table."""
    import apsw
    import numpy as np
    import sqlite_vec

    rng = np.random.default_rng(7)
    rows = []
    for n in sizes:
        data = rng.standard_normal((n, dim)).astype(np.float32)
        data /= np.linalg.norm(data, axis=1, keepdims=True)
        qs = data[rng.integers(0, n, queries)]
        db = apsw.Connection(":memory:")
        db.enable_load_extension(True)
        db.load_extension(sqlite_vec.loadable_path())
        db.execute(f"CREATE VIRTUAL TABLE vec USING vec0(v float[{dim}] distance_metric=cosine)")
        db.execute("CREATE TABLE blobs(id INTEGER PRIMARY KEY, v BLOB)")
        with db:
            db.executemany(
                "INSERT INTO vec(rowid, v) VALUES (?, ?)",
                ((i, r.tobytes()) for i, r in enumerate(data)),
            )
            db.executemany(
                "INSERT INTO blobs(id, v) VALUES (?, ?)",
                ((i, r.tobytes()) for i, r in enumerate(data)),
            )

        def numpy_memory(q, data=data):
            scores = data @ q
            return np.argpartition(-scores, 9)[:10]

        def numpy_from_db(q, db=db):
            got = db.execute("SELECT v FROM blobs").fetchall()
            mat = np.frombuffer(b"".join(r[0] for r in got), np.float32).reshape(-1, dim)
            return np.argpartition(-(mat @ q), 9)[:10]

        def sqlite_vec_knn(q, db=db):
            return db.execute(
                "SELECT rowid FROM vec WHERE v MATCH ? AND k = 10", (q.tobytes(),)
            ).fetchall()

        same = set(numpy_memory(qs[1]).tolist()) == {r[0] for r in sqlite_vec_knn(qs[1])}
        rows.append(
            {
                "vectors": n,
                "numpy_in_memory_ms": per_query(numpy_memory, qs),
                "numpy_read_from_sqlite_ms": per_query(numpy_from_db, qs),
                "sqlite_vec_ms": per_query(sqlite_vec_knn, qs),
                "same_top10": same,
            }
        )
        db.close()
    return rows


def pg_crossover(sizes: list[int], dim: int = 384, queries: int = 20) -> list[dict]:
    """ms per top-10 query in PostgreSQL: pgvector's exact scan, and numpy over the vectors
    read from the database each query (what a store without pgvector does)."""
    import tempfile

    import numpy as np
    import pgserver
    import psycopg

    from denpex.control.pgvector_search import literal

    rng = np.random.default_rng(7)
    rows = []
    with tempfile.TemporaryDirectory(prefix="denpex-pgvector-") as folder:
        server = pgserver.get_server(folder, cleanup_mode="stop")
        try:
            uri = server.get_uri()
            with psycopg.connect(uri, autocommit=True) as db:
                db.execute("CREATE EXTENSION IF NOT EXISTS vector")
                for n in sizes:
                    data = rng.standard_normal((n, dim)).astype(np.float32)
                    data /= np.linalg.norm(data, axis=1, keepdims=True)
                    qs = data[rng.integers(0, n, queries)]
                    db.execute("DROP TABLE IF EXISTS vec")
                    db.execute(
                        f"CREATE TABLE vec (id bigint PRIMARY KEY, tenant text, "
                        f"v bytea, e vector({dim}))"
                    )
                    with db.cursor().copy("COPY vec (id, tenant, v, e) FROM STDIN") as copy:
                        for i, r in enumerate(data):
                            copy.write_row((i, "acme", r.tobytes(), literal(r)))
                    db.execute("ANALYZE vec")

                    def pgvector_knn(q, db=db):
                        return db.execute(
                            "SELECT id FROM vec WHERE tenant = 'acme' "
                            "ORDER BY e <=> %s::vector LIMIT 10",
                            (literal(q),),
                        ).fetchall()

                    def numpy_from_pg(q, db=db):
                        got = db.execute("SELECT v FROM vec WHERE tenant = 'acme'").fetchall()
                        mat = np.frombuffer(b"".join(r[0] for r in got), np.float32)
                        return np.argpartition(-(mat.reshape(-1, dim) @ q), 9)[:10]

                    same = {r[0] for r in pgvector_knn(qs[1])} == set(numpy_from_pg(qs[1]).tolist())
                    rows.append(
                        {
                            "vectors": n,
                            "pgvector_exact_ms": per_query(pgvector_knn, qs),
                            "numpy_read_from_postgresql_ms": per_query(numpy_from_pg, qs),
                            "same_top10": same,
                        }
                    )
        finally:
            server.cleanup()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--no-crossover", action="store_true")
    parser.add_argument("--sizes", default="1000,10000,50000,200000")
    parser.add_argument("--pg-sizes", default="100,1000,10000,50000")
    parser.add_argument("--no-recall", action="store_true", help="only the crossovers")
    args = parser.parse_args()
    if args.no_recall:
        print(
            json.dumps(
                {"pg_crossover": pg_crossover([int(s) for s in args.pg_sizes.split(",")])}, indent=1
            )
        )
        return 0
    catalog = load_catalog()
    embedder = Embedder.load()
    index = runbook_index(catalog, embedder, site_dirs=[])
    bm25 = Bm25Index(index.passages)
    parts = [
        score_part(name, items, index, bm25, embedder, args.k)
        for name, items in (
            ("synthetic", cases(SYNTHETIC)),
            ("real", cases(REAL_PART)),
            ("real dev", cases(REAL_PART, "dev")),
            ("real holdout", cases(REAL_PART, "holdout")),
        )
    ]
    out: dict = {"runbook_passages": len(index), "k": args.k, "parts": parts}
    key = f"category_recall_at_{args.k}"
    out["target"] = {
        "embedding_category_recall": TARGET,
        "met": all(p["embedding"][key] >= TARGET for p in parts[:2]),
        "embedding_beats_bm25": {p["part"]: p["embedding"][key] > p["bm25"][key] for p in parts},
        "hybrid_met": all(p["hybrid"][key] >= TARGET for p in parts[:2]),
    }
    if not args.no_crossover:
        out["crossover"] = crossover([int(s) for s in args.sizes.split(",")])
        out["pg_crossover"] = pg_crossover([int(s) for s in args.pg_sizes.split(",")])
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
