"""A job that reports silent data corruption on rank 2 through the SDK, then fails.

Usage: run_report_sdc.py [--ranks N]. Each rank is a forked process with RANK set (as torchrun
does); rank 2 emits train.sdc evidence, the other ranks then print NCCL watchdog timeouts and
the job exits 1. Where the evidence travels (socket or stderr) is the transport's choice.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from denpex.core.events import Event, Evidence


def emit(item: Evidence | Event) -> None:
    try:
        import denpex.sdk as dx

        dx.emit(item)
    except AttributeError:  # dx.emit not exported yet
        from denpex.sdk.transport import default_emit

        default_emit(item)


def sdc_evidence(rank: int) -> Evidence:
    event = Event(
        body=f"replica mismatch on rank {rank}: parameter layer1.weight differs at step 120",
        source="sdk",
        kind="state",
        rank=rank,
        attrs={"step": 120},
    )
    return Evidence(
        id=f"sdk-{os.getpid()}-1",
        event=event,
        signature="train.sdc.replica_mismatch",
        category="train.sdc",
        severity="error",
        captures={"rank": str(rank), "param": "layer1.weight", "step": "120"},
        summary=f"rank {rank}'s copy of layer1.weight differs from the other replicas",
        action="drain_node",
    )


def rank_main(rank: int, world: int) -> int:
    os.environ["RANK"] = str(rank)
    if rank == 2:
        emit(sdc_evidence(rank))
        return 1
    time.sleep(0.3)
    print(
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank {rank}] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600014 milliseconds before timing out.",
        file=sys.stderr,
        flush=True,
    )
    return 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    pids = []
    for rank in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = rank_main(rank, args.ranks)
            finally:
                sys.exit(code)  # sys.exit (not os._exit): the SDK flushes at exit
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    print(f"{failed} of {args.ranks} ranks failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
