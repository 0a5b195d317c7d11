"""Bearer tokens: minting, parsing and hashing. A token is `dpx_<id>_<secret>`; only the id
and a SHA-256 of the secret are ever stored, so a copy of the database grants nothing.

It must never log or store a secret, and never compare hashes in variable time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "dpx_"
_TOKEN = re.compile(r"^dpx_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class MintedToken:
    token_id: str
    secret_hash: str
    token: str  # shown once to the person who asked for it, never stored


def hash_secret(secret: str) -> str:
    # The secret is 256 random bits: a fast hash is enough (nothing to brute-force).
    return hashlib.sha256(secret.encode()).hexdigest()


def mint_token() -> MintedToken:
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return MintedToken(token_id, hash_secret(secret), f"{PREFIX}{token_id}_{secret}")


def parse_token(token: str) -> tuple[str, str] | None:
    """(token id, secret) of a well-formed token, else None."""
    match = _TOKEN.match(token.strip())
    return (match.group(1), match.group(2)) if match else None


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)
