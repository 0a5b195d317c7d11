"""Watch models trained with plain torch.distributed, DDP, FSDP (1 and 2) or a DeepSpeed
engine: finds the module, the optimizer and the process group of this rank's replicas.

It never creates process groups and never calls a collective itself; torch is imported only
when a function here runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import denpex.sdk as dx


@dataclass(frozen=True, slots=True)
class Replicas:
    """Where this rank's parameters have copies: `group` (None: the whole world) and whether
    the parameters held here are replicated in it (False: sharded, nothing to compare)."""

    group: Any
    replicated: bool


def replicas_of(model: Any) -> Replicas:
    """The replica group of a DDP, FSDP1 or FSDP2 model; the world for a plain module."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Replicas(None, True)
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return Replicas(model.process_group, True)
    fsdp1 = _fsdp1_replicas(model)
    if fsdp1 is not None:
        return fsdp1
    fsdp2 = _fsdp2_replicas(model)
    if fsdp2 is not None:
        return fsdp2
    return Replicas(None, True)


def _fsdp1_replicas(model: Any) -> Replicas | None:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    except ImportError:
        return None
    if not isinstance(model, FullyShardedDataParallel):
        return None
    strategy = model.sharding_strategy
    if strategy == ShardingStrategy.NO_SHARD:
        return Replicas(model.process_group, True)
    inter_node = getattr(model, "_inter_node_pg", None)
    if inter_node is not None:  # hybrid: shards within a node, replicas across nodes
        return Replicas(inter_node, True)
    return Replicas(model.process_group, False)


def _fsdp2_replicas(model: Any) -> Replicas | None:
    """FSDP2 (`fully_shard`): parameters are DTensors on a 1-D (shard) or 2-D (HSDP) mesh."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    module: Any = model  # an FSDPModule is always an nn.Module too (mypy sees only the mixin)
    if not isinstance(model, FSDPModule):
        return None
    mesh = next((p.device_mesh for p in module.parameters() if hasattr(p, "device_mesh")), None)
    if mesh is None:
        return None
    if mesh.ndim >= 2:  # HSDP: dim 0 replicates, dim 1 shards
        return Replicas(mesh.get_group(0), True)
    return Replicas(mesh.get_group(0), False)


def watch_model(model: Any, optimizer: Any = None, **watch_options: Any) -> dx.Guard:
    """`dx.watch` with the replica group of a DDP/FSDP model filled in; replica comparison is
    switched off where parameters are sharded (FSDP full/grad-op sharding)."""
    found = replicas_of(model)
    options = dict(watch_options)
    options.setdefault("group", found.group)
    if not found.replicated:
        options.setdefault("replicas", False)
    return dx.watch(model, optimizer, **options)


@dataclass(frozen=True, slots=True)
class EngineParts:
    module: Any
    optimizer: Any
    group: Any
    rank: int | None
    replicated: bool


def engine_parts(engine: Any) -> EngineParts:
    """What `watch_engine` passes to `dx.watch` for a DeepSpeed engine: its module, its
    (ZeRO) optimizer, its data-parallel group (the sequence-and-data-parallel group when
    sequence parallelism is on: gradients are reduced over it, so parameters agree in it), its
    global rank; ZeRO stage 3 partitions parameters, so there is nothing to compare."""
    group = getattr(engine, "seq_data_parallel_group", None)
    if group is None:
        group = getattr(engine, "data_parallel_group", None)
    stage_of = getattr(engine, "zero_optimization_stage", None)
    stage = stage_of() if callable(stage_of) else 0
    rank = getattr(engine, "global_rank", None)
    return EngineParts(
        module=engine.module,
        optimizer=getattr(engine, "optimizer", None),
        group=group,
        rank=int(rank) if rank is not None else None,
        replicated=stage < 3,
    )


def watch_engine(engine: Any, **watch_options: Any) -> dx.Guard:
    """`dx.watch` for a DeepSpeed engine (see `engine_parts`). After each `engine.step()`:
    `guard.step(loss=loss, loss_scale=loss_scale_of(engine))`."""
    parts = engine_parts(engine)
    options = dict(watch_options)
    options.setdefault("group", parts.group)
    options.setdefault("rank", parts.rank)
    if not parts.replicated:
        options.setdefault("replicas", False)
    return dx.watch(parts.module, parts.optimizer, **options)


def loss_scale_of(engine_or_optimizer: Any) -> float | None:
    """The current fp16 loss scale of a DeepSpeed engine or optimizer; None without one."""
    for target in (engine_or_optimizer, getattr(engine_or_optimizer, "optimizer", None)):
        for name in ("cur_scale", "loss_scale"):
            value = getattr(target, name, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None
