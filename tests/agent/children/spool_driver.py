"""Child process for the spool kill -9 test: appends uniquely-id'd evidence to a spool and
prints each id (flushed) only after append() returned, while a Shipper sends to the
receiver. With --drain it adds nothing and exits once the spool is empty.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from denpex.agent.otlp import OtlpHttpExporter
from denpex.agent.shipper import Shipper
from denpex.agent.spool import Spool
from denpex.core.events import Event, Evidence


def make_evidence(evidence_id: str) -> Evidence:
    event = Event(
        body=f"NCCL WARN unhandled error {evidence_id}",
        ts_ns=time.time_ns(),
        host="node-1",
        job="job-42",
        rank=3,
        attrs={"line": 7},
    )
    return Evidence(evidence_id, event, "nccl.unhandled", "comm.nccl", "error")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spool", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    args = parser.parse_args()

    spool = Spool(args.spool, segment_bytes=32 * 1024, fsync="batch")
    exporter = OtlpHttpExporter(args.endpoint, timeout_s=2.0)
    shipper = Shipper(spool, exporter, batch_size=64, max_backoff_s=0.3, min_backoff_s=0.05)
    shipper.start()
    if args.drain:
        deadline = time.monotonic() + args.drain_timeout
        while spool.stats()["records_pending"] and time.monotonic() < deadline:
            time.sleep(0.02)
        drained = shipper.stop(timeout=2.0)
        print("DRAINED" if drained else "NOT-DRAINED", flush=True)
        spool.close()
        return 0 if drained else 1

    token = os.urandom(4).hex()  # ids stay unique across restarts of this driver
    rng = random.Random()
    n = 0
    while True:
        batch = []
        for _ in range(rng.randint(1, 8)):
            batch.append(make_evidence(f"{token}-{n:06d}"))
            n += 1
        shipper.submit_evidence(batch)
        # Printed only now: an id on stdout is an acknowledged id.
        sys.stdout.write("".join(e.id + "\n" for e in batch))
        sys.stdout.flush()
        time.sleep(rng.uniform(0.0005, 0.003))


if __name__ == "__main__":
    sys.exit(main())
