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
