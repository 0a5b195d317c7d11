"""The store's engine: a database URL → SQLAlchemy engine (SQLite in WAL mode, or PostgreSQL
through psycopg 3), migrations to head at start, and the two kinds of transaction:
`tenant_tx(tenant)` for everything that touches tenant data and `system_tx()` for the
tables that have no tenant (tokens, tenants, the leader fence).

A tenant transaction in PostgreSQL runs as the role `denpex_tenant` (it owns nothing and has
no BYPASSRLS) with `denpex.tenant` set for that transaction only, so row-level security
filters every statement a second time, behind the application's own `WHERE tenant = …`.
It must never hand out a connection on which tenant data is visible without a tenant bound.
A `password` source (a Kubernetes secret, denpex.enterprise.credentials) is asked at every
new connection, so a rotated database password is used from the next connection on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from denpex.control.paths import default_state_dir

TENANT_ROLE = "denpex_tenant"
MIGRATION_LOCK = 0x64707801  # advisory lock key: one replica migrates at a time
MIGRATIONS = Path(__file__).with_name("migrations")


class StoreError(RuntimeError):
    """The store cannot be used as configured (bad URL, missing driver, no permission)."""


def default_url() -> str:
    return f"sqlite:///{default_state_dir() / 'server' / 'control.db'}"


def normalise_url(url: str) -> str:
    """The SQLAlchemy URL for what a user writes: postgresql://… uses psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if url.startswith(("sqlite:///", "postgresql+psycopg://")):
        return url
    raise StoreError(
        f"--db {url!r}: expected sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"
    )


class Database:
    """One engine and its dialect; thread-safe (a connection pool)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        password: Callable[[], str | None] | None = None,
    ) -> None:
        self.url = normalise_url(url)
        self.dialect = "postgresql" if self.url.startswith("postgresql") else "sqlite"
        self.engine = self._engine(pool_size)
        if password is not None and self.postgres:

            @sa.event.listens_for(self.engine, "do_connect")
            def _current_password(_dialect: Any, _record: Any, _args: Any, params: Any) -> None:
                value = password()
                if value:
                    params["password"] = value

    @property
    def postgres(self) -> bool:
        return self.dialect == "postgresql"

    def _engine(self, pool_size: int) -> Engine:
        if self.postgres:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise StoreError(
                    "PostgreSQL needs psycopg 3: pip install 'denpex[server]'"
                ) from None
            return sa.create_engine(
                self.url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
            )
        path = Path(self.url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            self.url, connect_args={"check_same_thread": False, "timeout": 30}
        )
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        # pysqlite's own transaction handling defers BEGIN; take it over (SQLAlchemy recipe)
        # and take the write lock at BEGIN for writers: a deferred reader that later writes
        # fails with SQLITE_BUSY when another writer committed in between
        sa.event.listen(engine, "begin", _sqlite_begin)
        return engine

    def migrate(self) -> str:
        """Upgrade the schema to the latest revision; returns it."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.connect() as conn:
            if self.postgres:
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
                conn.commit()
            try:
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
                conn.commit()
                return str(conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar())
            except sa.exc.DBAPIError as exc:
                raise StoreError(f"cannot migrate the store: {exc.orig}") from None
            finally:
                if self.postgres:
                    conn.rollback()
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
                    conn.commit()

    @contextmanager
    def _begin(self, write: bool) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            if write and not self.postgres:
                conn = conn.execution_options(denpex_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def tenant_tx(
        self,
        tenant: str,
        *,
        write: bool = False,
        prelude: Callable[[Connection], None] | None = None,
    ) -> Iterator[Connection]:
        """One transaction bound to `tenant` (commit on success, rollback on any error).
        `prelude` runs first, as the connecting role (the leader's fence check)."""
        if not tenant:
            raise ValueError("a tenant transaction needs a tenant")
        with self._begin(write) as conn:
            if prelude is not None:
                prelude(conn)
            if self.postgres:
                # one round trip: `role` is the setting SET LOCAL ROLE changes
                conn.execute(
                    sa.text(
                        "SELECT set_config('role', :role, true), "
                        "set_config('denpex.tenant', :tenant, true)"
                    ),
                    {"role": TENANT_ROLE, "tenant": tenant},
                )
            yield conn

    @contextmanager
    def system_tx(self, *, write: bool = False) -> Iterator[Connection]:
        """One transaction on the tables without a tenant (tokens, tenants, leader)."""
        with self._begin(write) as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" listener issues BEGIN itself
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    # the evidence indexes outgrow SQLite's 2 MB default page cache at once; 128 MB at most
    # (measured: ingest 2x faster with it)
    cur.execute("PRAGMA cache_size=-131072")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get("denpex_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
