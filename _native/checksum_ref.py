"""Reference checksums (the oracle and the fallback of `denpex._native.checksum`).

XXH3-64/128 exactly as the `xxhash` package computes them; that package is imported lazily, so
denpex runs without it until a checksum is asked for. It never hashes anything but the bytes given.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable
from types import ModuleType

CHUNK = 1 << 24


def _xxhash() -> ModuleType:
    try:
        import xxhash
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "checksums need the compiled denpex._native.checksum (and libxxhash) or the "
            "`xxhash` package: pip install xxhash"
        ) from exc
    return xxhash


def xxh3_64(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """XXH3-64 of one buffer."""
    return _xxhash().xxh3_64_intdigest(data, seed=seed)


def xxh3_128(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """XXH3-128 of one buffer as an int, high 64 bits first."""
    return _xxhash().xxh3_128_intdigest(data, seed=seed)


def _check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 or None, not {threads}")


def xxh3_64_many(
    buffers: Iterable[bytes | bytearray | memoryview],
    seed: int = 0,
    *,
    packed: bool = False,
    threads: int | None = None,
) -> list[int] | array:
    """XXH3-64 of every buffer: a list of ints, or with `packed=True` an `array('Q')`.

    `threads` only caps the native module's hashing threads; here everything runs in the caller.
    """
    _check_threads(threads)
    digest = _xxhash().xxh3_64_intdigest
    digests = [digest(b, seed=seed) for b in buffers]
    return array("Q", digests) if packed else digests


def xxh3_128_many(
    buffers: Iterable[bytes | bytearray | memoryview],
    seed: int = 0,
    *,
    packed: bool = False,
    threads: int | None = None,
) -> list[int] | array:
    """XXH3-128 of every buffer: a list of ints, or with `packed=True` an `array('Q')`.

    Packed, each buffer takes two words: its high 64 bits, then its low 64 bits.
    """
    _check_threads(threads)
    digest = _xxhash().xxh3_128_intdigest
    digests = [digest(b, seed=seed) for b in buffers]
    if not packed:
        return digests
    words = array("Q")
    for value in digests:
        words.append(value >> 64)
        words.append(value & 0xFFFFFFFFFFFFFFFF)
    return words


def _file(path: str | os.PathLike[str], hasher) -> int:
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.intdigest()


def xxh3_64_file(path: str | os.PathLike[str], seed: int = 0) -> int:
    """XXH3-64 of a file's contents, read in chunks."""
    return _file(path, _xxhash().xxh3_64(seed=seed))


def xxh3_128_file(path: str | os.PathLike[str], seed: int = 0) -> int:
    """XXH3-128 of a file's contents, read in chunks."""
    return _file(path, _xxhash().xxh3_128(seed=seed))
