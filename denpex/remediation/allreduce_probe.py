"""The spares' all-reduce preflight, one process per host: `srun --nodelist SPARES
--ntasks-per-node 1 python3 -m denpex.remediation.allreduce_probe` (rank and world from
Slurm's or torchrun's environment). NCCL where a GPU is present, gloo otherwise; exit 0 only
when every rank summed the same, expected value.

It must never pass a rank it did not hear from: a missing peer is a timeout, exit 1.
"""

from __future__ import annotations

import datetime
import os
import sys
import time


def _env(name: str, *fallbacks: str, default: str | None = None) -> str:
    for key in (name, *fallbacks):
        if os.environ.get(key):
            return os.environ[key]
    if default is None:
        raise SystemExit(f"allreduce_probe: {name} is not set (run it under srun or torchrun)")
    return default


def main() -> int:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("allreduce_probe: torch is not installed", file=sys.stderr)
        return 2
    rank = int(_env("RANK", "SLURM_PROCID"))
    world = int(_env("WORLD_SIZE", "SLURM_NTASKS"))
    os.environ.setdefault("MASTER_ADDR", _env("MASTER_ADDR", default="127.0.0.1"))
    os.environ.setdefault("MASTER_PORT", _env("MASTER_PORT", default="29431"))
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    started = time.monotonic()
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else "cpu"
        value = torch.full((1 << 20,), float(rank + 1), device=device)
        dist.all_reduce(value)
        expected = world * (world + 1) / 2
        ok = bool(torch.all(value == expected).item())
    finally:
        dist.destroy_process_group()
    print(
        f"allreduce_probe: rank {rank}/{world} {backend} sum={value[0].item():g} "
        f"expected={expected:g} {'ok' if ok else 'WRONG'} in {time.monotonic() - started:.2f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
