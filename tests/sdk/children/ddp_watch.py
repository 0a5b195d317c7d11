"""DDP training on CPU (gloo, torch.multiprocessing spawn) with dx.watch on every rank; each
rank writes the evidence it emits as JSON lines to OUT/rank<R>.jsonl.

Usage: ddp_watch.py OUT --ranks N --steps S --check-every K [--flip-rank R --flip-step T]
[--slots N]. With --flip-rank, rank R flips one bit of one parameter right after step T.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

FLIPPED_PARAM = "net.2.weight"  # the name the parent test expects in the evidence


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flip_one_bit(tensor, index: int = 3, bit: int = 0) -> None:
    """Flip bit `bit` of element `index` in place, through an int32 view of the storage."""
    import torch

    with torch.no_grad():
        bits = tensor.data.view(-1).view(torch.int32)
        bits[index] ^= 1 << bit


def worker(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import denpex.sdk as dx
    from denpex.core.wire import event_to_dict, evidence_to_dict

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks
    )
    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts them anyway)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
            self.head = nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.net(x))

    model = Net()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    out = open(Path(args.out) / f"rank{rank}.jsonl", "w")  # noqa: SIM115 - closed below

    def emit(item) -> None:
        data = evidence_to_dict(item) if hasattr(item, "signature") else event_to_dict(item)
        out.write(json.dumps(data) + "\n")
        out.flush()

    options = {"replica_slots": args.slots} if args.slots else {}
    guard = dx.watch(
        model,
        optimizer,
        every=args.check_every,
        checksum_every=args.check_every,
        emit=emit,
        progress=False,
        **options,
    )
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        optimizer.zero_grad()
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        if rank == args.flip_rank and step == args.flip_step:
            flip_one_bit(dict(model.named_parameters())[FLIPPED_PARAM])
        guard.step(loss)
    guard.close()
    out.close()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--check-every", type=int, default=5)
    parser.add_argument("--flip-rank", type=int, default=-1)
    parser.add_argument("--flip-step", type=int, default=-1)
    parser.add_argument("--slots", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
