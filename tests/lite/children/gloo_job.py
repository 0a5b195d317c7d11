"""One rank of a small CPU (gloo) job that fails in a chosen way, started by torchrun.

Usage (as torchrun's script): gloo_job.py MODE [ARG]
  oom      rank 1 allocates far past its memory cgroup's limit (the OOM killer takes it)
  segv     rank 0 dereferences NULL in native code (SIGSEGV); rank 1 waits in a collective
  fifo     rank 1 opens the FIFO ARG (nobody writes it: blocked in open()); the others time
           out in gloo's all_reduce after 6 s
  diskfull rank 0 writes into the folder ARG until ENOSPC; before that, rank 1 writes an
           unrelated OOM kill and an unrelated Xid (marked lines) into the kernel log
"""

from __future__ import annotations

import ctypes
import datetime
import os
import sys
import time

MARKER = "denpex-test-injected"  # denpex.core.kmsg.TEST_MARKER (this child imports no denpex)


def inject(line: str) -> None:
    """A fresh open per line: the kernel rate-limits user-space writes per open file."""
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"{line} {MARKER}\n".encode())
    finally:
        os.close(fd)


def main() -> int:
    import torch
    import torch.distributed as dist

    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=6))
    dist.barrier()
    print(f"rank {rank} ready", flush=True)
    time.sleep(1.5)  # long enough for the wrapper to see every rank's environment
    if mode == "oom" and rank == 1:
        hog = [bytearray(16 << 20) for _ in range(64)]  # 1 GiB, far past the limit
        print(f"never reached {len(hog)}", flush=True)
    if mode == "segv" and rank == 0:
        ctypes.string_at(0)  # SIGSEGV in native code
    if mode == "fifo" and rank == 1:
        with open(sys.argv[2], "rb") as blocked:  # no writer: blocks here
            blocked.read()
    if mode == "diskfull":
        if rank == 1:
            inject(
                "<3>Memory cgroup out of memory: Killed process 999999 (neighbour) "
                "total-vm:2048kB, anon-rss:1024kB, file-rss:0kB, shmem-rss:0kB, UID:0 "
                "pgtables:40kB oom_score_adj:0"
            )
            inject(
                "<3>NVRM: Xid (PCI:0000:df:00): 79, pid=999998, name=neighbour, "
                "GPU has fallen off the bus."
            )
        time.sleep(0.5)
        if rank == 0:
            with open(os.path.join(sys.argv[2], "checkpoint.pt"), "wb") as out:
                while True:
                    out.write(b"\0" * (1 << 20))
                    out.flush()
    tensor = torch.ones(4)
    dist.all_reduce(tensor)  # the ranks that got here wait for the one that did not
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
