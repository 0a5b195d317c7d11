"""Benchmark: denpex's XXH3 checksums against the `xxhash` package, in the same run.

Times one large buffer (target >= 0.8x xxhash) and many small ones in one call against a Python
loop over xxhash (target >= 2x), and prints JSON with GB/s and the ratios. It never reports a
number it did not measure in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from denpex._native import backend, load

TARGETS = {"large_vs_xxhash": 0.8, "many_small_vs_xxhash_loop": 2.0}


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mb", type=int, default=256)
    parser.add_argument("--small-count", type=int, default=10_000)
    parser.add_argument("--small-bytes", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import xxhash

    checksum = load("checksum")
    large = os.urandom(1 << 20) * args.large_mb
    small = [os.urandom(args.small_bytes) for _ in range(args.small_count)]
    assert checksum.xxh3_64(large) == xxhash.xxh3_64_intdigest(large)
    ours_large = best(lambda: checksum.xxh3_64(large), args.repeat)
    theirs_large = best(lambda: xxhash.xxh3_64_intdigest(large), args.repeat)
    digest = xxhash.xxh3_64_intdigest
    ours_small = best(lambda: checksum.xxh3_64_many(small), args.repeat)
    theirs_small = best(lambda: [digest(b) for b in small], args.repeat)
    small_bytes = args.small_count * args.small_bytes
    ratios = {
        "large_vs_xxhash": round(theirs_large / ours_large, 3),
        "many_small_vs_xxhash_loop": round(theirs_small / ours_small, 3),
    }
    result = {
        "benchmark": "checksum",
        "backend": backend("checksum"),
        "large": {
            "bytes": len(large),
            "denpex_gb_s": round(len(large) / 1e9 / ours_large, 2),
            "xxhash_gb_s": round(len(large) / 1e9 / theirs_large, 2),
        },
        "many_small": {
            "count": args.small_count,
            "bytes_each": args.small_bytes,
            "denpex_gb_s": round(small_bytes / 1e9 / ours_small, 2),
            "xxhash_loop_gb_s": round(small_bytes / 1e9 / theirs_small, 2),
        },
        "ratios": ratios,
        "targets": TARGETS,
        "targets_met": {k: ratios[k] >= v for k, v in TARGETS.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
