"""A DDP job on CPU (gloo) whose rank R gets one bit flipped in a parameter at step 6;
dx.watch (replica checksums every step) must report it. By default the flipped rank then exits
1; with --exit-code 0 every rank exits 0, as a job whose silent corruption crashes nothing.

Usage: run_ddp_bitflip.py [--ranks N] [--flip-rank R] [--exit-code C]. Ranks are forked
processes with RANK set, as torchrun would start them.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(rank: int, world: int, flip_rank: int, port: int, exit_code: int) -> int:
    import torch
    import torch.distributed as dist

    import denpex.sdk as dx

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    guard = dx.watch(ddp, optimizer, every=1, checksum_every=1)
    torch.manual_seed(1 + rank)
    for step in range(12):
        x = torch.randn(8, 16)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 6 and rank == flip_rank:
            with torch.no_grad():  # one bit of one float in rank 2's replica: the SDC
                flat = model[0].weight.view(-1).view(torch.int32)
                flat[5] ^= 1 << 20
        guard.step(loss.item())
    guard.close()
    dist.destroy_process_group()
    return exit_code if rank == flip_rank else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--flip-rank", type=int, default=2)
    parser.add_argument("--exit-code", type=int, default=1, help="of the flipped rank")
    args = parser.parse_args()
    port = free_port()
    pids = []
    for rank in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = rank_main(rank, args.ranks, args.flip_rank, port, args.exit_code)
            finally:
                sys.stdout.flush()
                sys.exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
