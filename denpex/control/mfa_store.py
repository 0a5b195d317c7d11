"""Second factors in the store: a person's TOTP key (sealed by the KMS envelope, like every
stored secret), the last TOTP step accepted, the hashes of their recovery codes, and the
tenant's "second factor required" setting; enrolment, its confirmation and every use of a
recovery code are audited.

It must never keep a TOTP key or a recovery code in clear, never accept one TOTP step twice
(the step moves forward in one conditional UPDATE, so two replicas cannot both accept a code)
and never spend a recovery code without recording it.
"""

from __future__ import annotations

from base64 import urlsafe_b64decode, urlsafe_b64encode

import sqlalchemy as sa

from denpex.control import audit_log
from denpex.control import schema as s
from denpex.control.db import Database
from denpex.control.secrets import SecretStore
from denpex.enterprise import envelope, mfa, webauthn_factor


class MfaStore:
    def __init__(self, db: Database, secrets: SecretStore) -> None:
        self.db = db
        self.secrets = secrets

    @staticmethod
    def _context(tenant: str, subject: str) -> dict[str, str]:
        return {"denpex": "totp", "tenant": tenant, "subject": subject}

    # --- the tenant's setting ------------------------------------------------------------------

    def required(self, tenant: str) -> bool:
        t = s.tenant_settings
        with self.db.tenant_tx(tenant) as conn:
            value = conn.execute(sa.select(t.c.mfa_required).where(t.c.tenant == tenant)).scalar()
        return bool(value)

    def set_required(self, tenant: str, required: bool, actor: str, now_ns: int) -> None:
        t = s.tenant_settings
        with self.db.tenant_tx(tenant, write=True) as conn:
            done = conn.execute(
                t.update()
                .where(t.c.tenant == tenant)
                .values(mfa_required=required, updated_ns=now_ns)
            ).rowcount
            if not done:
                conn.execute(
                    t.insert().values(tenant=tenant, mfa_required=required, updated_ns=now_ns)
                )
        self._audit(
            "mfa.required_changed",
            tenant,
            f"tenant {tenant}",
            now_ns,
            {"required": required},
            actor=actor,
        )

    # --- a person's factor ---------------------------------------------------------------------

    def confirmed(self, tenant: str, subject: str) -> bool:
        """Whether `subject` has a second factor (a confirmed TOTP key or a security key)."""
        t = s.mfa_totp
        with self.db.tenant_tx(tenant) as conn:
            row = conn.execute(
                sa.select(t.c.confirmed_ns).where(t.c.tenant == tenant, t.c.subject == subject)
            ).first()
        return (row is not None and row.confirmed_ns is not None) or bool(
            self.security_keys(tenant, subject)
        )

    def totp_confirmed(self, tenant: str, subject: str) -> bool:
        t = s.mfa_totp
        with self.db.tenant_tx(tenant) as conn:
            row = conn.execute(
                sa.select(t.c.confirmed_ns).where(t.c.tenant == tenant, t.c.subject == subject)
            ).first()
        return row is not None and row.confirmed_ns is not None

    # --- security keys (WebAuthn) --------------------------------------------------------------

    def security_keys(self, tenant: str, subject: str) -> list[tuple[bytes, bytes, int]]:
        """(credential id, COSE public key, signature counter) of each of `subject`'s keys."""
        w = s.mfa_webauthn
        with self.db.tenant_tx(tenant) as conn:
            rows = conn.execute(
                sa.select(w.c.credential_id, w.c.public_key, w.c.sign_count).where(
                    w.c.tenant == tenant, w.c.subject == subject
                )
            ).all()
        return [(_unb64(r.credential_id), _unb64(r.public_key), int(r.sign_count)) for r in rows]

    def add_security_key(
        self, tenant: str, subject: str, key: webauthn_factor.Registered, now_ns: int
    ) -> None:
        w = s.mfa_webauthn
        with self.db.tenant_tx(tenant, write=True) as conn:
            conn.execute(
                w.insert().values(
                    tenant=tenant,
                    credential_id=_b64(key.credential_id),
                    subject=subject,
                    public_key=_b64(key.public_key),
                    sign_count=key.sign_count,
                    created_ns=now_ns,
                )
            )
        self._audit(
            "mfa.enrolled",
            tenant,
            subject,
            now_ns,
            {"factor": "webauthn", "credential": _b64(key.credential_id)[:16]},
        )

    def advance_security_key(
        self, tenant: str, subject: str, credential_id: bytes, old: int, new: int
    ) -> bool:
        """Move the key's counter from `old` to `new`, once (a racing replica loses)."""
        w = s.mfa_webauthn
        with self.db.tenant_tx(tenant, write=True) as conn:
            return bool(
                conn.execute(
                    w.update()
                    .where(
                        w.c.tenant == tenant,
                        w.c.subject == subject,
                        w.c.credential_id == _b64(credential_id),
                        w.c.sign_count == old,
                    )
                    .values(sign_count=new)
                ).rowcount
            )

    def begin(self, tenant: str, subject: str, now_ns: int) -> str:
        """A fresh TOTP key for `subject` (replacing one not confirmed yet); MfaError when a
        confirmed one exists (an admin resets it, not the session)."""
        if self.totp_confirmed(tenant, subject):
            raise mfa.MfaError("a TOTP factor is enrolled already")
        secret = mfa.new_totp_secret()
        sealed = envelope.seal(self.secrets.kms, secret.encode(), self._context(tenant, subject))
        t = s.mfa_totp
        with self.db.tenant_tx(tenant, write=True) as conn:
            conn.execute(t.delete().where(t.c.tenant == tenant, t.c.subject == subject))
            conn.execute(
                t.insert().values(
                    tenant=tenant, subject=subject, sealed=sealed, created_ns=now_ns, last_step=0
                )
            )
        return secret

    def _key(self, tenant: str, subject: str) -> tuple[str, int, bool] | None:
        t = s.mfa_totp
        with self.db.tenant_tx(tenant) as conn:
            row = conn.execute(
                sa.select(t.c.sealed, t.c.last_step, t.c.confirmed_ns).where(
                    t.c.tenant == tenant, t.c.subject == subject
                )
            ).first()
        if row is None:
            return None
        secret = envelope.open_sealed(self.secrets.kms, row.sealed, self._context(tenant, subject))
        return secret.decode(), int(row.last_step), row.confirmed_ns is not None

    def _advance(self, tenant: str, subject: str, code: str, now_ns: int, **values: int) -> bool:
        found = self._key(tenant, subject)
        if found is None:
            return False
        accepted = mfa.verify_totp(found[0], code, found[1], now_ns / 1e9)
        if accepted is None:
            return False
        t = s.mfa_totp
        with self.db.tenant_tx(tenant, write=True) as conn:
            moved = conn.execute(
                t.update()
                .where(t.c.tenant == tenant, t.c.subject == subject, t.c.last_step < accepted.step)
                .values(last_step=accepted.step, **values)
            ).rowcount
        return bool(moved)

    def confirm(self, tenant: str, subject: str, code: str, now_ns: int) -> list[str] | None:
        """Confirm the enrolment with a first code: the recovery codes (shown once), or None
        when the code is wrong."""
        found = self._key(tenant, subject)
        if found is None or found[2]:
            return None
        if not self._advance(tenant, subject, code, now_ns, confirmed_ns=now_ns):
            return None
        codes = mfa.new_recovery_codes()
        r = s.mfa_recovery
        with self.db.tenant_tx(tenant, write=True) as conn:
            conn.execute(r.delete().where(r.c.tenant == tenant, r.c.subject == subject))
            for code_ in codes:
                conn.execute(
                    r.insert().values(
                        tenant=tenant, subject=subject, code_hash=mfa.hash_recovery_code(code_)
                    )
                )
        self._audit(
            "mfa.enrolled",
            tenant,
            subject,
            now_ns,
            {"factor": "totp", "recovery_codes": len(codes)},
        )
        return codes

    def verify(self, tenant: str, subject: str, code: str, now_ns: int) -> str | None:
        """'totp' or 'recovery' when `code` is a good TOTP code or an unspent recovery code
        of a confirmed factor, else None."""
        found = self._key(tenant, subject)
        if found is None or not found[2]:
            return None
        if code.strip().isdigit():
            return "totp" if self._advance(tenant, subject, code, now_ns) else None
        r = s.mfa_recovery
        with self.db.tenant_tx(tenant, write=True) as conn:
            rows = conn.execute(
                sa.select(r.c.code_hash).where(
                    r.c.tenant == tenant, r.c.subject == subject, r.c.used_ns.is_(None)
                )
            ).all()
            hit = next(
                (x.code_hash for x in rows if mfa.recovery_code_matches(code, x.code_hash)), None
            )
            if hit is None:
                return None
            spent = conn.execute(
                r.update()
                .where(
                    r.c.tenant == tenant,
                    r.c.subject == subject,
                    r.c.code_hash == hit,
                    r.c.used_ns.is_(None),
                )
                .values(used_ns=now_ns)
            ).rowcount
        if not spent:
            return None
        left = len(rows) - 1
        self._audit("mfa.recovery_used", tenant, subject, now_ns, {"left": left})
        return "recovery"

    def _audit(
        self,
        kind: str,
        tenant: str,
        subject: str,
        now_ns: int,
        result: dict,
        *,
        actor: str | None = None,
    ) -> None:
        """One record of the tenant's audit chain (the person acts, unless `actor` says)."""
        with self.db.system_tx(write=True) as conn:
            audit_log.append(
                conn,
                ts_ns=now_ns,
                kind=kind,
                actor=actor or subject,
                tenant=tenant,
                subject=subject,
                result=result,
            )


def _b64(data: bytes) -> str:
    return urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return urlsafe_b64decode(text + "=" * (-len(text) % 4))
