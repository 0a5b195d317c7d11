"""The KMS contract every backend keeps (kms.py, kms_pkcs11.py): the Kms protocol, the
wrapped form of a data key, the one error type, and how an envelope's context becomes the
additional authenticated data. Holds no key material and does no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol


class KmsError(RuntimeError):
    """A wrap or unwrap the KMS refused or could not do (never carries key material)."""


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key as the KMS wrapped it: which KMS, which key (and version), the blob."""

    kms: str
    key_ref: str
    blob: bytes


class Kms(Protocol):
    name: str

    def wrap(self, data_key: bytes, context: dict[str, str]) -> WrappedKey: ...
    def unwrap(self, wrapped: WrappedKey, context: dict[str, str]) -> bytes: ...
    def rotate(self) -> str: ...  # the new current key_ref
    def rewrap(self, wrapped: WrappedKey, context: dict[str, str]) -> WrappedKey: ...


def aad(context: dict[str, str]) -> bytes:
    return json.dumps(context, sort_keys=True, separators=(",", ":")).encode()
