"""Layer 7 as a library: who is asking (authentication), what they may do (authorisation) and
which tenant they are bound to. The control plane calls it before any storage access.

It must never touch storage itself: token records come through a TokenDirectory the caller
supplies, so SSO providers (OIDC, SAML) can be added beside bearer tokens later.
"""

from denpex.enterprise.auth import (
    AuthError,
    Principal,
    TokenDirectory,
    TokenRecord,
    authenticate,
    authorize,
    is_authentic,
)
from denpex.enterprise.roles import ROLES, actions_of
from denpex.enterprise.tokens import MintedToken, hash_secret, mint_token, parse_token

__all__ = [
    "ROLES",
    "AuthError",
    "MintedToken",
    "Principal",
    "TokenDirectory",
    "TokenRecord",
    "actions_of",
    "authenticate",
    "authorize",
    "hash_secret",
    "is_authentic",
    "mint_token",
    "parse_token",
]
