"""Signed eBPF objects: each `.bpf.o` is signed at build time with the release key (a
minisign `<name>.bpf.o.minisig` beside it, denpex.core.signing) and checked here before the
kernel sees a byte of it.

The trusted key is the collector's `release_key` option (install.sh points it at the key the
installation pinned), else `denpex-release.pub` shipped beside the objects by a signed build.
With a key, an object without a signature, or whose signature does not verify, is refused.
Only a source checkout (no key anywhere, objects built on this machine) loads unsigned, and
says so. This module must never return bytes it has not verified when a key is in force.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from denpex.core import signing

SIGNATURE_SUFFIX = ".minisig"
SHIPPED_KEY = "denpex-release.pub"


class UnsignedObject(Exception):
    """The object may not be loaded: the message says which check failed."""


@dataclass(frozen=True, slots=True)
class Trust:
    """The key objects must be signed with (None: unsigned objects load) and where it is from."""

    key: signing.PublicKey | None
    source: str

    @property
    def describe(self) -> str:
        if self.key is None:
            return "unsigned objects (no release key: a source build)"
        return f"signed by release key {self.key.key_id_hex} ({self.source})"


def trust_for(folder: Path, release_key: str | None) -> Trust:
    """The trust in force for the objects of `folder`; raises UnsignedObject when the
    configured key cannot be read (a configured key is never silently dropped)."""
    path = Path(release_key) if release_key else folder / SHIPPED_KEY
    if not release_key and not path.is_file():
        return Trust(None, "none")
    try:
        return Trust(signing.parse_public_key(path.read_bytes()), str(path))
    except OSError as exc:
        raise UnsignedObject(f"release key {path}: {exc.strerror}") from None
    except signing.SignatureError as exc:
        raise UnsignedObject(f"release key {path}: {exc}") from None


def verified_bytes(path: Path, trust: Trust) -> bytes:
    """The object's bytes, read once and checked against its signature when a key is in force."""
    data = path.read_bytes()
    if trust.key is None:
        return data
    signature = path.with_name(path.name + SIGNATURE_SUFFIX)
    try:
        text = signature.read_bytes()
    except FileNotFoundError:
        raise UnsignedObject(
            f"{path.name}: no signature ({signature.name}); refusing to load it"
        ) from None
    try:
        signing.verify(data, text, trust.key)
    except signing.SignatureError as exc:
        raise UnsignedObject(
            f"{path.name}: signature does not verify ({exc}); refusing to load it"
        ) from None
    return data
