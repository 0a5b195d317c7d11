"""Retention of evidence by age and by size, and PostgreSQL's time partitions (created
ahead, dropped whole when they fall out of the age window). Run by the leader only.

It must never delete an incident, a report or a token: only evidence (and empty partitions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from denpex.control.db import Database
from denpex.control.store import Store

DAY_NS = 86_400 * 1_000_000_000
_PARTITION = re.compile(r"^evidence_p(\d{8})$")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    max_age_days: float = 30.0
    max_rows_per_tenant: int | None = None  # None: no size bound
    partitions_ahead_days: int = 3


def day_start_ns(ts_ns: int) -> int:
    return ts_ns - ts_ns % DAY_NS


def partition_name(day_ns: int) -> str:
    return "evidence_p" + datetime.fromtimestamp(day_ns / 1e9, UTC).strftime("%Y%m%d")


def ensure_partitions(db: Database, from_ns: int, to_ns: int) -> list[str]:
    """Daily partitions of `evidence` covering [from_ns, to_ns) (PostgreSQL); returns the
    ones created. A day whose rows already sit in the default partition stays there."""
    if not db.postgres:
        return []
    created = []
    with db.system_tx() as conn:
        existing = set(
            conn.exec_driver_sql(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'evidence'"
            ).scalars()
        )
    day = day_start_ns(from_ns)
    while day < to_ns:
        name = partition_name(day)
        if name not in existing:
            try:
                with db.system_tx(write=True) as conn:
                    conn.exec_driver_sql(
                        f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF evidence "
                        f"FOR VALUES FROM ({day}) TO ({day + DAY_NS})"
                    )
                created.append(name)
            except Exception as exc:  # rows of that day in the default partition: keep them
                if "default partition" not in str(exc):
                    raise
        day += DAY_NS
    return created


def drop_old_partitions(db: Database, cutoff_ns: int) -> list[str]:
    """Drop the daily partitions that end at or before `cutoff_ns` (PostgreSQL)."""
    if not db.postgres:
        return []
    dropped = []
    with db.system_tx() as conn:
        names = list(
            conn.exec_driver_sql(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'evidence'"
            ).scalars()
        )
    for name in names:
        match = _PARTITION.match(name)
        if not match:
            continue
        start = datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)
        end_ns = int((start + timedelta(days=1)).timestamp()) * 1_000_000_000
        if end_ns <= cutoff_ns:
            with db.system_tx(write=True) as conn:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {name}")
            dropped.append(name)
    return dropped


def apply_retention(store: Store, fence_for, policy: RetentionPolicy, now_ns: int) -> int:
    """Evidence rows deleted by age and by size across tenants (rows of day partitions that
    PostgreSQL drops whole are not counted); `fence_for(tenant)` gives the leader's fenced
    TenantStore."""
    cutoff = now_ns - int(policy.max_age_days * DAY_NS)
    drop_old_partitions(store.db, cutoff)
    removed = 0
    for tenant in store.tenants():
        scoped = fence_for(tenant)
        removed += scoped.delete_evidence_before(cutoff)
        if policy.max_rows_per_tenant is not None:
            removed += scoped.trim_evidence(policy.max_rows_per_tenant)
    ensure_partitions(store.db, now_ns, now_ns + policy.partitions_ahead_days * DAY_NS)
    return removed
