"""One rank of the cluster drill's training job: a small model trained with gloo all_reduce
on CPU, parameters checked across replicas by the denpex SDK (denpex.sdk.watch).

Driven by files in DRILL_DIR: it writes `pid<rank>` once the process group is up, and on
each step looks for `flip<rank>` (flip one bit of one parameter, as a faulty GPU's memory
would), `lost<rank>` (its GPU is gone: the CUDA error the framework then raises) and
`hog<rank>` (allocate far past its memory cgroup's limit). Exits after DRILL_STEPS steps.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import denpex.sdk as dx

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
control = Path(os.environ["DRILL_DIR"])
timeout = timedelta(seconds=float(os.environ.get("DRILL_TIMEOUT_S", "20")))
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
torch.manual_seed(0)  # every replica starts from the same parameters
model = torch.nn.Linear(32, 32)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
guard = dx.watch(model, optimizer, every=1, checksum_every=1)
(control / f"pid{rank}").write_text(str(os.getpid()))
data = torch.ones(8, 32)
for step in range(int(os.environ.get("DRILL_STEPS", "100000"))):
    if (control / f"lost{rank}").exists():
        raise RuntimeError("CUDA error: unspecified launch failure")
    if (control / f"hog{rank}").exists():  # a leak far beyond the job's memory limit
        hoard = [bytearray(64 << 20) for _ in range(64)]
    flip = control / f"flip{rank}"
    if flip.exists():
        flip.unlink()
        with torch.no_grad():  # one bit of one weight, as a bad memory cell flips it
            bits = model.weight.view(torch.int32)
            bits[3, 5] ^= 1 << 22
    loss = model(data).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():  # data parallel: the gradients are averaged
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    guard.step(loss)
    print(f"step {step} loss {loss.item():.6f}", flush=True)
    time.sleep(0.2)
guard.close()
dist.destroy_process_group()
sys.exit(0)
