"""Identity acts in the hash-chained audit (denpex.core.audit, stored by audit_log): every
sign-in to the web UI and every refused one, sign-outs, role changes and changes of the
identity-provider mappings that give groups their roles. One record per act, in the act's
own transaction where there is one, so `denpex audit verify` covers who got in and as what.

It must never put a credential in a record (a token appears as its id, an assertion as its
subject), never say which check refused a sign-in, and never let a successful sign-in stand
when its record could not be written.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from denpex.control import audit_log
from denpex.control import schema as s
from denpex.control.db import Database
from denpex.core import audit
from denpex.enterprise import Principal, TokenDirectory
from denpex.enterprise.tokens import parse_token

log = logging.getLogger("denpex.server")


class IdentityAudit:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.failed_writes = 0

    def _append(self, conn: Connection | None, **fields: Any) -> None:
        if conn is not None:
            audit_log.append(conn, **fields)
            return
        with self.db.system_tx(write=True) as own:
            audit_log.append(own, **fields)

    def login(self, principal: Principal, method: str, now_ns: int, **detail: Any) -> None:
        """A sign-in that succeeded; raises when the record cannot be written (the caller
        then refuses the sign-in: no unaudited way in)."""
        self._append(
            None,
            ts_ns=now_ns,
            kind="login.succeeded",
            actor=principal.label,
            tenant=principal.tenant,
            subject=principal.label,
            result={"method": method, "role": principal.role, **detail},
        )

    def login_failed(
        self,
        method: str,
        now_ns: int,
        *,
        credential: str = "",
        directory: TokenDirectory | None = None,
        subject: str = "",
        tenant: str | None = None,
    ) -> None:
        """A refused sign-in: filed under the tenant of the token it named, when the token id
        is one the directory knows; never fails the (already refused) request."""
        parsed = parse_token(credential) if credential else None
        if parsed is not None:
            subject = f"token:{parsed[0]}"
            record = directory.find_token(parsed[0]) if directory is not None else None
            tenant = record.tenant if record is not None else tenant
        try:
            self._append(
                None,
                ts_ns=now_ns,
                kind="login.failed",
                actor=subject or "anonymous",
                tenant=tenant,
                subject=subject or "unknown",
                result={"method": method},
            )
        except sa.exc.SQLAlchemyError as exc:
            self.failed_writes += 1
            log.error("could not record a refused sign-in: %s", type(exc).__name__)

    def login_throttled(
        self,
        method: str,
        now_ns: int,
        *,
        scope: str,
        subject: str,
        refusals: int,
        window_s: float,
        tenant: str | None = None,
    ) -> None:
        """A source (address) or account (token id) reached its limit of refused sign-ins:
        one record per window; further tries are answered 429 without one each."""
        try:
            self._append(
                None,
                ts_ns=now_ns,
                kind="login.throttled",
                actor=subject,
                tenant=tenant,
                subject=subject,
                result={
                    "method": method,
                    "scope": scope,
                    "refusals": refusals,
                    "window_s": window_s,
                },
            )
        except sa.exc.SQLAlchemyError as exc:
            self.failed_writes += 1
            log.error("could not record a throttled sign-in: %s", type(exc).__name__)

    def logout(self, principal: Principal, now_ns: int, *, revoked: bool = False) -> None:
        self._append(
            None,
            ts_ns=now_ns,
            kind="logout",
            actor=principal.label,
            tenant=principal.tenant,
            subject=principal.label,
            result={"token_revoked": revoked},
        )

    def role_changed(
        self,
        tenant: str,
        subject: str,
        old: str | None,
        new: str | None,
        *,
        by: str,
        now_ns: int,
        conn: Connection | None = None,
        why: Mapping[str, Any] | None = None,
    ) -> None:
        """A person's role in `tenant` went from `old` to `new` (None: no role)."""
        self._append(
            conn,
            ts_ns=now_ns,
            kind="role.changed",
            actor=by,
            tenant=tenant,
            subject=subject,
            why=why or {},
            result={"old": old, "new": new},
        )

    def sync_mappings(
        self, source: str, rules: Mapping[str, Sequence[Mapping[str, Any]]], now_ns: int
    ) -> list[str]:
        """Record, per tenant, the mapping rules of identity provider `source` (oidc, saml)
        when they differ from the last ones recorded (a tenant that lost all its rules
        included); returns the tenants recorded. Run at server start."""
        changed = []
        with self.db.system_tx(write=True) as conn:
            known = last_mappings(conn, source)
            for tenant in sorted(set(known) | set(rules)):
                new = [dict(r) for r in rules.get(tenant, ())]
                digest = mappings_digest(new)
                old = known.get(tenant)
                if old == digest or (old is None and not new):
                    continue
                audit_log.append(
                    conn,
                    ts_ns=now_ns,
                    kind="identity.mappings",
                    actor="config",
                    tenant=tenant,
                    subject=f"{source} mappings",
                    result={"source": source, "old": old, "new": digest, "rules": new},
                )
                changed.append(tenant)
        return changed


def mappings_digest(rules: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(audit.canonical(list(rules))).hexdigest()


def last_mappings(conn: Connection, source: str) -> dict[str, str]:
    """Per tenant, the digest of the last `identity.mappings` record for `source`."""
    rows = conn.execute(
        sa.select(s.audit.c.tenant, s.audit.c.line)
        .where(s.audit.c.kind == "identity.mappings")
        .order_by(s.audit.c.seq)
    ).all()
    found: dict[str, str] = {}
    for row in rows:
        result = orjson.loads(row.line).get("result") or {}
        if result.get("source") == source and row.tenant:
            found[row.tenant] = str(result.get("new"))
    return found
