"""The global read view of every region's incidents and audit log, built with PostgreSQL
logical replication: each region's server publishes its `incidents` and `audit` tables
(`publish`, at start, a publication per region whose row filter lets through only the
tenants resident in the global view's region), and the global site subscribes to each
region (`GlobalView.subscribe`); its tables are keyed by (region, id) and (region, seq).

A region keeps working while its link to the global site is down: its replication slot
keeps the WAL, and the subscription catches up when the link is back. The global site
only reads; it must never write into a region, and a tenant's rows must never reach it
unless the tenant's residency includes the global site's region (the row filter is the
one place that decides, on the region's side: rows that are not published never leave).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.control.residency import Residency, check_region_name

TABLES = {"incidents": ("region", "id"), "audit": ("region", "seq")}  # global keys
PUBLICATION_LOCK = 0x64707808  # pg advisory lock key: one replica (re)publishes at a time


def publication(region: str) -> str:
    return f"denpex_region_{check_region_name(region)}"


def publish(db: Database, residency: Residency) -> list[str]:
    """Create or update this region's publication; returns the tenants it lets through.
    PostgreSQL only (wal_level=logical on the region's cluster for subscribers to attach)."""
    if not db.postgres:
        raise ValueError("the global view is built by PostgreSQL logical replication")
    tenants = residency.global_tenants()
    # tenant names reach SQL only as literals escaped by the server itself (quote_literal)
    with db.system_tx(write=True) as conn:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PUBLICATION_LOCK})")  # replicas
        listed = conn.execute(
            sa.text(
                "SELECT coalesce(string_agg(quote_literal(t), ', '), '''''') FROM unnest("
                "CAST(:tenants AS text[])) AS t"
            ),
            {"tenants": tenants},
        ).scalar_one()
        tables = ", ".join(f"{t} WHERE (tenant IN ({listed}))" for t in TABLES)
        name = publication(residency.region)
        exists = conn.execute(
            sa.text("SELECT 1 FROM pg_publication WHERE pubname = :n"), {"n": name}
        ).first()
        for table in TABLES:  # row filters on updated rows need every column logged
            conn.exec_driver_sql(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        verb = (
            f"ALTER PUBLICATION {name} SET TABLE"
            if exists
            else f"CREATE PUBLICATION {name} FOR TABLE"
        )
        conn.exec_driver_sql(f"{verb} {tables}")
    return tenants


class GlobalView:
    """The global site's database: its tables, its subscriptions, and the reads."""

    def __init__(self, url: str) -> None:
        self.db = Database(url)
        if not self.db.postgres:
            raise ValueError("the global view is a PostgreSQL database")

    def prepare(self) -> None:
        """Create the global tables (the regions' columns, keyed by region) if missing."""
        metadata = sa.MetaData()
        for name, key in TABLES.items():
            source = s.metadata.tables[name]
            columns = [
                sa.Column(
                    c.name,
                    c.type,
                    nullable=c.nullable or c.name not in key,
                    primary_key=c.name in key,
                    autoincrement=False,
                )
                for c in source.columns
            ]
            sa.Table(name, metadata, *columns)
        metadata.create_all(self.db.engine)

    def subscribe(self, region: str, conninfo: str) -> None:
        """Subscribe to `region`'s publication (the connecting role must be a superuser, or in
        PostgreSQL 16 a member of pg_create_subscription; `conninfo` names a role with
        REPLICATION on the region's cluster)."""
        name = publication(region)
        with self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            found = conn.execute(
                sa.text("SELECT 1 FROM pg_subscription WHERE subname = :n"), {"n": name}
            ).first()
            if found is None:  # CREATE SUBSCRIPTION takes no bind parameters
                quoted = conn.execute(sa.text("SELECT quote_literal(:c)"), {"c": conninfo})
                conn.exec_driver_sql(
                    f"CREATE SUBSCRIPTION {name} CONNECTION {quoted.scalar_one()} "
                    f"PUBLICATION {name}"
                )

    def status(self) -> list[dict[str, Any]]:
        """Per subscription: its name, whether it is enabled, the WAL position received."""
        with self.db.system_tx() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT s.subname, s.subenabled, st.received_lsn::text, "
                    "st.latest_end_time FROM pg_subscription s "
                    "LEFT JOIN pg_stat_subscription st ON st.subid = s.oid ORDER BY 1"
                )
            ).all()
        return [
            {"subscription": r[0], "enabled": r[1], "received_lsn": r[2], "latest": r[3]}
            for r in rows
        ]

    def incidents(self, *, tenant: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self._read(
            "incidents",
            tenant,
            limit,
            ("region", "id", "tenant", "title", "status", "category", "opened_ns"),
        )

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self._read("audit", tenant, limit, ("region", "seq", "tenant", "kind", "ts_ns"))

    def _read(
        self, table: str, tenant: str | None, limit: int, columns: Sequence[str]
    ) -> list[dict[str, Any]]:
        t = sa.table(table, *[sa.column(c) for c in columns])
        query = sa.select(*t.c).order_by(t.c[columns[0]], t.c[columns[1]]).limit(limit)
        if tenant is not None:
            query = query.where(t.c.tenant == tenant)
        with self.db.system_tx() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def dispose(self) -> None:
        self.db.dispose()
