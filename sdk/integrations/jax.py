"""JAX integration, `dx.jax.watch_step(train_step)`: times each step, checks the loss is finite,
checksums the parameter pytree (replicas on every device must agree) and feeds the progress
monitor (hangs, stragglers).

It never changes what the step returns and never raises into the loop; it blocks on device
results only on sampled steps (`every`, `checksum_every`), as a `float(loss)` would.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

try:
    import jax
except ImportError as exc:  # pragma: no cover - exercised only without jax
    raise ImportError('dx.jax needs JAX: pip install "jax[cpu]" (or jax[cuda12])') from exc
import numpy as np

from denpex._native import load
from denpex.core.events import Event, Evidence
from denpex.sdk.progress import ProgressMonitor
from denpex.sdk.step_findings import StepFindings
from denpex.series.findings import Finding

log = logging.getLogger("denpex.sdk.jax")
_checksum = load("checksum")
Emit = Callable[[Evidence | Event], None]


def default_loss_of(out: Any) -> Any:
    """The loss in what a step returned: the last element of a tuple, or the value itself."""
    return out[-1] if isinstance(out, tuple | list) else out


def default_params_of(out: Any) -> Any:
    """The parameters in what a step returned: the first element of a tuple."""
    return out[0] if isinstance(out, tuple | list) else None


def byte_views(array: Any) -> list[Any]:
    """Zero-copy (on CPU) uint8 views of each addressable copy of a JAX array, by device."""
    views = []
    for shard in getattr(array, "addressable_shards", ()):
        host = np.ascontiguousarray(np.asarray(shard.data)).reshape(-1)
        views.append(host.view(np.uint8))
    return views


def minority(digests: Sequence[int]) -> list[int]:
    """Indexes of the copies that differ from the most common digest (none if all agree;
    with no majority, every copy that is not the first one's digest)."""
    common, _ = Counter(digests).most_common(1)[0]
    return [i for i, d in enumerate(digests) if d != common]


class StepWatch:
    """A wrapped step function: call it as you would the step; `close()` at the end."""

    def __init__(
        self,
        step_fn: Callable[..., Any],
        *,
        every: int = 50,
        checksum_every: int | None = None,
        loss_of: Callable[[Any], Any] = default_loss_of,
        params_of: Callable[[Any], Any] = default_params_of,
        rank: int | None = None,
        emit: Emit | None = None,
        **options: Any,
    ) -> None:
        if every < 1:
            raise ValueError(f"watch_step(every={every}): the interval must be >= 1 step")
        self.step_fn, self.every, self.checksum_every = step_fn, every, checksum_every
        self.loss_of, self.params_of = loss_of, params_of
        self.rank = jax.process_index() if rank is None else int(rank)
        self.step = 0
        self.last_digest: int | None = None
        self.findings = StepFindings(rank=self.rank, source="jax", emit=emit, options=options)
        self.host = self.findings.host
        self.monitor = ProgressMonitor(
            rank=self.rank,
            world_size=jax.process_count(),
            emit=emit,
            host=self.host,
            options=options,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.step_fn(*args, **kwargs)
        self.step += 1
        loss = None
        try:
            if self.step % self.every == 0:
                loss = self._check_loss(out)
            if self.checksum_every and self.step % self.checksum_every == 0:
                self._check_params(out)
            self.monitor.on_step(self.step, loss, None)
        except Exception as exc:  # the loop never sees a denpex failure
            log.debug("dx.jax: step %d check failed: %s", self.step, exc)
        return out

    def close(self) -> None:
        self.monitor.close()

    def __enter__(self) -> StepWatch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- checks -----------------------------------------------------------------------------

    def _check_loss(self, out: Any) -> float | None:
        value = self.loss_of(out)
        if value is None:
            return None
        loss = float(np.asarray(value))  # waits for the step, like any float(loss)
        self.findings.loss(self.step, loss)
        return loss

    def _check_params(self, out: Any) -> None:
        params = self.params_of(out)
        if params is None:
            return
        leaves = jax.tree_util.tree_leaves(params)
        per_leaf = [byte_views(leaf) for leaf in leaves]
        flat = [view for views in per_leaf for view in views]
        digests = list(_checksum.xxh3_64_many(flat)) if flat else []
        at = 0
        firsts = []
        for index, (leaf, views) in enumerate(zip(leaves, per_leaf, strict=True)):
            mine = digests[at : at + len(views)]
            at += len(views)
            if not mine:
                continue
            firsts.append(mine[0])
            sharding = getattr(leaf, "sharding", None)
            if len(mine) > 1 and getattr(sharding, "is_fully_replicated", False):
                self._compare_replicas(index, leaf, mine)
        self.last_digest = int(_checksum.xxh3_64(np.array(firsts, dtype=np.uint64).tobytes()))

    def _compare_replicas(self, index: int, leaf: Any, digests: list[int]) -> None:
        bad = minority(digests)
        if not bad:
            return
        devices = [str(shard.device) for shard in leaf.addressable_shards]
        named = ",".join(devices[i] for i in bad)
        captures = {
            "rank": str(self.rank),
            "step": str(self.step),
            "param": f"leaf{index}",
            "devices": named,
            "replicas": str(len(digests)),
        }
        self.findings.send_once(
            f"sdc:{index}:{named}", Finding("train.sdc.replica_mismatch", captures)
        )


def watch_step(step_fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Wrap a (jitted) training step: `step = dx.jax.watch_step(train_step, every=50,
    checksum_every=200)`, then `params, opt_state, loss = step(params, opt_state, batch)`.
    Without `step_fn` it is a decorator: `@dx.jax.watch_step(every=10)`. Options: those of
    `StepWatch` and the progress thresholds (`hang_floor_s`, ...)."""
    if step_fn is None:
        return lambda fn: StepWatch(fn, **options)
    return StepWatch(step_fn, **options)
