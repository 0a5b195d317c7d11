"""Typed surface of the compiled checksums (`denpex._native.checksum`), same as `checksum_ref`.

Stub only: it must list exactly what the compiled module exposes, nothing more.
"""

import os
from array import array
from collections.abc import Iterable
from typing import Literal, overload

from typing_extensions import Buffer

def xxh3_64(data: Buffer, seed: int = 0) -> int: ...
def xxh3_128(data: Buffer, seed: int = 0) -> int: ...

# `*_many`: one call, GIL released, hashed on up to `threads` threads (None: every CPU this process
# may use; 1: the calling thread only). `packed=True` returns an `array('Q')` instead of a list:
# one word per buffer for XXH3-64, two (high 64 bits, then low 64 bits) for XXH3-128.
@overload
def xxh3_64_many(
    buffers: Iterable[Buffer],
    seed: int = 0,
    *,
    packed: Literal[False] = False,
    threads: int | None = None,
) -> list[int]: ...
@overload
def xxh3_64_many(
    buffers: Iterable[Buffer], seed: int = 0, *, packed: Literal[True], threads: int | None = None
) -> array[int]: ...
@overload
def xxh3_128_many(
    buffers: Iterable[Buffer],
    seed: int = 0,
    *,
    packed: Literal[False] = False,
    threads: int | None = None,
) -> list[int]: ...
@overload
def xxh3_128_many(
    buffers: Iterable[Buffer], seed: int = 0, *, packed: Literal[True], threads: int | None = None
) -> array[int]: ...
def xxh3_64_file(path: str | os.PathLike[str], seed: int = 0) -> int: ...
def xxh3_128_file(path: str | os.PathLike[str], seed: int = 0) -> int: ...
