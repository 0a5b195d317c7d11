"""What the remediation tables' stores share: a handle bound to one tenant (an authenticated
Principal's, or the leader's with its epoch fence), writes in a system transaction that
checks the fence when the leader writes, and audit records in that same transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from sqlalchemy.engine import Connection

from denpex.control import audit_log
from denpex.control.db import Database
from denpex.control.store import Fence, check_fence
from denpex.enterprise import Principal, is_authentic


class FencedTenantStore:
    subject = "this store"  # what the refusals name

    def __init__(self, db: Database, tenant: str, fence: Fence | None) -> None:
        self.db, self.tenant, self.fence = db, tenant, fence

    @classmethod
    def scoped(cls, db: Database, principal: Principal) -> Self:
        if not is_authentic(principal):
            raise PermissionError(f"{cls.subject} needs a Principal from denpex.enterprise")
        return cls(db, principal.tenant, None)

    @contextmanager
    def _write(self, *, fenced: bool) -> Iterator[Connection]:
        with self.db.system_tx(write=True) as conn:
            if fenced:
                if self.fence is None:
                    raise PermissionError(f"the leader writes {self.subject} behind its fence")
                check_fence(conn, self.fence, postgres=self.db.postgres)
            yield conn

    def _audit(self, conn: Connection, now_ns: int, kind: str, actor: str, **fields: Any) -> None:
        audit_log.append(conn, ts_ns=now_ns, kind=kind, actor=actor, tenant=self.tenant, **fields)
