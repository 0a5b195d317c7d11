"""Evidence bodies marked sensitive (the OTLP log attribute `denpex.sensitive: true`): sealed
at rest under the tenant's own data key before the row reaches the store, for every ingest
path (OTLP/HTTP, job reports, the bus); opened only for a request the policy set allows
`evidence:read_sensitive`. The tenant's data key is made at its first sensitive body, kept
only wrapped by the KMS (table tenant_keys) and unwrapped into this process's memory;
`rewrap()` moves it under the KMS's current key after a rotation, leaving the bodies as they
are. Pages, searches and exports show the body withheld.

It must never store a sensitive body in clear, never open one under another tenant's key,
and never put a body or a data key into a log line or an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from denpex.control import audit_log
from denpex.control import schema as s
from denpex.control.db import Database
from denpex.core import jsonio
from denpex.enterprise import Principal, envelope
from denpex.enterprise.kms import Kms, KmsError

MARK = "denpex.sensitive"
PURPOSE = "evidence"
WITHHELD = "[sensitive: sealed at rest; read it with ?reveal=true and evidence:read_sensitive]"
BODY, ID, ATTRS = 15, 1, 16  # positions in a row of schema.evidence


def marked(attrs_json: str) -> bool:
    """Whether an evidence row's attributes mark its body sensitive."""
    if MARK not in attrs_json:  # most rows: no JSON parse
        return False
    value = jsonio.loads(attrs_json).get("attrs", {}).get(MARK)
    return value is True or str(value).lower() in ("true", "1", "yes")


def _key_context(tenant: str) -> dict[str, str]:
    return {"denpex": "tenant-key", "purpose": PURPOSE, "tenant": tenant}


def _body_context(tenant: str, evidence_id: str) -> dict[str, str]:
    return {"denpex": "evidence-body", "tenant": tenant, "id": evidence_id}


class SensitiveEvidence:
    def __init__(self, db: Database, kms: Callable[[], Kms]) -> None:
        self.db = db
        self._kms = kms
        self._lock = threading.Lock()
        self._keys: dict[str, bytes] = {}  # tenant → its data key, unwrapped

    def _data_key(self, tenant: str, *, create: bool) -> bytes | None:
        with self._lock:
            found = self._keys.get(tenant)
        if found is not None:
            return found
        t = s.tenant_keys
        where = (t.c.tenant == tenant, t.c.purpose == PURPOSE)
        with self.db.tenant_tx(tenant) as conn:
            wrapped = conn.execute(sa.select(t.c.wrapped).where(*where)).scalar()
        if wrapped is None:
            if not create:
                return None
            key = AESGCM.generate_key(256)
            made = self._kms().wrap(key, _key_context(tenant))
            try:
                with self.db.tenant_tx(tenant, write=True) as conn:
                    conn.execute(
                        t.insert().values(
                            tenant=tenant,
                            purpose=PURPOSE,
                            wrapped=envelope.wrapped_text(made),
                            key_ref=made.key_ref,
                            created_ns=time.time_ns(),
                        )
                    )
            except sa.exc.IntegrityError:  # another replica made it first: use theirs
                return self._data_key(tenant, create=False)
            data_key = key
        else:
            data_key = self._kms().unwrap(envelope.wrapped_of(wrapped), _key_context(tenant))
        with self._lock:
            self._keys[tenant] = data_key
        return data_key

    def seal_rows(self, tenant: str, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The rows with each sensitive body sealed (the others as they are)."""
        out = list(rows)
        for i, row in enumerate(out):
            if row[BODY] and marked(row[ATTRS]) and not envelope.is_sealed_value(row[BODY]):
                key = self._data_key(tenant, create=True)
                assert key is not None
                sealed = envelope.seal_value(
                    key, str(row[BODY]).encode(), _body_context(tenant, row[ID])
                )
                out[i] = (*row[:BODY], sealed, *row[BODY + 1 :])
        return out

    def open_body(self, tenant: str, evidence_id: str, sealed: str) -> str:
        """The clear body of a sealed one (the caller has the decision to read it)."""
        key = self._data_key(tenant, create=False)
        if key is None:
            raise KmsError(f"tenant {tenant!r} has no evidence data key")
        return envelope.open_value(key, sealed, _body_context(tenant, evidence_id)).decode()

    def rewrap(self, tenants: Sequence[str], now_ns: int) -> int:
        """Re-wrap each tenant's data key under the KMS's current key (after a rotation);
        returns how many. The sealed bodies are not touched."""
        kms = self._kms()
        t = s.tenant_keys
        done = 0
        for tenant in tenants:
            where = (t.c.tenant == tenant, t.c.purpose == PURPOSE)
            with self.db.tenant_tx(tenant, write=True) as conn:
                wrapped = conn.execute(sa.select(t.c.wrapped).where(*where)).scalar()
                if wrapped is None:
                    continue
                fresh = kms.rewrap(envelope.wrapped_of(wrapped), _key_context(tenant))
                conn.execute(
                    t.update()
                    .where(*where)
                    .values(
                        wrapped=envelope.wrapped_text(fresh),
                        key_ref=fresh.key_ref,
                        rewrapped_ns=now_ns,
                    )
                )
                done += 1
        return done

    def audit_reveal(self, who: Principal, evidence_id: str) -> None:
        """The hash-chained audit's record that `who` read a sensitive body (never the body)."""
        with self.db.system_tx(write=True) as conn:
            audit_log.append(
                conn,
                ts_ns=time.time_ns(),
                kind="evidence.revealed",
                actor=who.label,
                tenant=who.tenant,
                subject=evidence_id,
                result={"role": who.role},
            )

    def key_ref(self, tenant: str) -> str | None:
        """Which KEK (version) the tenant's data key is wrapped under; None: it has none."""
        t = s.tenant_keys
        with self.db.tenant_tx(tenant) as conn:
            return conn.execute(
                sa.select(t.c.key_ref).where(t.c.tenant == tenant, t.c.purpose == PURPOSE)
            ).scalar()
