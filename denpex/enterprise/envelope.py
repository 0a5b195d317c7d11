"""Envelope encryption of stored secrets (webhook URLs, IdP client secrets, tokens): each
secret is sealed with its own AES-256-GCM data key, bound to a context (tenant, name) as
associated data; the data key is stored wrapped by the KMS. Re-wrapping after a KEK rotation
touches only the wrapped key, never the sealed data, so readers never stop.

It must never store or return a data key unwrapped, and never open a sealed secret under a
context other than the one it was sealed with.
"""

from __future__ import annotations

import base64
import json
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from denpex.enterprise.kms import Kms, KmsError, WrappedKey

FORMAT = "denpex.sealed/v1"


def _aad(context: dict[str, str]) -> bytes:
    return json.dumps(context, sort_keys=True, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def seal(kms: Kms, plaintext: bytes, context: dict[str, str]) -> str:
    """The sealed form (JSON text) of `plaintext`, for storage."""
    data_key = AESGCM.generate_key(256)
    nonce = secrets.token_bytes(12)
    sealed = AESGCM(data_key).encrypt(nonce, plaintext, _aad(context))
    wrapped = kms.wrap(data_key, context)
    return json.dumps(
        {
            "format": FORMAT,
            "kms": wrapped.kms,
            "key_ref": wrapped.key_ref,
            "wrapped": _b64(wrapped.blob),
            "nonce": _b64(nonce),
            "data": _b64(sealed),
        }
    )


def _parse(text: str) -> tuple[dict[str, str], WrappedKey]:
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ValueError(doc.get("format"))
        wrapped = WrappedKey(doc["kms"], doc["key_ref"], base64.b64decode(doc["wrapped"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KmsError("not a sealed secret of this denpex") from None
    return doc, wrapped


def open_sealed(kms: Kms, text: str, context: dict[str, str]) -> bytes:
    doc, wrapped = _parse(text)
    if wrapped.kms != kms.name:
        raise KmsError(f"sealed with the {wrapped.kms} KMS, not {kms.name}")
    data_key = kms.unwrap(wrapped, context)
    try:
        return AESGCM(data_key).decrypt(
            base64.b64decode(doc["nonce"]), base64.b64decode(doc["data"]), _aad(context)
        )
    except InvalidTag:
        raise KmsError("the sealed secret does not open under this context") from None


def key_ref(text: str) -> str:
    """Which KEK (and version) a sealed secret's data key is wrapped under."""
    return _parse(text)[1].key_ref


def rewrap(kms: Kms, text: str, context: dict[str, str]) -> str:
    """The same sealed secret with its data key wrapped under the KMS's current KEK."""
    doc, wrapped = _parse(text)
    fresh = kms.rewrap(wrapped, context)
    return json.dumps(
        {**doc, "kms": fresh.kms, "key_ref": fresh.key_ref, "wrapped": _b64(fresh.blob)}
    )


# --- one data key for many values (a tenant's sensitive evidence bodies) -------------------

BODY_PREFIX = "denpex.sealed-body/v1:"


def wrapped_text(wrapped: WrappedKey) -> str:
    """A wrapped data key as stored text (which KMS, which KEK version, the blob)."""
    return json.dumps({"kms": wrapped.kms, "key_ref": wrapped.key_ref, "blob": _b64(wrapped.blob)})


def wrapped_of(text: str) -> WrappedKey:
    try:
        doc = json.loads(text)
        return WrappedKey(str(doc["kms"]), str(doc["key_ref"]), base64.b64decode(doc["blob"]))
    except (ValueError, KeyError, TypeError):
        raise KmsError("not a wrapped data key of this denpex") from None


def seal_value(data_key: bytes, plaintext: bytes, context: dict[str, str]) -> str:
    """`plaintext` sealed under a data key the caller holds (AES-256-GCM, the context as
    associated data), as text that says it is sealed."""
    nonce = secrets.token_bytes(12)
    return BODY_PREFIX + _b64(nonce + AESGCM(data_key).encrypt(nonce, plaintext, _aad(context)))


def is_sealed_value(text: str) -> bool:
    return text.startswith(BODY_PREFIX)


def open_value(data_key: bytes, text: str, context: dict[str, str]) -> bytes:
    if not is_sealed_value(text):
        raise KmsError("not a sealed value of this denpex")
    try:
        raw = base64.b64decode(text[len(BODY_PREFIX) :])
        return AESGCM(data_key).decrypt(raw[:12], raw[12:], _aad(context))
    except (InvalidTag, ValueError):
        raise KmsError("the sealed value does not open under this key and context") from None
