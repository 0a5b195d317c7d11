"""Second factors for interactive sign-ins: TOTP (RFC 6238, pyotp: 30 s steps, 6 digits, a
step of clock skew either way) and one-time recovery codes, stored as scrypt hashes with a
salt each, so a copy of the database yields neither a code nor a way to check one quickly.

Pure: secrets, codes and hashes in, verdicts out; it never stores anything (the control
plane keeps the sealed TOTP key, the last accepted step and the hashes). It must never
accept a TOTP step at or before the last one accepted (a code is good once), and never
compare a code or hash in variable time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

STEP_S = 30
DIGITS = 6
SKEW_STEPS = 1  # a code of the step before or after is still good (clock drift, typing time)
RECOVERY_CODES = 10
_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: read off paper
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


class MfaError(Exception):
    """A second factor that cannot be used (the message says what to do)."""


def _pyotp():
    try:
        import pyotp
    except ImportError:  # pragma: no cover - the message is the point
        raise MfaError("TOTP needs pyotp: pip install 'denpex[mfa]'") from None
    return pyotp


def new_totp_secret() -> str:
    """A fresh TOTP key (base32, 160 bits, as authenticator apps expect)."""
    return str(_pyotp().random_base32(length=32))


def provisioning_uri(secret: str, account: str, issuer: str = "denpex") -> str:
    """The otpauth:// URI an authenticator app reads (typed or as a QR code)."""
    return str(_pyotp().TOTP(secret, digits=DIGITS, interval=STEP_S).provisioning_uri(
        name=account, issuer_name=issuer))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Accepted:
    step: int  # the TOTP time step the code belonged to: store it as the last one accepted


def verify_totp(
    secret: str, code: str, last_step: int, now: float | None = None
) -> Accepted | None:
    """The step `code` is good for, when it is one after `last_step`; else None."""
    code = code.strip().replace(" ", "")
    if len(code) != DIGITS or not code.isdigit():
        return None
    totp = _pyotp().TOTP(secret, digits=DIGITS, interval=STEP_S)
    at = time.time() if now is None else now
    current = int(at // STEP_S)
    found = None
    for step in range(current - SKEW_STEPS, current + SKEW_STEPS + 1):
        if hmac.compare_digest(totp.at(step * STEP_S), code) and step > last_step:
            found = step  # no early exit: the time taken does not depend on which matched
    return Accepted(found) if found is not None else None


def new_recovery_codes(count: int = RECOVERY_CODES) -> list[str]:
    """Codes shown once to the person (about 50 bits each: xxxxx-xxxxx)."""

    def one() -> str:
        raw = "".join(secrets.choice(_ALPHABET) for _ in range(10))
        return f"{raw[:5]}-{raw[5:]}"

    return [one() for _ in range(count)]


def hash_recovery_code(code: str, salt: bytes | None = None) -> str:
    """`salt-hex$scrypt-hex` of a normalised code."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(_normal(code).encode(), salt=salt, **_SCRYPT)  # type: ignore[arg-type]
    return f"{salt.hex()}${digest.hex()}"


def recovery_code_matches(code: str, stored: str) -> bool:
    salt_hex, _, digest_hex = stored.partition("$")
    try:
        salt = bytes.fromhex(salt_hex)
    except ValueError:
        return False
    candidate = hash_recovery_code(code, salt).partition("$")[2]
    return hmac.compare_digest(candidate, digest_hex)


def _normal(code: str) -> str:
    return code.strip().lower().replace(" ", "")
