"""Megatron-Core integration: `watch_megatron(model, optimizer)` after
`parallel_state.initialize_model_parallel(...)` watches this rank's model chunk(s) and
compares replicas only inside its data-parallel group (with context parallelism, the
data-and-context-parallel group gradients are reduced over): tensor- and pipeline-parallel
peers hold different shards and layers, never copies.

It never creates or changes process groups and never calls a collective itself; Megatron-Core
is imported only when a function here runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import denpex.sdk as dx


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Where this rank sits in Megatron-Core's parallel groups."""

    tensor_rank: int
    pipeline_rank: int
    data_rank: int
    data_world_size: int
    data_group: Any  # the group holding copies of this rank's parameters


def _parallel_state() -> Any:
    try:
        from megatron.core import parallel_state
    except ImportError as exc:
        raise ImportError(
            "denpex.sdk.integrations.megatron needs Megatron-Core: pip install megatron-core"
        ) from exc
    return parallel_state


def parallelism() -> Parallelism:
    """This rank's tensor, pipeline and data-parallel place; RuntimeError before
    `initialize_model_parallel` (there are no groups to compare in yet)."""
    ps = _parallel_state()
    if not ps.model_parallel_is_initialized():
        raise RuntimeError(
            "Megatron-Core model parallelism is not initialized: call "
            "parallel_state.initialize_model_parallel(...) before watch_megatron"
        )
    try:  # parameters are replicated across data and context parallel ranks alike
        group = ps.get_data_parallel_group(with_context_parallel=True)
    except TypeError:  # an older Megatron-Core without context parallelism
        group = ps.get_data_parallel_group()
    return Parallelism(
        tensor_rank=ps.get_tensor_model_parallel_rank(),
        pipeline_rank=ps.get_pipeline_model_parallel_rank(),
        data_rank=ps.get_data_parallel_rank(),
        data_world_size=ps.get_data_parallel_world_size(),
        data_group=group,
    )


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer to hook: Megatron's MegatronOptimizer wraps one in `.optimizer`;
    a chained or distributed optimizer without a single one gets no hooks (call
    `guard.step()` after `optimizer.step()`)."""
    import torch

    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        if isinstance(candidate, torch.optim.Optimizer):
            return candidate
    return None


def watch_megatron(model: Any, optimizer: Any = None, **watch_options: Any) -> dx.Guard:
    """`dx.watch` for a Megatron-Core model: a module, or the list of model chunks that
    virtual pipeline parallelism builds (watched together); replicas compared in the
    data-parallel group, the global rank as this rank's identity."""
    import torch
    import torch.distributed as dist

    place = parallelism()
    module = torch.nn.ModuleList(model) if isinstance(model, list | tuple) else model
    options = dict(watch_options)
    options.setdefault("group", place.data_group)
    if dist.is_initialized():
        options.setdefault("rank", dist.get_rank())
    return dx.watch(module, _torch_optimizer(optimizer), **options)
