"""Layer 7 as a library: who is asking (authentication), what they may do (authorisation by
the Cedar policy set in policies/) and which tenant they are bound to. The control plane
calls it before any storage access.

It must never touch storage itself: token records come through a TokenDirectory and denials
go to a DenialLog, both supplied by the caller, so SSO providers (OIDC, SAML) can be added
beside bearer tokens.

The names load with the module that defines them, on first use (PEP 562): every denpex
command's help names the bundled roles (`denpex.enterprise.policy`), and loading the
authentication stack (Authlib, the HTTP and KMS clients) too would add a tenth of a second
to `denpex run`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from denpex.enterprise.auth import (
        AuthError,
        Principal,
        TokenDirectory,
        TokenRecord,
        authenticate,
        authenticate_bus_message,
        is_authentic,
    )
    from denpex.enterprise.authz import (
        ANONYMOUS,
        Anonymous,
        Decision,
        Denial,
        DenialLog,
        Resource,
        authorize,
        decide,
        request_context,
    )
    from denpex.enterprise.kms import Kms, KmsError, open_kms
    from denpex.enterprise.oidc import (
        Identity,
        OidcConfig,
        OidcConfigError,
        OidcError,
        OidcVerifier,
    )
    from denpex.enterprise.policy import PolicyError, PolicySet, bundled_roles, load_policies
    from denpex.enterprise.tokens import MintedToken, hash_secret, mint_token, parse_token

__all__ = [
    "ANONYMOUS",
    "Anonymous",
    "AuthError",
    "Decision",
    "Denial",
    "DenialLog",
    "Identity",
    "Kms",
    "KmsError",
    "MintedToken",
    "OidcConfig",
    "OidcConfigError",
    "OidcError",
    "OidcVerifier",
    "PolicyError",
    "PolicySet",
    "Principal",
    "Resource",
    "TokenDirectory",
    "TokenRecord",
    "authenticate",
    "authenticate_bus_message",
    "authorize",
    "bundled_roles",
    "decide",
    "hash_secret",
    "is_authentic",
    "load_policies",
    "mint_token",
    "open_kms",
    "parse_token",
    "request_context",
]

# where __getattr__ looks for a name, the modules that load the least first
_MODULES = ("policy", "tokens", "authz", "kms", "oidc", "auth")


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in _MODULES:
            found = importlib.import_module(f"{__name__}.{module}")
            if hasattr(found, name):
                globals()[name] = value = getattr(found, name)  # looked up once
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
