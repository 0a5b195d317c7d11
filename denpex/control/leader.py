"""Leader election for the loops that must run on one replica only (correlation, retention,
later remediation), and the epoch fence on every write they make.

PostgreSQL: the leader holds a session-level advisory lock on a dedicated connection and
renews a lease row (`leader.renewed_ns`); taking the lead bumps `leader.epoch`. A replica that
finds the lease expired (the holder is frozen, or partitioned away with its session alive)
terminates the holder's session, which frees the lock. Every leader write checks its epoch
in the same transaction (denpex.control.store.check_fence), so a stale leader's late write is
refused however late it comes. SQLite (one host): an flock beside the database file.

It must never let a replica act as leader after a fenced write or a failed renewal.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.control.store import Fence

LOCK_KEY = 0x64707802  # pg advisory lock key of the correlation leader


@dataclass(slots=True)
class LeaderState:
    leader: bool = False
    epoch: int = 0
    takeovers: int = 0
    fenced: int = 0
    since_ns: int = 0


class Leadership:
    """Try to lead, renew, step down. Not thread-safe: one loop thread owns it."""

    def __init__(self, db: Database, *, name: str = "correlator", lease_s: float = 10.0) -> None:
        self.db = db
        self.name = name
        self.lease_s = lease_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.state = LeaderState()
        self._lock_conn: Any = None  # PostgreSQL: the session holding the advisory lock
        self._lock_fd = -1  # SQLite: the flock'ed file

    @property
    def fence(self) -> Fence:
        return Fence(self.name, self.state.epoch)

    # --- acquiring ---------------------------------------------------------------------------

    def try_acquire(self, now_ns: int) -> bool:
        if self.state.leader:
            return True
        got = self._lock_postgres(now_ns) if self.db.postgres else self._lock_sqlite()
        if not got:
            return False
        with self.db.system_tx(write=True) as conn:
            row = conn.execute(
                sa.select(s.leader.c.epoch).where(s.leader.c.name == self.name).with_for_update()
                if self.db.postgres
                else sa.select(s.leader.c.epoch).where(s.leader.c.name == self.name)
            ).first()
            epoch = (row.epoch if row else 0) + 1
            values = {"epoch": epoch, "holder": self.holder, "renewed_ns": now_ns}
            if row is None:
                conn.execute(s.leader.insert().values(name=self.name, **values))
            else:
                conn.execute(s.leader.update().where(s.leader.c.name == self.name).values(values))
        self.state.leader, self.state.epoch, self.state.since_ns = True, epoch, now_ns
        self.state.takeovers += 1
        return True

    def _lock_postgres(self, now_ns: int) -> bool:
        if self._lock_conn is None:
            self._lock_conn = self.db.engine.connect().execution_options(
                isolation_level="AUTOCOMMIT"
            )
        try:
            got = self._lock_conn.exec_driver_sql(
                f"SELECT pg_try_advisory_lock({LOCK_KEY})"
            ).scalar()
            if not got and self._break_expired_lease(now_ns):
                for _ in range(30):  # the ended session's backend releases as it exits
                    got = self._lock_conn.exec_driver_sql(
                        f"SELECT pg_try_advisory_lock({LOCK_KEY})"
                    ).scalar()
                    if got:
                        break
                    time.sleep(0.1)
        except sa.exc.DBAPIError:
            self._drop_lock_connection()
            return False
        return bool(got)

    def _break_expired_lease(self, now_ns: int) -> bool:
        """The holder has not renewed within the lease: end its session (frees the lock).
        Returns whether a session was ended."""
        row = self._lock_conn.execute(
            sa.select(s.leader.c.renewed_ns).where(s.leader.c.name == self.name)
        ).first()
        if row is None or now_ns - row.renewed_ns < self.lease_s * 1e9:
            return False
        ended = self._lock_conn.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            f"AND objid = {LOCK_KEY & 0xFFFFFFFF} AND granted AND pid <> pg_backend_pid()"
        ).all()
        return any(flag for (flag,) in ended)

    def _lock_sqlite(self) -> bool:
        if self._lock_fd < 0:
            path = Path(self.db.url.removeprefix("sqlite:///") + ".leader")
            self._lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    # --- keeping it --------------------------------------------------------------------------

    def renew(self, now_ns: int) -> bool:
        """A fenced write of the lease; False (and no longer leader) when it is refused or the
        lock's session is gone."""
        if not self.state.leader:
            return False
        try:
            with self.db.system_tx(write=True) as conn:
                result = conn.execute(
                    s.leader.update()
                    .where(s.leader.c.name == self.name, s.leader.c.epoch == self.state.epoch)
                    .values(renewed_ns=now_ns, holder=self.holder)
                )
            if result.rowcount != 1:
                self.note_fenced()
                return False
            if self._lock_conn is not None:
                self._lock_conn.exec_driver_sql("SELECT 1")  # the lock's session still alive?
        except sa.exc.DBAPIError:
            self.step_down()
            return False
        return True

    def note_fenced(self) -> None:
        self.state.fenced += 1
        self.step_down()

    def step_down(self) -> None:
        self.state.leader = False
        if self._lock_conn is not None:
            # release before closing: a closed session frees its lock only once its backend
            # has exited, and a standby asking in between would be refused
            try:
                self._lock_conn.exec_driver_sql("SELECT pg_advisory_unlock_all()")
            except sa.exc.DBAPIError:
                pass  # the session is gone already, and its lock with it
            self._drop_lock_connection()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def _drop_lock_connection(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        try:
            conn.invalidate()  # never back into the pool: the session must end
            conn.close()
        except Exception:
            pass
