"""The server's secret store: a tenant's stored secrets (webhook URLs, IdP client secrets),
sealed by denpex.enterprise.envelope under the configured KMS before they reach the store,
opened only inside the server for the code that uses them, never returned by the API.
`rotate_and_rewrap()` rotates the KMS key and re-wraps every tenant's data keys, one row per
transaction, while the server keeps serving.

It must never put a secret's value in a log line, an error, a response or the store in clear,
and never open one under another tenant's name.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.enterprise import Principal, envelope, is_authentic
from denpex.enterprise.kms import Kms

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
MAX_VALUE = 8192


class SecretError(ValueError):
    """A request about a secret that cannot be done (the value is never part of it)."""


class SecretStore:
    def __init__(self, db: Database, open_kms: Callable[[], Kms]) -> None:
        self.db = db
        self._open_kms = open_kms
        self._kms: Kms | None = None
        self._lock = threading.Lock()

    @property
    def kms(self) -> Kms:
        with self._lock:  # opened at first use: a server with no secrets needs no KMS
            if self._kms is None:
                self._kms = self._open_kms()
            return self._kms

    @staticmethod
    def _context(tenant: str, name: str) -> dict[str, str]:
        return {"denpex": "secret", "tenant": tenant, "name": name}

    def _tenant(self, principal: Principal) -> str:
        if not is_authentic(principal):
            raise PermissionError("the secret store needs a Principal from denpex.enterprise")
        return principal.tenant

    def put(self, principal: Principal, name: str, value: str, now_ns: int) -> dict[str, Any]:
        tenant = self._tenant(principal)
        if not NAME.match(name):
            raise SecretError("a secret's name is 1-64 of a-z 0-9 . _ - (starting alphanumeric)")
        if not value or len(value) > MAX_VALUE:
            raise SecretError(f"a secret's value is 1-{MAX_VALUE} characters")
        sealed = envelope.seal(self.kms, value.encode(), self._context(tenant, name))
        row = {"sealed": sealed, "key_ref": envelope.key_ref(sealed), "updated_ns": now_ns}
        with self.db.tenant_tx(tenant, write=True) as conn:
            t = s.secrets
            done = conn.execute(
                t.update().where(t.c.tenant == tenant, t.c.name == name).values(**row)
            ).rowcount
            if not done:
                conn.execute(t.insert().values(tenant=tenant, name=name, **row))
        return {"name": name, "key_ref": row["key_ref"], "updated_ns": now_ns}

    def names(self, principal: Principal) -> list[dict[str, Any]]:
        tenant = self._tenant(principal)
        t = s.secrets
        query = sa.select(t.c.name, t.c.key_ref, t.c.updated_ns).where(t.c.tenant == tenant)
        with self.db.tenant_tx(tenant) as conn:
            rows = conn.execute(query.order_by(t.c.name)).all()
        return [{"name": r.name, "key_ref": r.key_ref, "updated_ns": r.updated_ns} for r in rows]

    def delete(self, principal: Principal, name: str) -> bool:
        tenant = self._tenant(principal)
        t = s.secrets
        with self.db.tenant_tx(tenant, write=True) as conn:
            return bool(
                conn.execute(t.delete().where(t.c.tenant == tenant, t.c.name == name)).rowcount
            )

    def reveal(self, tenant: str, name: str) -> str | None:
        """The value, for the server's own use (a webhook sender); None when not stored."""
        t = s.secrets
        with self.db.tenant_tx(tenant) as conn:
            sealed = conn.execute(
                sa.select(t.c.sealed).where(t.c.tenant == tenant, t.c.name == name)
            ).scalar()
        if sealed is None:
            return None
        return envelope.open_sealed(self.kms, sealed, self._context(tenant, name)).decode()

    def rotate_and_rewrap(self, tenants: list[str], now_ns: int) -> int:
        """Rotate the KMS key, then re-wrap every stored data key under it; returns how many.
        Each row is its own transaction: readers see the old or the new wrap, both open."""
        self.kms.rotate()
        t = s.secrets
        done = 0
        for tenant in tenants:
            with self.db.tenant_tx(tenant) as conn:
                names = list(
                    conn.execute(sa.select(t.c.name).where(t.c.tenant == tenant)).scalars()
                )
            for name in names:
                with self.db.tenant_tx(tenant, write=True) as conn:
                    sealed = conn.execute(
                        sa.select(t.c.sealed).where(t.c.tenant == tenant, t.c.name == name)
                    ).scalar()
                    if sealed is None:
                        continue
                    fresh = envelope.rewrap(self.kms, sealed, self._context(tenant, name))
                    conn.execute(
                        t.update()
                        .where(t.c.tenant == tenant, t.c.name == name)
                        .values(sealed=fresh, key_ref=envelope.key_ref(fresh))
                    )
                    done += 1
        return done
