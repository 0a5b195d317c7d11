"""The nearest past incidents inside PostgreSQL, with pgvector: the `embedding vector(384)`
column that migration 0011 adds beside each stored vector, kept filled, and searched by
cosine distance (`<=>`) over the same incidents the numpy search reads (the tenant's latest,
without the asking run's own), so both give the same answer.

Used only where the column exists (`available`); SQLite and a PostgreSQL without the
extension keep the numpy search of denpex.control.similar. No ANN index is built: an exact
scan is what makes the two searches agree, and benchmarks/bench_retrieval.py measures it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.store import incident_dict

if TYPE_CHECKING:
    import numpy as np

    from denpex.control.db import Database
    from denpex.control.store import TenantStore

DIM = 384  # all-MiniLM-L6-v2 (denpex.retrieval.embedding.DIM; migration 0011's column)
_DETECTED: weakref.WeakKeyDictionary[Database, bool] = weakref.WeakKeyDictionary()


class _Vector(sa.types.UserDefinedType[Any]):
    """pgvector's type, as far as a CAST needs it (the pgvector package is not required)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return f"vector({DIM})"


# the column 0011 adds, which the shared schema does not know (it exists only with pgvector)
_vectors = sa.Table(
    "incident_vectors",
    sa.MetaData(),
    sa.Column("tenant", sa.Text),
    sa.Column("incident_id", sa.BigInteger),
    sa.Column("model", sa.Text),
    sa.Column("embedding", sa.Text),
)


def available(db: Database) -> bool:
    """Whether this store searches with pgvector (PostgreSQL with migration 0011's column)."""
    if not db.postgres:
        return False
    if db not in _DETECTED:
        with db.engine.connect() as conn:
            found = conn.execute(
                sa.text(
                    "SELECT 1 FROM information_schema.columns WHERE table_name = "
                    "'incident_vectors' AND column_name = 'embedding'"
                )
            ).scalar()
        _DETECTED[db] = bool(found)
    return _DETECTED[db]


def literal(vector: np.ndarray) -> str:
    """pgvector's text form of a float32 vector; each float written exactly (a float32 read
    back from its shortest float64 repr is the same float32)."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def fill(scoped: TenantStore, model: str, rows: Sequence[tuple[int, np.ndarray]]) -> None:
    """Set the embedding column of (incident id, vector) rows already stored for `model`."""
    if not rows:
        return
    v = _vectors
    update = (
        sa.update(v)
        .where(
            v.c.tenant == sa.bindparam("b_tenant"),
            v.c.incident_id == sa.bindparam("b_id"),
            v.c.model == sa.bindparam("b_model"),
        )
        .values(embedding=sa.cast(sa.bindparam("b_vec", type_=sa.Text), _Vector()))
    )
    with scoped._write() as conn:
        conn.execute(
            update,
            [
                {"b_tenant": scoped.tenant, "b_id": i, "b_model": model, "b_vec": literal(vec)}
                for i, vec in rows
            ],
        )


def unfilled(scoped: TenantStore, model: str) -> list[tuple[int, bytes]]:
    """Stored vectors whose embedding column is still empty (rows from before 0011, or a
    fill that did not happen): (incident id, float32 bytes)."""
    v, base = _vectors, s.incident_vectors
    query = (
        sa.select(base.c.incident_id, base.c.vector)
        .join(
            v,
            sa.and_(
                v.c.tenant == base.c.tenant,
                v.c.incident_id == base.c.incident_id,
                v.c.model == base.c.model,
            ),
        )
        .where(base.c.tenant == scoped.tenant, base.c.model == model, v.c.embedding.is_(None))
    )
    with scoped._read() as conn:
        return [(int(r.incident_id), bytes(r.vector)) for r in conn.execute(query)]


def nearest(
    scoped: TenantStore,
    model: str,
    queries: np.ndarray,
    k: int,
    *,
    searched: int,
    exclude: int | None = None,
    exclude_report: str | None = None,
) -> list[tuple[dict[str, Any], float]]:
    """The `k` incidents nearest any row of `queries` (cosine similarity, best row), among
    the tenant's latest `searched` incidents: (incident, similarity), best first, ties by
    recency as the numpy search breaks them."""
    inc, links, v = s.incidents, s.incident_links, _vectors
    latest = sa.select(inc).where(inc.c.tenant == scoped.tenant)
    if exclude is not None:
        latest = latest.where(inc.c.id != exclude)
    if exclude_report is not None:
        latest = latest.where(
            ~inc.c.id.in_(
                sa.select(links.c.incident_id).where(
                    links.c.tenant == scoped.tenant,
                    links.c.kind == "report",
                    links.c.ref == exclude_report,
                )
            )
        )
    pool = latest.order_by(inc.c.last_ns.desc(), inc.c.id.desc()).limit(searched).subquery()
    distance = v.c.embedding.op("<=>", return_type=sa.Float)(
        sa.cast(sa.bindparam("query", type_=sa.Text), _Vector())
    )
    query = (
        sa.select(pool, distance.label("distance"))
        .join(
            v,
            sa.and_(v.c.tenant == pool.c.tenant, v.c.incident_id == pool.c.id, v.c.model == model),
        )
        .where(v.c.embedding.is_not(None))
        .order_by(distance, pool.c.last_ns.desc(), pool.c.id.desc())
        .limit(k)
    )
    best: dict[int, tuple[dict[str, Any], float, int]] = {}
    with scoped._read() as conn:
        for line in queries.reshape(-1, DIM):
            for row in conn.execute(query, {"query": literal(line)}):
                score = 1.0 - float(row.distance)
                known = best.get(row.id)
                if known is None or score > known[1]:
                    best[row.id] = (incident_dict(row, None), score, -row.last_ns)
    ordered = sorted(best.items(), key=lambda kv: (-kv[1][1], kv[1][2], -kv[0]))
    return [(incident, score) for _, (incident, score, _) in ordered[:k]]
