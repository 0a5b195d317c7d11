"""Each tenant's warm-spare pool in the store: the hosts a human added (API, CLI) or asked to
give back, and what the leader's pass did with each (held out of service, its last preflight,
taken by a reroute, released), every act in the same transaction as its audit record.

A human's handle only records the request; the leader's handle (behind its epoch fence)
loads the pool into a SparePool, which talks to the backend, and saves it back. It must never
let one tenant's request reach another's spare, nor write the leader's results without the
fence.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from denpex.control import schema as s
from denpex.control.fenced_store import FencedTenantStore
from denpex.control.store import Conflict, NotFound
from denpex.core import jsonio
from denpex.remediation.spares import REMOVING, REQUESTED, TAKEN, UNCHECKED, Spare, SparePool

SP = s.remediation_spares
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # a scheduler's node name


class SpareStore(FencedTenantStore):
    subject = "the spare pool"

    def _row(self, conn: Connection, host: str) -> Any:
        return conn.execute(
            sa.select(SP).where(SP.c.tenant == self.tenant, SP.c.host == host)
        ).first()

    # --- humans: reading and asking ----------------------------------------------------------

    def spares(self) -> list[dict[str, Any]]:
        with self.db.system_tx() as conn:
            rows = conn.execute(
                sa.select(SP).where(SP.c.tenant == self.tenant).order_by(SP.c.host)
            ).all()
        return [spare_dict(r) for r in rows]

    def spare(self, host: str) -> dict[str, Any]:
        with self.db.system_tx() as conn:
            row = self._row(conn, host)
        if row is None:
            raise NotFound(f"no warm spare {host}")
        return spare_dict(row)

    def add(self, host: str, pool: str | None, who: str, now_ns: int) -> dict[str, Any]:
        """Ask for `host` to be kept as a warm spare (of `pool`, or of any pool)."""
        if not HOST_NAME.fullmatch(host):
            raise ValueError(f"{host!r} is not a node name (letters, digits, '.', '-', '_')")
        with self._write(fenced=False) as conn:
            found = self._row(conn, host)
            if found is not None:
                raise Conflict(f"{host} is already a warm spare ({found.status})")
            conn.execute(
                SP.insert().values(
                    tenant=self.tenant,
                    host=host,
                    pool=pool or None,
                    status=REQUESTED,
                    added_ns=now_ns,
                    added_by=who,
                    results="[]",
                    note="waits for the leader to hold it out of service and check it",
                    updated_ns=now_ns,
                )
            )
            self._audit(
                conn,
                now_ns,
                "spare.added",
                who,
                subject=f"spare {host}",
                result={"pool": pool or None},
            )
            return spare_dict(self._row(conn, host))

    def remove(self, host: str, who: str, now_ns: int) -> dict[str, Any]:
        """Ask for a spare to be given back: one never held out goes at once, the others when
        the leader has resumed them (`removing` until then)."""
        with self._write(fenced=False) as conn:
            found = self._row(conn, host)
            if found is None:
                raise NotFound(f"no warm spare {host}")
            where = sa.and_(SP.c.tenant == self.tenant, SP.c.host == host)
            if found.status in (REQUESTED, TAKEN):
                conn.execute(SP.delete().where(where))
                out = {**spare_dict(found), "status": "removed"}
            else:
                conn.execute(
                    SP.update()
                    .where(where)
                    .values(status=REMOVING, note=f"removal asked by {who}", updated_ns=now_ns)
                )
                out = spare_dict(self._row(conn, host))
            self._audit(
                conn,
                now_ns,
                "spare.removed",
                who,
                subject=f"spare {host}",
                result={"was": found.status, "now": out["status"]},
            )
            return out

    # --- the leader: load, act, save ---------------------------------------------------------

    def load(self, pool: SparePool) -> tuple[list[tuple[str, str | None]], list[str]]:
        """Put the held spares into `pool` (its clock is wall-clock seconds); returns the
        requested (host, pool) pairs to enroll and the hosts to release."""
        requested: list[tuple[str, str | None]] = []
        removing: list[str] = []
        for row in self.spares():
            if row["status"] == REQUESTED:
                requested.append((row["host"], row["pool"]))
                continue
            pool.spares[row["host"]] = Spare(
                row["host"],
                row["pool"],
                # a spare to give back is resumed whatever its last check said
                status=UNCHECKED if row["status"] == REMOVING else row["status"],
                validated_at=_seconds(row["validated_ns"]),
                checked_at=_seconds(row["checked_ns"]),
                results=list(row["results"]),
            )
            if row["status"] == REMOVING:
                removing.append(row["host"])
        return requested, removing

    def save(self, spare: Spare, kind: str | None, note: str, now_ns: int) -> bool:
        """Write what the leader's pool holds for `spare` (audited as `kind` when given);
        False when its row is gone (a human removed it meanwhile) or waits to be removed."""
        with self._write(fenced=True) as conn:
            done = conn.execute(
                SP.update()
                .where(
                    SP.c.tenant == self.tenant,
                    SP.c.host == spare.host,
                    SP.c.status != REMOVING,  # a removal asked meanwhile wins
                )
                .values(
                    status=spare.status,
                    validated_ns=_ns(spare.validated_at),
                    checked_ns=_ns(spare.checked_at),
                    results=jsonio.dumps(spare.results).decode(),
                    note=note,
                    updated_ns=now_ns,
                )
            )
            if not done.rowcount:
                return False
            if kind is not None:
                self._audit(
                    conn,
                    now_ns,
                    kind,
                    "leader",
                    subject=f"spare {spare.host}",
                    result={
                        "status": spare.status,
                        "note": note,
                        "checks": {
                            str(r.get("check")): bool(r.get("passed")) for r in spare.results
                        },
                    },
                )
            return True

    def note(self, host: str, note: str, now_ns: int) -> None:
        """Say on a requested spare why it is not held out yet (the backend refused)."""
        with self._write(fenced=True) as conn:
            conn.execute(
                SP.update()
                .where(SP.c.tenant == self.tenant, SP.c.host == host, SP.c.status == REQUESTED)
                .values(note=note, updated_ns=now_ns)
            )
            self._audit(
                conn,
                now_ns,
                "spare.enrolled",
                "leader",
                subject=f"spare {host}",
                result={"status": REQUESTED, "note": note},
            )

    def drop(self, host: str, now_ns: int) -> None:
        """The leader gave a removed spare back: its row goes."""
        with self._write(fenced=True) as conn:
            conn.execute(
                SP.delete().where(
                    SP.c.tenant == self.tenant, SP.c.host == host, SP.c.status == REMOVING
                )
            )
            self._audit(conn, now_ns, "spare.released", "leader", subject=f"spare {host}")


def _seconds(ns: int | None) -> float | None:
    return ns / 1e9 if ns is not None else None


def _ns(seconds: float | None) -> int | None:
    return int(seconds * 1e9) if seconds is not None else None


def spare_dict(row: Any) -> dict[str, Any]:
    return {
        "host": row.host,
        "pool": row.pool,
        "status": row.status,
        "added_ns": row.added_ns,
        "added_by": row.added_by,
        "validated_ns": row.validated_ns,
        "checked_ns": row.checked_ns,
        "preflight": {
            "passed": (
                all(bool(r.get("passed")) for r in jsonio.loads(row.results))
                if row.checked_ns is not None
                else None
            ),
            "checks": jsonio.loads(row.results),
        },
        "results": jsonio.loads(row.results),
        "note": row.note,
        "updated_ns": row.updated_ns,
    }
