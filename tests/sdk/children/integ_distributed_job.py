"""Two gloo ranks (spawned) check what sdk.integrations.distributed hands to dx.watch: DDP's
process group, an FSDP2 model's shard group (replicas off), and a DeepSpeed-like engine's
data-parallel group, rank and ZeRO stage. Each rank writes OUT/integ-<rank>.json.

Usage: integ_distributed_job.py OUT PORT
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from denpex.sdk.integrations.distributed import replicas_of, watch_engine, watch_model


def train(guard, model, optimizer, steps: int = 3) -> None:
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        guard.step(loss=float(loss.detach()))
    guard.close()


def run_rank(rank: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    got: list = []
    result: dict = {}
    options = {"every": 1, "emit": got.append, "hang_floor_s": 60}

    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    guard = watch_model(ddp, opt, **options)
    result["ddp_group_is_model_group"] = guard.group is ddp.process_group
    result["ddp_replicated"] = replicas_of(ddp).replicated
    train(guard, ddp, opt)

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2,))
        sharded = fully_shard(
            torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)), mesh=mesh
        )
        found = replicas_of(sharded)
        result["fsdp2_group_is_mesh_group"] = found.group is mesh.get_group(0)
        result["fsdp2_replicated"] = found.replicated
        opt2 = torch.optim.SGD(sharded.parameters(), lr=0.01)
        guard = watch_model(sharded, opt2, **options)
        result["fsdp2_replicas_option"] = guard.options["replicas"]
        train(guard, sharded, opt2)
    except Exception as exc:  # FSDP2 on CPU depends on the torch build: say why
        result["fsdp2_error"] = repr(exc)

    dp_group = dist.new_group([0, 1])
    module = torch.nn.Linear(8, 2)
    engine = SimpleNamespace(
        module=module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.01),
        data_parallel_group=dp_group,
        global_rank=rank,
        zero_optimization_stage=lambda: 3,
    )
    guard = watch_engine(engine, **options)
    result["engine_model"] = guard.model is module
    result["engine_optimizer"] = guard.optimizer is engine.optimizer
    result["engine_group"] = guard.group is dp_group
    result["engine_rank"] = guard.rank
    result["engine_replicas_option"] = guard.options["replicas"]
    train(guard, module, engine.optimizer)
    result["evidence"] = [getattr(e, "signature", None) for e in got if hasattr(e, "signature")]
    Path(out, f"integ-{rank}.json").write_bytes(orjson.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run_rank, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
