"""Benchmark: the ingest ring buffer, native against its reference, 4 KB writes (target >= 1 GB/s).

A producer writes `--size-mb` of training-log bytes in 4 KB chunks while the consumer drains
every 64 writes, raw (`read`) and framed (`read_lines`); prints JSON with GB/s and the ratios.
"""

from __future__ import annotations

import argparse
import json
import time

from denpex._native import backend, load, ringbuf_ref

TARGET_GB_S = 1.0


def run(module, chunks: list[bytes], framed: bool) -> float:
    ring = module.RingBuffer(1 << 22)
    drain = ring.read_lines if framed else ring.read
    write = ring.write
    started = time.perf_counter()
    for k, chunk in enumerate(chunks):
        write(chunk)
        if k % 64 == 63:
            drain()
    drain()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=4096)
    args = parser.parse_args()
    line = b"[rank3]: step 1200/100000 | loss 2.3456 | lr 3.0e-04 | grad_norm 0.871\n"
    block = (line * (args.chunk // len(line) + 1))[: args.chunk]
    chunks = [block] * (args.size_mb * (1 << 20) // args.chunk)
    total = len(chunks) * args.chunk
    native = load("ringbuf")
    result: dict = {"benchmark": "ringbuf", "backend": backend("ringbuf"), "bytes": total}
    for framed in (False, True):
        name = "read_lines" if framed else "read"
        ours = min(run(native, chunks, framed) for _ in range(3))
        ref = min(run(ringbuf_ref, chunks, framed) for _ in range(3))
        result[name] = {
            "native_gb_s": round(total / 1e9 / ours, 2),
            "reference_gb_s": round(total / 1e9 / ref, 2),
            "ratio": round(ref / ours, 2),
        }
    result["target_gb_s"] = TARGET_GB_S
    result["target_met"] = result["read"]["native_gb_s"] >= TARGET_GB_S
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
