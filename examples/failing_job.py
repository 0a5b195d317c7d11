"""A simulated 4-rank training job that fails the way real ones do: rank 2 runs out of GPU
memory, the other ranks' NCCL watchdogs time out waiting for it, torchrun tears it all down.

No GPU or PyTorch needed: it prints what such a job prints, with the timing compressed, and
exits 1 like torchrun. Try it:  denpex run -- python examples/failing_job.py
"""

import socket
import sys
import time
from datetime import UTC, datetime

HOST = socket.gethostname()
WORLD = 4
FAILING_RANK = 2


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def out(line: str, stream=sys.stdout, pause: float = 0.0) -> None:
    stream.write(line + "\n")
    stream.flush()
    if pause:
        time.sleep(pause)


def main() -> int:
    err = sys.stderr
    out(
        f"{now()} - torch.distributed.run - WARNING - Setting OMP_NUM_THREADS to 1 for each process."
    )
    for rank in range(WORLD):
        out(
            f"[rank{rank}]:{HOST}:{4100 + rank}:{4100 + rank} [{rank}] NCCL INFO Bootstrap : Using eth0:10.0.0.11<0>"
        )
        out(
            f"[rank{rank}]:{HOST}:{4100 + rank}:{4100 + rank} [{rank}] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin."
        )
    out(f"[rank0]:{HOST}:4100:4100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4")
    for step in range(10, 60, 10):
        loss = 2.9 - step * 0.01
        out(
            f"[rank0]:{now()} - train - INFO - step {step:5d} | loss {loss:.4f} | lr 3.0e-04 | 182.4 TFLOP/s",
            pause=0.05,
        )
    r = FAILING_RANK
    out(f"[rank{r}]:Traceback (most recent call last):", err)
    out(f'[rank{r}]:  File "/workspace/train.py", line 212, in <module>', err)
    out(f"[rank{r}]:    loss = model(batch).loss", err)
    out(f'[rank{r}]:  File "/workspace/model.py", line 88, in forward', err)
    out(f"[rank{r}]:    attn = torch.softmax(scores, dim=-1)", err)
    out(
        f"[rank{r}]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. "
        f"GPU {r} has a total capacity of 79.10 GiB of which 2.19 GiB is free. Including non-PyTorch "
        "memory, this process has 76.90 GiB memory in use. Of the allocated memory 71.20 GiB is "
        "allocated by PyTorch, and 4.21 GiB is reserved by PyTorch but unallocated.",
        err,
        pause=0.3,
    )
    for rank in (0, 1, 3):
        out(
            f"[rank{rank}]:[E{datetime.now(UTC):%m%d %H:%M:%S.%f} {4100 + rank} "
            f"ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1287, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, "
            "Timeout(ms)=600000) ran for 600038 milliseconds before timing out.",
            err,
        )
    out(
        f"{now()} - torch.distributed.elastic.multiprocessing.api - WARNING - Sending process 4100 closing signal SIGTERM",
        err,
    )
    out(
        f"{now()} - torch.distributed.elastic.multiprocessing.api - ERROR - failed (exitcode: 1) local_rank: {r} (pid: {4100 + r}) of binary: /usr/bin/python3",
        err,
    )
    out("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", err)
    out("============================================================", err)
    out("train.py FAILED", err)
    return 1


if __name__ == "__main__":
    sys.exit(main())
