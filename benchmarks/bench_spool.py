"""Spool throughput against plain file appends measured in the same run (prints JSON).

Never run in the test suite: it writes a few hundred MB to a temporary directory.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from denpex.agent.spool import Spool
from denpex.core import jsonio


def record(i: int) -> dict:
    return {
        "id": f"ev-{i:09d}",
        "body": "NCCL WARN Call to ibv_poll_cq failed with error 12 " * 2,
        "ts_ns": 1_700_000_000_000_000_000 + i,
        "host": "node-17",
        "source": "log",
        "kind": "line",
        "rank": 3,
        "signature": "nccl.ib_poll",
        "category": "fabric.ib",
        "severity": "error",
        "attrs": {"line": i},
    }


def main(n: int = 200_000, batch: int = 256) -> dict:
    records = [record(i) for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.jsonl"
        start = time.perf_counter()
        with open(plain, "ab") as f:  # baseline: orjson lines appended to one file
            for i in range(0, n, batch):
                f.write(b"".join(jsonio.dumps(r) + b"\n" for r in records[i : i + batch]))
                f.flush()
        plain_s = time.perf_counter() - start
        size = os.path.getsize(plain)

        spool = Spool(Path(tmp) / "spool", fsync="never", max_bytes=1 << 30)
        start = time.perf_counter()
        for i in range(0, n, batch):
            spool.append(records[i : i + batch])
        append_s = time.perf_counter() - start
        start = time.perf_counter()
        got = 0
        while True:
            cursor, out = spool.read(batch)
            if not out:
                break
            spool.ack(cursor)
            got += len(out)
        read_s = time.perf_counter() - start
        spool.close()
    assert got == n
    return {
        "records": n,
        "bytes_plain": size,
        "plain_append_rec_per_s": round(n / plain_s),
        "spool_append_rec_per_s": round(n / append_s),
        "spool_read_ack_rec_per_s": round(n / read_s),
        "append_ratio_vs_plain": round(plain_s / append_s, 3),
    }


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:])), indent=2))
