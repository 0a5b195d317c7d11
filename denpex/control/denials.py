"""The denial log in the store: the DenialLog that denpex.enterprise.authorize() writes every
refused request to, and a tenant's view of it (`GET /api/v1/denials`, action audit:read).

A denial is written in its own tenant transaction (row-level security applies in
PostgreSQL), so a refused request leaves its trace even though nothing else is stored. It must
never fail the request it records (the 403 stands; a failed write is logged and counted), and
never store a token's secret (only `token:<id>`).
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.core import jsonio
from denpex.enterprise import Denial, Principal, is_authentic

log = logging.getLogger("denpex.server")


class DenialStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.failed_writes = 0

    def record_denial(self, denial: Denial) -> None:
        if not denial.tenant:  # an anonymous caller: no tenant to file it under
            log.warning("denied %s to %s: %s", denial.action, denial.principal, denial.message)
            return
        try:
            with self.db.tenant_tx(denial.tenant, write=True) as conn:
                conn.execute(
                    s.denials.insert().values(
                        tenant=denial.tenant,
                        ts_ns=denial.ts_ns,
                        principal=denial.principal,
                        role=denial.role,
                        action=denial.action,
                        resource=denial.resource,
                        attrs=jsonio.dumps(denial.attrs).decode(),
                        policies=jsonio.dumps(list(denial.policies)).decode(),
                        policy_version=denial.version,
                        message=denial.message,
                    )
                )
        except sa.exc.SQLAlchemyError as exc:
            self.failed_writes += 1
            log.error("could not record a denial of %s: %s", denial.action, type(exc).__name__)

    def list(
        self, principal: Principal, *, limit: int = 100, before: int | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        """The newest denials of `principal`'s tenant (older than id `before`), and the id to
        pass as `before` for the next page (None at the end)."""
        if not is_authentic(principal):
            raise PermissionError("the denial log needs a Principal from denpex.enterprise")
        t = s.denials
        query = sa.select(t).where(t.c.tenant == principal.tenant)
        if before is not None:
            query = query.where(t.c.id < before)
        query = query.order_by(t.c.id.desc()).limit(limit + 1)
        with self.db.tenant_tx(principal.tenant) as conn:
            rows = conn.execute(query).all()
        items = [
            {
                "id": r.id,
                "ts_ns": r.ts_ns,
                "principal": r.principal,
                "role": r.role,
                "action": r.action,
                "resource": r.resource,
                "attrs": jsonio.loads(r.attrs),
                "policies": jsonio.loads(r.policies),
                "policy_version": r.policy_version,
                "message": r.message,
            }
            for r in rows[:limit]
        ]
        return items, (items[-1]["id"] if len(rows) > limit else None)
