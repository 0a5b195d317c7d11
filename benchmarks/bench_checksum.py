"""Benchmark: denpex's XXH3 checksums against the `xxhash` package, in the same run.

Times one large buffer (target >= 0.8x xxhash) and many small ones in one call against a Python
loop over xxhash that produces the same information (target >= 2x, for each result form): a list
of ints against `[xxh3_64_intdigest(b) for b in bufs]`, and the packed `array('Q')` against
`array('Q', map(xxh3_64_intdigest, bufs))`. The one call hashes on every CPU this process may use
(`threads=None`); the single-thread ratios (`threads=1`) are printed beside it, and so is a second,
tiny buffer size where the per-call cost of the loop dominates. Prints JSON with GB/s and ratios.
It never reports a number it did not measure in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from array import array

from denpex._native import backend, load

TARGETS = {
    "large_vs_xxhash": 0.8,
    "many_small_list_vs_xxhash_loop": 2.0,
    "many_small_packed_vs_xxhash_loop": 2.0,
}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def many_small(checksum, xxhash, count: int, size: int, repeat: int) -> dict:
    """One call against a Python loop over xxhash, for lists and for packed results."""
    bufs = [os.urandom(size) for _ in range(count)]
    digest = xxhash.xxh3_64_intdigest
    want = [digest(b) for b in bufs]
    assert checksum.xxh3_64_many(bufs) == want
    assert checksum.xxh3_64_many(bufs, packed=True) == array("Q", want)
    loop_list = best(lambda: [digest(b) for b in bufs], repeat)
    loop_packed = best(lambda: array("Q", map(digest, bufs)), repeat)
    ours = {
        "list": best(lambda: checksum.xxh3_64_many(bufs), repeat),
        "packed": best(lambda: checksum.xxh3_64_many(bufs, packed=True), repeat),
        "list_1_thread": best(lambda: checksum.xxh3_64_many(bufs, threads=1), repeat),
        "packed_1_thread": best(
            lambda: checksum.xxh3_64_many(bufs, packed=True, threads=1), repeat
        ),
    }
    total = count * size
    return {
        "count": count,
        "bytes_each": size,
        "xxhash_loop_gb_s": round(total / 1e9 / loop_list, 2),
        "denpex_gb_s": {k: round(total / 1e9 / v, 2) for k, v in ours.items()},
        "ratio_vs_xxhash_loop": {
            k: round((loop_packed if k.startswith("packed") else loop_list) / v, 3)
            for k, v in ours.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mb", type=int, default=256)
    parser.add_argument("--small-count", type=int, default=10_000)
    parser.add_argument("--small-bytes", type=int, default=4096)
    parser.add_argument("--tiny-bytes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import xxhash

    checksum = load("checksum")
    large = os.urandom(1 << 20) * args.large_mb
    assert checksum.xxh3_64(large) == xxhash.xxh3_64_intdigest(large)
    ours_large = best(lambda: checksum.xxh3_64(large), args.repeat)
    theirs_large = best(lambda: xxhash.xxh3_64_intdigest(large), args.repeat)
    small = many_small(checksum, xxhash, args.small_count, args.small_bytes, args.repeat)
    tiny = many_small(checksum, xxhash, args.small_count, args.tiny_bytes, args.repeat)
    ratios = {
        "large_vs_xxhash": round(theirs_large / ours_large, 3),
        "many_small_list_vs_xxhash_loop": small["ratio_vs_xxhash_loop"]["list"],
        "many_small_packed_vs_xxhash_loop": small["ratio_vs_xxhash_loop"]["packed"],
    }
    result = {
        "benchmark": "checksum",
        "backend": backend("checksum"),
        "cpus": usable_cpus(),
        "large": {
            "bytes": len(large),
            "denpex_gb_s": round(len(large) / 1e9 / ours_large, 2),
            "xxhash_gb_s": round(len(large) / 1e9 / theirs_large, 2),
        },
        "many_small": small,
        "many_tiny": tiny,
        "ratios": ratios,
        "targets": TARGETS,
        "targets_met": {k: ratios[k] >= v for k, v in TARGETS.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
