"""Reference checksums (the oracle and the fallback of `denpex._native.checksum`): XXH3-64 and
XXH3-128 written out in pure Python from the XXH3 specification (xxHash 0.8, the scalar path).

It imports nothing outside the standard library, so checksums work where neither the compiled
module nor the `xxhash` package exists; it is slow (tens of MB/s), which its callers must weigh.
It never hashes anything but the bytes given and never modifies them.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from collections.abc import Iterable

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1

PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
PRIME_MX1 = 0x165667919E3779F9
PRIME_MX2 = 0x9FB21C651E98DF25

# The default 192-byte secret of XXH3 (taken from FARSH), as the specification lists it.
K_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
SECRET_SIZE = 192
SECRET_SIZE_MIN = 136
STRIPE_LEN = 64
SECRET_CONSUME_RATE = 8
STRIPES_PER_BLOCK = (SECRET_SIZE - STRIPE_LEN) // SECRET_CONSUME_RATE  # 16
BLOCK_LEN = STRIPE_LEN * STRIPES_PER_BLOCK  # 1024
MIDSIZE_MAX = 240
MIDSIZE_STARTOFFSET = 3
MIDSIZE_LASTOFFSET = 17
SECRET_LASTACC_START = 7
SECRET_MERGEACCS_START = 11
INIT_ACC = (PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1)

_u32 = struct.Struct("<I").unpack_from
_u64 = struct.Struct("<Q").unpack_from
_u64x2 = struct.Struct("<2Q").unpack_from
_u64x8 = struct.Struct("<8Q").unpack_from
_BLOCK_WORDS = struct.Struct(f"<{BLOCK_LEN // 8}Q").unpack_from


# --- the mixing primitives -------------------------------------------------------------------


def _swap32(x: int) -> int:
    return int.from_bytes(x.to_bytes(4, "little"), "big")


def _swap64(x: int) -> int:
    return int.from_bytes(x.to_bytes(8, "little"), "big")


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def _rotl64(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M64


def _mul128_fold64(a: int, b: int) -> int:
    product = a * b
    return (product & M64) ^ (product >> 64)


def _xxh64_avalanche(h: int) -> int:
    h ^= h >> 33
    h = (h * PRIME64_2) & M64
    h ^= h >> 29
    h = (h * PRIME64_3) & M64
    return h ^ (h >> 32)


def _avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * PRIME_MX1) & M64
    return h ^ (h >> 32)


def _rrmxmx(h: int, length: int) -> int:
    h ^= _rotl64(h, 49) ^ _rotl64(h, 24)
    h = (h * PRIME_MX2) & M64
    h ^= ((h >> 35) + length) & M64
    h = (h * PRIME_MX2) & M64
    return h ^ (h >> 28)


def _mix16(data: memoryview, at: int, secret: bytes, s_at: int, seed: int) -> int:
    lo, hi = _u64x2(data, at)
    key_lo, key_hi = _u64x2(secret, s_at)
    return _mul128_fold64(lo ^ ((key_lo + seed) & M64), hi ^ ((key_hi - seed) & M64))


def _custom_secret(seed: int) -> bytes:
    """The secret XXH3 derives from a non-zero seed (used for inputs over 240 bytes)."""
    words = struct.unpack("<24Q", K_SECRET)
    derived = [(w + seed) & M64 if i % 2 == 0 else (w - seed) & M64 for i, w in enumerate(words)]
    return struct.pack("<24Q", *derived)


# --- long inputs (> 240 bytes): stripes, blocks, scrambles --------------------------------


def _accumulate(acc: list[int], words: tuple[int, ...], first: int, stripes: int, sec) -> None:
    """`stripes` stripes of 8 words from words[first:], keyed by the secret words `sec`
    (sec[k] is the 64-bit word at byte 8k of the secret). The sums are reduced modulo 2**64
    once at the end: 16 stripes add less than 2**70 to a lane, which Python ints hold."""
    a0, a1, a2, a3, a4, a5, a6, a7 = acc
    for n in range(stripes):
        w = first + 8 * n
        d0, d1, d2, d3, d4, d5, d6, d7 = words[w : w + 8]
        k0 = d0 ^ sec[n]
        k1 = d1 ^ sec[n + 1]
        k2 = d2 ^ sec[n + 2]
        k3 = d3 ^ sec[n + 3]
        k4 = d4 ^ sec[n + 4]
        k5 = d5 ^ sec[n + 5]
        k6 = d6 ^ sec[n + 6]
        k7 = d7 ^ sec[n + 7]
        a0 += d1 + (k0 & M32) * (k0 >> 32)
        a1 += d0 + (k1 & M32) * (k1 >> 32)
        a2 += d3 + (k2 & M32) * (k2 >> 32)
        a3 += d2 + (k3 & M32) * (k3 >> 32)
        a4 += d5 + (k4 & M32) * (k4 >> 32)
        a5 += d4 + (k5 & M32) * (k5 >> 32)
        a6 += d7 + (k6 & M32) * (k6 >> 32)
        a7 += d6 + (k7 & M32) * (k7 >> 32)
    acc[:] = [a & M64 for a in (a0, a1, a2, a3, a4, a5, a6, a7)]


def _scramble(acc: list[int], keys: tuple[int, ...]) -> None:
    for lane in range(8):
        a = acc[lane]
        acc[lane] = (((a ^ (a >> 47)) ^ keys[lane]) * PRIME32_1) & M64


def _long_accumulators(data: memoryview, length: int, secret: bytes) -> list[int]:
    acc = list(INIT_ACC)
    sec = struct.unpack_from(f"<{STRIPES_PER_BLOCK + 8}Q", secret, 0)
    scramble_keys = _u64x8(secret, SECRET_SIZE - STRIPE_LEN)
    blocks = (length - 1) // BLOCK_LEN
    for block in range(blocks):
        _accumulate(acc, _BLOCK_WORDS(data, block * BLOCK_LEN), 0, STRIPES_PER_BLOCK, sec)
        _scramble(acc, scramble_keys)
    start = blocks * BLOCK_LEN
    stripes = ((length - 1) - start) // STRIPE_LEN
    if stripes:
        words = struct.unpack_from(f"<{8 * stripes}Q", data, start)
        _accumulate(acc, words, 0, stripes, sec)
    # the last stripe: the final 64 bytes, keyed by the secret at an unaligned offset
    last_keys = _u64x8(secret, SECRET_SIZE - STRIPE_LEN - SECRET_LASTACC_START)
    _accumulate(acc, _u64x8(data, length - STRIPE_LEN), 0, 1, last_keys)
    return acc


def _merge(acc: list[int], secret: bytes, at: int, start: int) -> int:
    result = start & M64
    for i in range(4):
        k0, k1 = _u64x2(secret, at + 16 * i)
        result += _mul128_fold64(acc[2 * i] ^ k0, acc[2 * i + 1] ^ k1)
    return _avalanche(result & M64)


# --- XXH3-64 ---------------------------------------------------------------------------------


def _h64_0to16(data: memoryview, n: int, secret: bytes, seed: int) -> int:
    if n > 8:
        flip1 = ((_u64(secret, 24)[0] ^ _u64(secret, 32)[0]) + seed) & M64
        flip2 = ((_u64(secret, 40)[0] ^ _u64(secret, 48)[0]) - seed) & M64
        lo = _u64(data, 0)[0] ^ flip1
        hi = _u64(data, n - 8)[0] ^ flip2
        return _avalanche((n + _swap64(lo) + hi + _mul128_fold64(lo, hi)) & M64)
    if n >= 4:
        seed ^= _swap32(seed & M32) << 32
        in1, in2 = _u32(data, 0)[0], _u32(data, n - 4)[0]
        flip = ((_u64(secret, 8)[0] ^ _u64(secret, 16)[0]) - seed) & M64
        return _rrmxmx((in2 + (in1 << 32)) ^ flip, n)
    if n:
        c1, c2, c3 = data[0], data[n >> 1], data[n - 1]
        combined = (c1 << 16) | (c2 << 24) | c3 | (n << 8)
        flip = ((_u32(secret, 0)[0] ^ _u32(secret, 4)[0]) + seed) & M64
        return _xxh64_avalanche(combined ^ flip)
    return _xxh64_avalanche(seed ^ _u64(secret, 56)[0] ^ _u64(secret, 64)[0])


def _h64_17to128(data: memoryview, n: int, secret: bytes, seed: int) -> int:
    acc = n * PRIME64_1
    for i in range((n - 1) // 32, -1, -1):
        acc += _mix16(data, 16 * i, secret, 32 * i, seed)
        acc += _mix16(data, n - 16 * (i + 1), secret, 32 * i + 16, seed)
    return _avalanche(acc & M64)


def _h64_129to240(data: memoryview, n: int, secret: bytes, seed: int) -> int:
    acc = n * PRIME64_1
    for i in range(8):
        acc += _mix16(data, 16 * i, secret, 16 * i, seed)
    acc_end = _mix16(data, n - 16, secret, SECRET_SIZE_MIN - MIDSIZE_LASTOFFSET, seed)
    acc = _avalanche(acc & M64)
    for i in range(8, n // 16):
        acc_end += _mix16(data, 16 * i, secret, 16 * (i - 8) + MIDSIZE_STARTOFFSET, seed)
    return _avalanche((acc + acc_end) & M64)


def _h64(data: memoryview, seed: int) -> int:
    n = len(data)
    if n <= 16:
        return _h64_0to16(data, n, K_SECRET, seed)
    if n <= 128:
        return _h64_17to128(data, n, K_SECRET, seed)
    if n <= MIDSIZE_MAX:
        return _h64_129to240(data, n, K_SECRET, seed)
    secret = _custom_secret(seed) if seed else K_SECRET
    acc = _long_accumulators(data, n, secret)
    return _merge(acc, secret, SECRET_MERGEACCS_START, n * PRIME64_1)


# --- XXH3-128 (high 64 bits, low 64 bits) ---------------------------------------------------


def _h128_0to16(data: memoryview, n: int, secret: bytes, seed: int) -> tuple[int, int]:
    if n > 8:
        flip_lo = ((_u64(secret, 32)[0] ^ _u64(secret, 40)[0]) - seed) & M64
        flip_hi = ((_u64(secret, 48)[0] ^ _u64(secret, 56)[0]) + seed) & M64
        in_lo, in_hi = _u64(data, 0)[0], _u64(data, n - 8)[0]
        m = (in_lo ^ in_hi ^ flip_lo) * PRIME64_1
        m_lo, m_hi = m & M64, m >> 64
        m_lo = (m_lo + ((n - 1) << 54)) & M64
        in_hi ^= flip_hi
        m_hi = (m_hi + in_hi + (in_hi & M32) * (PRIME32_2 - 1)) & M64
        m_lo ^= _swap64(m_hi)
        h = m_lo * PRIME64_2
        h_lo, h_hi = h & M64, ((h >> 64) + m_hi * PRIME64_2) & M64
        return _avalanche(h_hi), _avalanche(h_lo)
    if n >= 4:
        seed ^= _swap32(seed & M32) << 32
        in_lo, in_hi = _u32(data, 0)[0], _u32(data, n - 4)[0]
        flip = ((_u64(secret, 16)[0] ^ _u64(secret, 24)[0]) + seed) & M64
        m = ((in_lo + (in_hi << 32)) ^ flip) * ((PRIME64_1 + (n << 2)) & M64)
        m_lo, m_hi = m & M64, m >> 64
        m_hi = (m_hi + (m_lo << 1)) & M64
        m_lo ^= m_hi >> 3
        m_lo ^= m_lo >> 35
        m_lo = (m_lo * PRIME_MX2) & M64
        m_lo ^= m_lo >> 28
        return _avalanche(m_hi), m_lo
    if n:
        c1, c2, c3 = data[0], data[n >> 1], data[n - 1]
        lo = (c1 << 16) | (c2 << 24) | c3 | (n << 8)
        hi = _rotl32(_swap32(lo), 13)
        flip_lo = ((_u32(secret, 0)[0] ^ _u32(secret, 4)[0]) + seed) & M64
        flip_hi = ((_u32(secret, 8)[0] ^ _u32(secret, 12)[0]) - seed) & M64
        return _xxh64_avalanche(hi ^ flip_hi), _xxh64_avalanche(lo ^ flip_lo)
    flip_lo = _u64(secret, 64)[0] ^ _u64(secret, 72)[0]
    flip_hi = _u64(secret, 80)[0] ^ _u64(secret, 88)[0]
    return _xxh64_avalanche(seed ^ flip_hi), _xxh64_avalanche(seed ^ flip_lo)


def _mix32(
    acc: tuple[int, int], data: memoryview, a: int, b: int, secret: bytes, s_at: int, seed: int
) -> tuple[int, int]:
    lo, hi = acc
    a0, a1 = _u64x2(data, a)
    b0, b1 = _u64x2(data, b)
    lo = (lo + _mix16(data, a, secret, s_at, seed)) & M64
    lo ^= (b0 + b1) & M64
    hi = (hi + _mix16(data, b, secret, s_at + 16, seed)) & M64
    hi ^= (a0 + a1) & M64
    return lo, hi


def _finish128_mid(acc: tuple[int, int], n: int, seed: int) -> tuple[int, int]:
    lo, hi = acc
    h_lo = (lo + hi) & M64
    h_hi = (lo * PRIME64_1 + hi * PRIME64_4 + ((n - seed) & M64) * PRIME64_2) & M64
    return (-_avalanche(h_hi)) & M64, _avalanche(h_lo)


def _h128_17to128(data: memoryview, n: int, secret: bytes, seed: int) -> tuple[int, int]:
    acc = ((n * PRIME64_1) & M64, 0)
    for i in range((n - 1) // 32, -1, -1):
        acc = _mix32(acc, data, 16 * i, n - 16 * (i + 1), secret, 32 * i, seed)
    return _finish128_mid(acc, n, seed)


def _h128_129to240(data: memoryview, n: int, secret: bytes, seed: int) -> tuple[int, int]:
    acc = ((n * PRIME64_1) & M64, 0)
    for i in range(32, 160, 32):
        acc = _mix32(acc, data, i - 32, i - 16, secret, i - 32, seed)
    acc = (_avalanche(acc[0]), _avalanche(acc[1]))
    for i in range(160, n + 1, 32):
        acc = _mix32(acc, data, i - 32, i - 16, secret, MIDSIZE_STARTOFFSET + i - 160, seed)
    last_key = SECRET_SIZE_MIN - MIDSIZE_LASTOFFSET - 16
    acc = _mix32(acc, data, n - 16, n - 32, secret, last_key, (-seed) & M64)
    return _finish128_mid(acc, n, seed)


def _h128(data: memoryview, seed: int) -> tuple[int, int]:
    n = len(data)
    if n <= 16:
        return _h128_0to16(data, n, K_SECRET, seed)
    if n <= 128:
        return _h128_17to128(data, n, K_SECRET, seed)
    if n <= MIDSIZE_MAX:
        return _h128_129to240(data, n, K_SECRET, seed)
    secret = _custom_secret(seed) if seed else K_SECRET
    acc = _long_accumulators(data, n, secret)
    low = _merge(acc, secret, SECRET_MERGEACCS_START, n * PRIME64_1)
    high_at = SECRET_SIZE - STRIPE_LEN - SECRET_MERGEACCS_START
    high = _merge(acc, secret, high_at, ~(n * PRIME64_2) & M64)
    return high, low


# --- the public API, the same as the compiled module's -------------------------------------


def _bytes_of(data: object) -> memoryview:
    """A flat byte view of any C-contiguous buffer (bytes, bytearray, memoryview, array …)."""
    view = memoryview(data)  # type: ignore[arg-type]
    if view.ndim != 1 or view.itemsize != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    return view


def _seed(seed: int) -> int:
    if not 0 <= seed <= M64:
        raise OverflowError(f"seed {seed} does not fit in 64 unsigned bits")
    return seed


def xxh3_64(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """XXH3-64 of one buffer."""
    return _h64(_bytes_of(data), _seed(seed))


def xxh3_128(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """XXH3-128 of one buffer as an int, high 64 bits first."""
    high, low = _h128(_bytes_of(data), _seed(seed))
    return (high << 64) | low


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
    seed = _seed(seed)
    digests = [_h64(_bytes_of(b), seed) for b in buffers]
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
    seed = _seed(seed)
    pairs = [_h128(_bytes_of(b), seed) for b in buffers]
    if packed:
        return array("Q", [word for pair in pairs for word in pair])
    return [(high << 64) | low for high, low in pairs]


def _file_digest(path: str | os.PathLike[str], digest) -> int:
    """The file mapped read-only and hashed in one pass (the page cache streams it)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return digest(b"")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return digest(view)
            finally:
                view.release()


def xxh3_64_file(path: str | os.PathLike[str], seed: int = 0) -> int:
    """XXH3-64 of a file's contents."""
    return _file_digest(path, lambda view: xxh3_64(view, seed))


def xxh3_128_file(path: str | os.PathLike[str], seed: int = 0) -> int:
    """XXH3-128 of a file's contents."""
    return _file_digest(path, lambda view: xxh3_128(view, seed))
