"""What proves a checkpoint's bytes: the sidecar `<path>.dxsum` (XXH3-128 of the file and
XXH3-64 of each chunk, optionally sealed with an HMAC-SHA256 under a site key) and the marker
`dx.save` leaves inside the file itself, so a copy that lost its sidecar is still known as
one that must have it.

The marker is the zip archive's comment (torch.save writes a zip; torch.load and any copy
keep the comment), written twice so that no single damaged byte can make a marked file look
unmarked. The HMAC covers the sidecar's digests: whoever can rewrite the checkpoint and the
sidecar but not read the key cannot make a sidecar that verifies. The digests themselves are
XXH3, fast but not collision-resistant against someone crafting a file on purpose.
Pure but for reading files; it never writes a checkpoint and never imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import denpex._native as native

SIDECAR_SUFFIX = ".dxsum"
SIDECAR_VERSION = 1
CHUNK_BYTES = 8 << 20  # a corruption is located to one chunk of this size
KEY_FILE_ENV = "DENPEX_CKPT_KEY_FILE"  # a file holding the site key (HMAC mode)
MIN_KEY_BYTES = 16
MARK = b"denpex.checkpoint/1"
_EOCD = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes + its comment
_EOCD_BYTES = 22
_TAIL_BYTES = 65535 + _EOCD_BYTES  # the farthest a zip comment can start from the end
_MAC_CONTEXT = b"denpex.checkpoint.hmac/1\0"
PathArg = str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What a sidecar records about one file."""

    size: int
    xxh3_128: int
    chunk_bytes: int
    chunks: tuple[int, ...] = field(default=())  # XXH3-64 of each chunk, in file order
    hmac_sha256: str | None = None  # over mac_message(), under the site key (HMAC mode)
    key_id: str | None = None  # which key made it (key_id()); the key itself is never stored

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": SIDECAR_VERSION,
            "algorithm": "xxh3",
            "size": self.size,
            "xxh3_128": f"{self.xxh3_128:032x}",
            "chunk_bytes": self.chunk_bytes,
            "chunks_xxh3_64": [f"{h:016x}" for h in self.chunks],
        }
        if self.hmac_sha256 is not None:
            data["hmac_sha256"] = self.hmac_sha256
            data["key_id"] = self.key_id
        return data

    @classmethod
    def from_dict(cls, data: Any) -> FileDigest:
        if not isinstance(data, dict) or data.get("version") != SIDECAR_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise ValueError(f"sidecar version {version!r} is not {SIDECAR_VERSION}")
        try:
            mac, key = data.get("hmac_sha256"), data.get("key_id")
            if mac is not None and not (isinstance(mac, str) and isinstance(key, str)):
                raise TypeError("hmac_sha256 and key_id must be strings")
            return cls(
                size=int(data["size"]),
                xxh3_128=int(data["xxh3_128"], 16),
                chunk_bytes=int(data["chunk_bytes"]),
                chunks=tuple(int(h, 16) for h in data["chunks_xxh3_64"]),
                hmac_sha256=mac,
                key_id=key,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"sidecar is malformed: {exc}") from None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking one checkpoint against its sidecar."""

    ok: bool
    sidecar_found: bool
    reason: str = ""
    offset: int | None = None  # first bad byte (corrupt only)
    marked: bool = False  # the file carries dx.save's marker: it must have a sidecar
    authentic: bool | None = None  # HMAC mode: did the sidecar's HMAC verify (None: no key)


def sidecar_path(path: PathArg) -> str:
    return os.fspath(path) + SIDECAR_SUFFIX


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[memoryview]:
    """The file's bytes, mapped read-only: the page cache streams them, nothing is copied."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                yield view
            finally:
                view.release()


def digest_file(path: PathArg, chunk_bytes: int = CHUNK_BYTES) -> FileDigest:
    """Size, XXH3-128 of the whole file and XXH3-64 of each chunk (one mapping, GIL released)."""
    checksum = native.load("checksum")
    with _mapped(os.fspath(path)) as view:
        pieces = [view[at : at + chunk_bytes] for at in range(0, len(view), chunk_bytes)]
        try:
            whole = checksum.xxh3_128(view)
            chunks = tuple(checksum.xxh3_64_many(pieces)) if pieces else ()
        finally:
            for piece in pieces:
                piece.release()
        return FileDigest(len(view), whole, chunk_bytes, chunks)


def compare(expected: FileDigest, actual: FileDigest) -> Verdict:
    """Pure: where `actual` departs from `expected` (same chunk size assumed)."""
    bad_chunk = next(
        (i for i, (a, b) in enumerate(zip(expected.chunks, actual.chunks, strict=False)) if a != b),
        None,
    )
    if actual.size != expected.size:
        offset = min(actual.size, expected.size)
        if bad_chunk is not None:
            offset = min(offset, bad_chunk * expected.chunk_bytes)
        kind = "truncated" if actual.size < expected.size else "longer than written"
        reason = f"{kind}: {actual.size} bytes, {expected.size} were written"
        return Verdict(False, True, reason, offset)
    if bad_chunk is not None:
        return Verdict(
            False, True, "content differs from what was written", bad_chunk * expected.chunk_bytes
        )
    if actual.xxh3_128 != expected.xxh3_128:
        return Verdict(False, True, "XXH3-128 of the file differs from what was written", None)
    return Verdict(True, True)


# --- the marker inside the file ----------------------------------------------------------------


def marker_comment(mode: str) -> bytes:
    """The zip comment dx.save writes: the mark twice around the sidecar mode."""
    return MARK + b" sidecar=" + mode.encode("ascii") + b" " + MARK


def add_marker(path: str, mode: str) -> bool:
    """Append the marker as the zip comment of the file torch.save just wrote; False (file
    unchanged) when it is not a zip ending in a comment-less end record (the legacy format)."""
    comment = marker_comment(mode)
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size < _EOCD_BYTES:
            return False
        handle.seek(size - _EOCD_BYTES)
        end = handle.read(_EOCD_BYTES)
        if end[:4] != _EOCD or end[20:22] != b"\0\0":
            return False
        handle.seek(size - 2)
        handle.write(struct.pack("<H", len(comment)) + comment)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def has_marker(path: str) -> bool:
    """True when the file's tail holds dx.save's mark (either copy: one damaged byte can
    destroy only one)."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - _TAIL_BYTES))
        return MARK in handle.read()


# --- HMAC mode ---------------------------------------------------------------------------------


def site_key(key: bytes | None = None) -> bytes | None:
    """The HMAC key: `key` if given, else the contents of $DENPEX_CKPT_KEY_FILE (surrounding
    whitespace dropped), else None (no HMAC mode). Too short or unreadable raises ValueError."""
    if key is None:
        where = os.environ.get(KEY_FILE_ENV, "")
        if not where:
            return None
        try:
            with open(where, "rb") as handle:
                key = handle.read().strip()
        except OSError as exc:
            raise ValueError(
                f"{KEY_FILE_ENV}={where} cannot be read ({exc.strerror or exc}): checkpoints "
                "cannot be sealed or checked without the site key"
            ) from None
        source = f"the key in {KEY_FILE_ENV}={where}"
    else:
        source = "key="
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{source} must be at least {MIN_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`)"
        )
    return key


def key_id(key: bytes) -> str:
    """A short public name for a key (which key sealed a sidecar), not the key."""
    return hashlib.sha256(b"denpex.checkpoint.key-id\0" + key).hexdigest()[:16]


def mac_message(digest: FileDigest) -> bytes:
    """The bytes the HMAC covers: size, chunk size, XXH3-128 and every chunk's XXH3-64."""
    head = struct.pack("<QQQ", digest.size, digest.chunk_bytes, len(digest.chunks))
    chunks = struct.pack(f"<{len(digest.chunks)}Q", *digest.chunks)
    return _MAC_CONTEXT + head + digest.xxh3_128.to_bytes(16, "little") + chunks


def seal(digest: FileDigest, key: bytes) -> FileDigest:
    mac = hmac.new(key, mac_message(digest), hashlib.sha256).hexdigest()
    return replace(digest, hmac_sha256=mac, key_id=key_id(key))


def authenticate(digest: FileDigest, key: bytes) -> str:
    """'' when the sidecar's HMAC verifies under key, else why not (constant-time compare)."""
    if digest.hmac_sha256 is None:
        return "its sidecar carries no HMAC, and a site key is set (HMAC mode)"
    expected = hmac.new(key, mac_message(digest), hashlib.sha256).hexdigest()
    if hmac.compare_digest(expected, digest.hmac_sha256):
        return ""
    if digest.key_id != key_id(key):
        return (
            f"its sidecar was sealed with another key (key id {digest.key_id}, "
            f"this site's is {key_id(key)})"
        )
    return "its sidecar's HMAC does not match its digests: the sidecar was rewritten"
