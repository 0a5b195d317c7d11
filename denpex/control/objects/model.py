"""The object store's vocabulary, shared by its facade and its backends: errors (each with
the HTTP status a route answers), ObjectInfo, the Backend protocol, the kinds and limits of
objects.yaml, and the key alphabet. No I/O beyond reading objects.yaml."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Protocol
from urllib.parse import quote

import yaml

TENANT_ROOT = "tenants"
_SEGMENT = re.compile(r"[A-Za-z0-9_=~%-][A-Za-z0-9._=~%-]{0,254}")


class ObjectError(Exception):
    """The object store could not do what was asked (the message says what to do next)."""

    status = 503


class ObjectNotFound(ObjectError):
    status = 404


class ObjectTooLarge(ObjectError):
    status = 413


class ObjectRefused(ObjectError):
    """A key or content type the store does not accept."""

    status = 400


class ObjectCorrupt(ObjectError):
    """The bytes read back do not hash to the SHA-256 stored with them."""

    status = 502


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str  # the backend's full key (TenantObjects hands out the name within the kind)
    size: int
    sha256: str
    content_type: str
    stored_ns: int


class Backend(Protocol):
    """Where the bytes live; keys are full keys, already checked by TenantObjects."""

    kind: str  # "filesystem" or "s3" (/healthz says which)
    where: str  # for messages: "file:///var/lib/…" or "s3://bucket/prefix at URL"

    def check(self) -> None: ...

    def put(self, key: str, data: bytes, sha256: str, content_type: str) -> ObjectInfo: ...

    def get(self, key: str) -> tuple[bytes, ObjectInfo]: ...

    def head(self, key: str) -> ObjectInfo: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]: ...

    def delete(self, key: str) -> bool: ...


@cache
def settings() -> Mapping[str, Any]:
    text = resources.files("denpex.control.objects").joinpath("objects.yaml").read_text()
    return dict(yaml.safe_load(text))


def segment(text: str) -> str:
    """`text` as one key segment: characters outside the key alphabet percent-encoded."""
    out = quote(text, safe="")
    if out.startswith("."):
        out = "%2E" + out[1:]
    if not _SEGMENT.fullmatch(out):
        raise ObjectRefused(f"object name {text!r}: 1 to 255 characters after encoding")
    return out


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
