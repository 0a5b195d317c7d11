"""WebAuthn as a second factor (py_webauthn, W3C WebAuthn Level 2): the options a browser
passes to `navigator.credentials.create()` / `.get()` and the check of what the authenticator
answered: the challenge this server issued, the origin and RP id, the signature over the
authenticator data with the credential's public key, and a signature counter that only moves
forward (a cloned authenticator is refused).

Pure: options, answers and stored keys in, verdicts out; it stores nothing (the control plane
keeps credential ids, public keys and counters, and the pending challenge in the sealed
session). It must never accept an answer to a challenge it did not issue, nor one whose
counter did not advance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from denpex.enterprise.mfa import MfaError


def _lib() -> Any:
    try:
        import webauthn
    except ImportError:  # pragma: no cover - the message is the point
        raise MfaError("WebAuthn needs py_webauthn: pip install 'denpex[mfa]'") from None
    return webauthn


@dataclass(frozen=True, slots=True)
class Registered:
    credential_id: bytes
    public_key: bytes
    sign_count: int


def registration_options(
    rp_id: str, rp_name: str, user_id: bytes, user_name: str, exclude: list[bytes]
) -> tuple[str, bytes]:
    """(options JSON for navigator.credentials.create, the challenge to keep)."""
    lib = _lib()
    from webauthn.helpers.structs import (
        AttestationConveyancePreference,
        PublicKeyCredentialDescriptor,
    )

    options = lib.generate_registration_options(
        rp_id=rp_id,
        rp_name=rp_name,
        user_id=user_id,
        user_name=user_name,
        attestation=AttestationConveyancePreference.NONE,
        exclude_credentials=[PublicKeyCredentialDescriptor(id=c) for c in exclude],
    )
    return lib.options_to_json(options), bytes(options.challenge)


def verify_registration(
    answer: str | dict[str, Any], challenge: bytes, rp_id: str, origin: str
) -> Registered:
    lib = _lib()
    try:
        verified = lib.verify_registration_response(
            credential=_as_json(answer),
            expected_challenge=challenge,
            expected_rp_id=rp_id,
            expected_origin=origin,
        )
    except Exception as exc:  # py_webauthn raises its own errors and ValueError
        raise MfaError(f"the authenticator's registration was refused: {exc}") from None
    return Registered(
        bytes(verified.credential_id), bytes(verified.credential_public_key), verified.sign_count
    )


def authentication_options(rp_id: str, allow: list[bytes]) -> tuple[str, bytes]:
    """(options JSON for navigator.credentials.get, the challenge to keep)."""
    lib = _lib()
    from webauthn.helpers.structs import PublicKeyCredentialDescriptor

    options = lib.generate_authentication_options(
        rp_id=rp_id, allow_credentials=[PublicKeyCredentialDescriptor(id=c) for c in allow]
    )
    return lib.options_to_json(options), bytes(options.challenge)


def credential_id_of(answer: str | dict[str, Any]) -> bytes:
    """The raw id of the credential an answer names (to find its stored key)."""
    lib = _lib()
    raw = json.loads(_as_json(answer)).get("rawId") or ""
    try:
        return bytes(lib.base64url_to_bytes(str(raw)))
    except ValueError:
        raise MfaError("the answer names no credential") from None


def verify_authentication(
    answer: str | dict[str, Any],
    challenge: bytes,
    rp_id: str,
    origin: str,
    public_key: bytes,
    sign_count: int,
) -> int:
    """The credential's new signature counter, when the answer checks out."""
    lib = _lib()
    try:
        verified = lib.verify_authentication_response(
            credential=_as_json(answer),
            expected_challenge=challenge,
            expected_rp_id=rp_id,
            expected_origin=origin,
            credential_public_key=public_key,
            credential_current_sign_count=sign_count,
        )
    except Exception as exc:
        raise MfaError(f"the authenticator's answer was refused: {exc}") from None
    new = int(verified.new_sign_count)
    if sign_count and new <= sign_count:  # py_webauthn checks this too; a clone never passes
        raise MfaError("the signature counter did not advance: a cloned authenticator?")
    return new


def _as_json(answer: str | dict[str, Any]) -> str:
    return answer if isinstance(answer, str) else json.dumps(answer)
