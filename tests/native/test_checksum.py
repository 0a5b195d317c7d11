"""Checksums are bit-identical to the `xxhash` package (the oracle), native and reference.

Random buffers come from a printed seed; the native module is tested when it is built.
"""

from __future__ import annotations

import random

import pytest

from denpex._native import checksum_ref
from tests.native.native_support import native_module

xxhash = pytest.importorskip("xxhash", reason="the oracle `xxhash` is not installed")


def implementations():
    yield checksum_ref
    try:
        yield native_module("checksum")
    except pytest.skip.Exception:
        return


def random_buffers(seed: int) -> list[bytes]:
    rng = random.Random(seed)
    sizes = [0, 1, 3, 4, 8, 16, 17, 128, 129, 240, 241, 1024, 65536, 1 << 20]
    sizes += [rng.randrange(0, 5000) for _ in range(50)]
    return [rng.randbytes(size) for size in sizes]


@pytest.mark.parametrize("seed", [0, 1, 20261130])
@pytest.mark.parametrize("hash_seed", [0, 1, 2**64 - 1])
def test_identical_to_xxhash(seed, hash_seed):
    print("seed", seed)
    buffers = random_buffers(seed)
    want64 = [xxhash.xxh3_64_intdigest(b, seed=hash_seed) for b in buffers]
    want128 = [xxhash.xxh3_128_intdigest(b, seed=hash_seed) for b in buffers]
    for module in implementations():
        assert module.xxh3_64_many(buffers, hash_seed) == want64
        assert module.xxh3_128_many(buffers, hash_seed) == want128
        assert module.xxh3_64(buffers[5], hash_seed) == want64[5]
        assert module.xxh3_128(buffers[5], hash_seed) == want128[5]


def test_any_contiguous_buffer():
    data = bytes(range(256)) * 10
    want = xxhash.xxh3_64_intdigest(data)
    for module in implementations():
        assert module.xxh3_64(bytearray(data)) == want
        assert module.xxh3_64(memoryview(data)) == want
        assert module.xxh3_64_many([]) == []


def test_files(tmp_path):
    empty, big = tmp_path / "empty", tmp_path / "big"
    empty.write_bytes(b"")
    data = random.Random(7).randbytes(3 << 20)
    big.write_bytes(data)
    for module in implementations():
        assert module.xxh3_64_file(empty) == xxhash.xxh3_64_intdigest(b"")
        assert module.xxh3_64_file(big) == xxhash.xxh3_64_intdigest(data)
        assert module.xxh3_128_file(str(big), 3) == xxhash.xxh3_128_intdigest(data, seed=3)


def test_native_rejects_non_buffers():
    module = native_module("checksum")
    with pytest.raises(TypeError):
        module.xxh3_64_many([b"ok", "not bytes"])
