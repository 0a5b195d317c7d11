"""Four gloo ranks (spawned) under Megatron-Core tensor parallelism 2, so data parallelism 2:
data-parallel groups {0, 2} and {1, 3}. Tensor-parallel peers hold different shards (another
seed), data-parallel peers identical copies; rank 3 flips one weight after the first step.
Each rank writes OUT/megatron-<rank>.json with its groups and the evidence its guard emitted.

Usage: integ_megatron_job.py OUT PORT
"""

from __future__ import annotations

import datetime
import os
import sys
import warnings
from pathlib import Path

import orjson
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

warnings.simplefilter("ignore")  # Megatron-Core warns that Apex/Transformer Engine are absent


def run_rank(rank: int, out: str, port: int) -> None:
    from megatron.core import parallel_state

    from denpex.sdk.integrations.megatron import parallelism, watch_megatron

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=90))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    place = parallelism()
    torch.manual_seed(place.tensor_rank)  # shards differ across TP, copies agree across DP
    model = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)]  # two virtual pipeline chunks
    chunks = torch.nn.ModuleList(model)
    optimizer = torch.optim.SGD(chunks.parameters(), lr=0.0)  # lr 0: replicas stay equal
    got: list = []
    guard = watch_megatron(model, optimizer, every=1, checksum_every=1, emit=got.append,
                           progress=False)  # fmt: skip
    for step in range(4):
        loss = chunks[1](chunks[0](torch.randn(4, 8))).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 1 and rank == 3:
            with torch.no_grad():  # a bit flip outside the optimizer on one replica
                chunks[0].weight.view(-1)[5] += 1.0
        guard.step(loss=float(loss.detach()))
    guard.close()
    result = {
        "tensor_rank": place.tensor_rank,
        "data_rank": place.data_rank,
        "data_world_size": place.data_world_size,
        "data_group": dist.get_process_group_ranks(place.data_group),
        "guard_rank": guard.rank,
        "guard_world": guard.world_size,
        "evidence": sorted({e.signature for e in got if hasattr(e, "signature")}),
    }
    Path(out, f"megatron-{rank}.json").write_bytes(orjson.dumps(result))
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run_rank, args=(sys.argv[1], int(sys.argv[2])), nprocs=4, join=True)
