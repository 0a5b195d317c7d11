"""Checksums are bit-identical to the `xxhash` package (the oracle), native and reference.

Random buffers come from a printed seed; the native module is tested when it is built. Both the
list and the packed (`array('Q')`) results of the `*_many` calls are checked, with and without
hashing threads.
"""

from __future__ import annotations

import random
import subprocess
import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from denpex._native import checksum_ref
from tests.native.native_support import native_module

xxhash = pytest.importorskip("xxhash", reason="the oracle `xxhash` is not installed")

HYPOTHESIS_SEED = 20261130
MASK64 = (1 << 64) - 1


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


def packed128(values: list[int]) -> array:
    words = array("Q")
    for value in values:
        words.extend((value >> 64, value & MASK64))
    return words


def check_many(module, buffers, hash_seed: int, threads: int | None = None) -> None:
    want64 = [xxhash.xxh3_64_intdigest(bytes(b), seed=hash_seed) for b in buffers]
    want128 = [xxhash.xxh3_128_intdigest(bytes(b), seed=hash_seed) for b in buffers]
    assert module.xxh3_64_many(buffers, hash_seed, threads=threads) == want64
    assert module.xxh3_128_many(buffers, hash_seed, threads=threads) == want128
    got64 = module.xxh3_64_many(buffers, hash_seed, packed=True, threads=threads)
    got128 = module.xxh3_128_many(buffers, hash_seed, packed=True, threads=threads)
    assert isinstance(got64, array) and got64.typecode == "Q"
    assert isinstance(got128, array) and got128.typecode == "Q"
    assert got64 == array("Q", want64)
    assert got128 == packed128(want128)


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
        for threads in (None, 1, 3):
            check_many(module, buffers, hash_seed, threads)


# every length class of XXH3 and the edges between them: 0, 1-3, 4-8, 9-16, 17-128 (each
# 32-byte round), 129-240, then stripes (64 bytes) and blocks (1024 bytes) of the long path
BOUNDARIES = sorted(
    {*range(0, 34), 47, 48, 49, 63, 64, 65, 95, 96, 97, 127, 128, 129, 130, 143, 144, 145}
    | {159, 160, 161, 191, 192, 193, 223, 224, 225, 239, 240, 241, 242, 255, 256, 257, 319, 320}
    | {1023, 1024, 1025, 1087, 1088, 1089, 2047, 2048, 2049, 3072, 3073, 16383, 16384, 16385}
)


@pytest.mark.parametrize("hash_seed", [0, 1, 0x9E3779B1, 2**63, 2**64 - 1])
def test_reference_equals_xxhash_at_every_length_boundary(hash_seed):
    rng = random.Random(hash_seed ^ 20261130)
    print("seed", hash_seed ^ 20261130)
    for size in BOUNDARIES:
        data = rng.randbytes(size)
        assert checksum_ref.xxh3_64(data, hash_seed) == xxhash.xxh3_64_intdigest(
            data, seed=hash_seed
        ), size
        assert checksum_ref.xxh3_128(data, hash_seed) == xxhash.xxh3_128_intdigest(
            data, seed=hash_seed
        ), size


def test_reference_needs_no_xxhash_package():
    # the pure-Python twin is the fallback where the compiled module is not built: it must
    # not lean on the `xxhash` package, which is only a test extra
    data = bytes(range(256)) * 9 + b"tail"
    want = [xxhash.xxh3_64_intdigest(data, seed=5), xxhash.xxh3_128_intdigest(data, seed=5)]
    code = (
        "import sys; sys.modules['xxhash'] = None\n"
        "from denpex._native import checksum_ref as c\n"
        "data = bytes(range(256)) * 9 + b'tail'\n"
        "print(c.xxh3_64(data, 5), c.xxh3_128(data, 5))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [int(v) for v in out.stdout.split()] == want


def test_reference_refuses_a_seed_out_of_range():
    with pytest.raises(OverflowError):
        checksum_ref.xxh3_64(b"x", 2**64)
    with pytest.raises(OverflowError):
        checksum_ref.xxh3_128_many([b"x"], -1)


def as_kind(data: bytes, kind: int):
    if kind == 1:
        return bytearray(data)
    if kind == 2:
        return memoryview(data)
    if kind == 3:  # a view into the middle of a larger buffer
        return memoryview(b"<" + data + b">")[1:-1]
    return data


buffer_lists = st.lists(
    st.tuples(st.binary(max_size=600), st.integers(min_value=0, max_value=3)),
    max_size=40,
).map(lambda pairs: [as_kind(data, kind) for data, kind in pairs])


@hypothesis_seed(HYPOTHESIS_SEED)
@settings(max_examples=150, deadline=None)
@given(
    buffers=buffer_lists,
    hash_seed=st.integers(min_value=0, max_value=2**64 - 1),
    threads=st.sampled_from([None, 1, 2, 5]),
)
def test_hypothesis_identical_to_xxhash(buffers, hash_seed, threads):
    print("hypothesis seed", HYPOTHESIS_SEED)
    for module in implementations():
        check_many(module, buffers, hash_seed, threads)


@pytest.mark.parametrize("seed", [3, 20261130])
def test_threaded_split_many_sizes(seed):
    """Enough bytes that the native call hashes on several threads; every slice boundary holds."""
    print("seed", seed)
    rng = random.Random(seed)
    buffers = [rng.randbytes(rng.choice((0, 1, 64, 4096, 70_000))) for _ in range(300)]
    buffers += [bytearray(rng.randbytes(8192)) for _ in range(20)]
    buffers += [memoryview(rng.randbytes(1 << 20))]
    rng.shuffle(buffers)
    for module in implementations():
        for threads in (None, 1, 2, 4, 64):
            check_many(module, buffers, 2**63 + seed, threads)


def test_native_and_reference_agree():
    buffers = random_buffers(11)
    for module in implementations():
        for packed in (False, True):
            assert module.xxh3_64_many(buffers, 9, packed=packed) == checksum_ref.xxh3_64_many(
                buffers, 9, packed=packed
            )
            assert module.xxh3_128_many(buffers, 9, packed=packed) == checksum_ref.xxh3_128_many(
                buffers, 9, packed=packed
            )


def test_any_contiguous_buffer():
    data = bytes(range(256)) * 10
    want = xxhash.xxh3_64_intdigest(data)
    for module in implementations():
        assert module.xxh3_64(bytearray(data)) == want
        assert module.xxh3_64(memoryview(data)) == want
        assert module.xxh3_64_many([]) == []
        assert module.xxh3_64_many([], packed=True) == array("Q")
        assert module.xxh3_128_many(iter([]), packed=True) == array("Q")
        assert module.xxh3_64_many(iter([data, bytearray(data)])) == [want, want]


def test_threads_must_be_positive():
    for module in implementations():
        with pytest.raises(ValueError):
            module.xxh3_64_many([b"x"], threads=0)
        with pytest.raises(ValueError):
            module.xxh3_128_many([b"x"], packed=True, threads=-1)


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
    pinned = bytearray(b"pinned")
    for packed in (False, True):
        with pytest.raises(TypeError):
            module.xxh3_128_many([pinned, memoryview(b"x"), 7], packed=packed)
    pinned.extend(b" and released")  # a view left pinned would make this raise BufferError
    assert module.xxh3_64_many([pinned]) == [xxhash.xxh3_64_intdigest(bytes(pinned))]
