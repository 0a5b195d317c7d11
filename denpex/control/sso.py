"""Single sign-on in the store: the SAML service provider's ledger (the AuthnRequest ids it
issued, each answered once, and the assertion ids it accepted, each accepted once, shared by
every replica), and the session a verified SSO sign-in opens: a bearer token that stands for
the person (`owner` saml:<name id>), lives as long as the session and dies with a logout or a
deprovisioning.

It must never accept an id twice (the row is claimed in one statement, so two replicas
racing on one assertion cannot both win), and never hand the session token to anyone but the
browser's sealed session.
"""

from __future__ import annotations

import sqlalchemy as sa

from denpex.control import schema as s
from denpex.control.db import Database
from denpex.control.store import Store
from denpex.enterprise import mint_token


class StoreSamlLedger:
    def __init__(self, db: Database) -> None:
        self.db = db

    def remember_request(self, request_id: str, expires_ns: int) -> None:
        t = s.saml_ids
        with self.db.system_tx(write=True) as conn:
            conn.execute(t.delete().where(t.c.expires_ns < expires_ns - 86_400 * 10**9))
            conn.execute(t.insert().values(id=f"req:{request_id}", kind="request",
                                           expires_ns=expires_ns))  # fmt: skip

    def take_request(self, request_id: str, now_ns: int) -> bool:
        t = s.saml_ids
        with self.db.system_tx(write=True) as conn:
            claimed = conn.execute(
                t.update()
                .where(
                    t.c.id == f"req:{request_id}",
                    t.c.kind == "request",
                    t.c.used_ns.is_(None),
                    t.c.expires_ns > now_ns,
                )
                .values(used_ns=now_ns)
            ).rowcount
        return bool(claimed)

    def first_use(self, assertion_id: str, expires_ns: int, now_ns: int) -> bool:
        t = s.saml_ids
        try:
            with self.db.system_tx(write=True) as conn:
                conn.execute(
                    t.insert().values(
                        id=f"assertion:{assertion_id}",
                        kind="assertion",
                        expires_ns=max(expires_ns, now_ns),
                        used_ns=now_ns,
                    )
                )
        except sa.exc.IntegrityError:
            return False
        return True


def open_session_token(
    store: Store, tenant: str, role: str, owner: str, now_ns: int, lifetime_s: int, how: str
) -> str:
    """Mint the bearer token of one SSO session (recorded as token.created)."""
    minted = mint_token()
    store.add_token(
        minted.token_id,
        tenant,
        role,
        minted.secret_hash,
        now_ns,
        note=f"{how} session",
        owner=owner,
        expires_ns=now_ns + lifetime_s * 1_000_000_000,
        actor=owner,
    )
    return minted.token
