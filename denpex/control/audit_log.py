"""The audit log in the store: append a record to the hash chain inside the caller's
transaction (so an act and its record commit together), read the head, export the chain.

Appends are serialised: PostgreSQL takes a transaction-level advisory lock, SQLite's writer
holds the database lock from BEGIN IMMEDIATE. It must never update or delete a record.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.core import audit

AUDIT_LOCK = 0x64707803  # pg advisory lock key: one appender at a time
EXPORT_BATCH = 1000


def head(conn: Connection) -> audit.Head:
    row = conn.execute(
        sa.select(s.audit.c.seq, s.audit.c.hash).order_by(s.audit.c.seq.desc()).limit(1)
    ).first()
    return audit.EMPTY if row is None else audit.Head(int(row.seq), str(row.hash))


def append(
    conn: Connection,
    *,
    ts_ns: int,
    kind: str,
    actor: str,
    tenant: str | None,
    subject: str,
    why: Mapping[str, Any] | None = None,
    result: Mapping[str, Any] | None = None,
) -> audit.Head:
    """Seal and insert the next record in this (write) transaction; returns the new head."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({AUDIT_LOCK})")
    record = audit.seal(
        head(conn),
        ts_ns=ts_ns,
        kind=kind,
        actor=actor,
        tenant=tenant,
        subject=subject,
        why=why or {},
        result=result or {},
    )
    conn.execute(
        s.audit.insert().values(
            seq=record["seq"],
            ts_ns=record["ts_ns"],
            tenant=tenant,
            kind=kind,
            hash=record["hash"],
            line=audit.canonical(record).decode(),
        )
    )
    return audit.head_of(record)


def export_lines(db: Database) -> Iterator[bytes]:
    """Every record's canonical line, in order (read in batches)."""
    after = 0
    while True:
        with db.system_tx() as conn:
            rows = conn.execute(
                sa.select(s.audit.c.seq, s.audit.c.line)
                .where(s.audit.c.seq > after)
                .order_by(s.audit.c.seq)
                .limit(EXPORT_BATCH)
            ).all()
        for row in rows:
            yield row.line.encode()
        if len(rows) < EXPORT_BATCH:
            return
        after = rows[-1].seq


def current_head(db: Database) -> audit.Head:
    with db.system_tx() as conn:
        return head(conn)


def store_lines(db: Database) -> list[bytes]:
    """The whole chain as `denpex audit verify --db` reads it: every record, then an anchor
    naming the last one (the store itself is the anchor's source, so only the records are
    checked, and a cut tail is not detectable this way: keep an anchor apart for that)."""
    lines = list(export_lines(db))
    try:
        last = audit.head_of(audit.loads_record(lines[-1])) if lines else audit.EMPTY
    except (ValueError, KeyError, TypeError):
        last = audit.EMPTY  # the last line is damaged: verification names it before the anchor
    return [*lines, audit.anchor_line(last, None)]


def verify_store(db: Database) -> audit.Verdict:
    """`denpex audit verify --db`'s check of the chain in the store."""
    return audit.verify_lines(store_lines(db))


def tenant_records(db: Database, tenant: str, limit: int = 100) -> list[dict[str, Any]]:
    """The newest `limit` records of one tenant, newest first, each as stored (a line that no
    longer parses is returned as {"seq", "damaged": True}: the page says so, never hides it)."""
    with db.system_tx() as conn:
        rows = conn.execute(
            sa.select(s.audit.c.seq, s.audit.c.line)
            .where(s.audit.c.tenant == tenant)
            .order_by(s.audit.c.seq.desc())
            .limit(limit)
        ).all()
    out: list[dict[str, Any]] = []
    for row in rows:
        try:
            out.append(audit.loads_record(row.line.encode()))
        except ValueError:
            out.append({"seq": int(row.seq), "damaged": True})
    return out
