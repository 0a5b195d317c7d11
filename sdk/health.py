"""Per-layer health of a training step: norms, the first module with a non-finite output, loss
spikes (median/MAD) and fp16 loss-scale collapse.

Forward hooks only record a lazy per-module sum (no host sync, no copy); everything is read on
sampled steps or when the loss is non-finite. Nothing here emits: it returns findings.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from denpex.core.detectors import detector


@dataclass(frozen=True, slots=True)
class Finding:
    """What a detector saw, before it becomes Evidence (watch.py adds host, rank, ids):
    the detector's id in denpex/core/detectors.yaml (category, severity, action and the
    summary template come from there), the captures, and `values` only for the summary."""

    signature: str
    captures: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    severity: str | None = None  # only for a detector whose catalog entry `varies`
    action: str | None = None

    @property
    def category(self) -> str:
        return detector(self.signature).category


# --- loss spikes -------------------------------------------------------------------------

MAD_TO_SIGMA = 1.4826  # MAD × this estimates the standard deviation of a normal sample


def robust_center_scale(history: Sequence[float]) -> tuple[float, float]:
    """(median, robust standard deviation = 1.4826 × MAD) of `history`."""
    center = median(history)
    mad = median(abs(x - center) for x in history)
    # a perfectly flat history has MAD 0: fall back to a small fraction of the level so a
    # constant loss does not turn every tiny wiggle into an infinite z-score
    return center, MAD_TO_SIGMA * mad or max(abs(center) * 1e-3, 1e-12)


def robust_z(history: Sequence[float], value: float) -> float:
    """How many robust standard deviations (median/MAD) `value` lies above `history`."""
    center, scale = robust_center_scale(history)
    return (value - center) / scale


class LossSpikeDetector:
    """Flags a finite loss whose robust z-score over the last `window` losses exceeds
    `threshold`; needs `min_history` losses first; a spike is not added to the history.
    The median and MAD are recomputed every `refresh` losses, not on every step."""

    def __init__(
        self,
        window: int = 200,
        min_history: int = 20,
        threshold: float = 10.0,
        refresh: int = 16,
    ) -> None:
        self.history: deque[float] = deque(maxlen=window)
        self.min_history = min_history
        self.threshold = threshold
        self.refresh = refresh
        self._stats: tuple[float, float] | None = None
        self._age = 0

    def observe(self, step: int, loss: float) -> Finding | None:
        if not math.isfinite(loss):
            return None
        if len(self.history) >= self.min_history:
            if self._stats is None or self._age >= self.refresh:
                self._stats, self._age = robust_center_scale(self.history), 0
            center, scale = self._stats
            z = (loss - center) / scale
            if z > self.threshold:
                return Finding(
                    "train.loss_spike.robust_z",
                    captures={"step": str(step), "loss": f"{loss:.6g}", "z": f"{z:.1f}"},
                    values={"median": f"{center:.6g}", "window": len(self.history)},
                )
        self.history.append(loss)
        self._age += 1
        return None


def nonfinite_loss(step: int, loss: float, module: str | None) -> Finding:
    captures = {"step": str(step), "loss": str(loss)}
    if not module:
        return Finding("train.nan_loss.value", captures=captures)
    return Finding("train.nan_loss.first_module", captures={**captures, "module": module})


def nonfinite_activation(step: int, module: str) -> Finding:
    return Finding("train.nan_loss.first_module", captures={"step": str(step), "module": module})


# --- loss-scale collapse -----------------------------------------------------------------


class LossScaleTracker:
    """fp16 dynamic loss scaling halves the scale on every overflow; `halvings` halvings
    within `window` steps, or a scale below `floor`, is a collapse (reported once until the
    scale grows again)."""

    def __init__(self, halvings: int = 6, window: int = 200, floor: float = 1.0) -> None:
        self.halvings = halvings
        self.window = window
        self.floor = floor
        self.drops: deque[int] = deque()
        self.last: float | None = None
        self.reported = False

    def observe(self, step: int, scale: float) -> Finding | None:
        previous, self.last = self.last, scale
        if previous is None or not math.isfinite(scale):
            return None
        if scale > previous:
            self.reported = False
        elif scale < previous:
            self.drops.append(step)
        while self.drops and self.drops[0] <= step - self.window:
            self.drops.popleft()
        collapsed = len(self.drops) >= self.halvings or scale < self.floor
        if not collapsed or self.reported:
            return None
        self.reported = True
        return Finding(
            "train.grad_overflow.loss_scale_collapse",
            captures={"step": str(step), "scale": f"{scale:g}", "halvings": str(len(self.drops))},
            values={"window": self.window},
        )


# --- the first module with a non-finite output -------------------------------------------


def _first_tensor(output: Any) -> Any:
    if hasattr(output, "is_floating_point"):
        return output
    if isinstance(output, (tuple, list)) and output:
        return _first_tensor(output[0])
    return None


class ForwardRecorder:
    """While `armed`, a forward hook on every module records (module index, lazy sum of its
    output). A sum is non-finite exactly when the output holds a NaN or an Inf (short of an
    fp32 overflow of finite values), and computing it never waits for the device.

    Disarming removes the hooks rather than muting them: a module with any forward hook leaves
    PyTorch's fast call path, which alone costs about 1 % of a small model's CPU step."""

    def __init__(
        self, model: Any, max_records_per_step: int | None = None, *, armed: bool = True
    ) -> None:
        import torch

        self._float32 = torch.float32
        self._modules = [module for _, module in model.named_modules()]
        self.names = [name or "<model>" for name, _ in model.named_modules()]
        self.records: list[tuple[int, Any]] = []
        self._handles: list[Any] = []
        # room for a few forwards per step (gradient accumulation); later ones are not kept
        self.cap = max_records_per_step or 4 * len(self.names)
        self.armed = armed

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    @armed.setter
    def armed(self, value: bool) -> None:
        if value and not self._handles:
            self._handles = [
                module.register_forward_hook(self._hook_for(index))
                for index, module in enumerate(self._modules)
            ]
        elif not value:
            self.remove()

    def _hook_for(self, index: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if len(self.records) >= self.cap:
                return
            tensor = _first_tensor(output)
            if tensor is not None and tensor.is_floating_point():
                self.records.append((index, tensor.detach().sum(dtype=self._float32)))

        return hook

    def take(self) -> list[tuple[int, Any]]:
        records, self.records = self.records, []
        return records

    def first_nonfinite(self, records: list[tuple[int, Any]]) -> str | None:
        """Name of the first module (in call order) whose output was non-finite; one sync."""
        if not records:
            return None
        import torch

        sums = torch.stack([value.to(records[0][1].device) for _, value in records])
        bad = (~torch.isfinite(sums)).nonzero()
        if bad.numel() == 0:
            return None
        return self.names[records[int(bad[0, 0])][0]]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# --- norms -------------------------------------------------------------------------------


class LayerNorms:
    """Weight L2, grad L2 and update/weight ratio per module, computed with batched
    (`_foreach`) kernels and one host read; no Python loop per parameter on the result."""

    def __init__(self, named_params: Iterable[tuple[str, Any]]) -> None:
        import torch

        self.params: list[Any] = []
        layers: dict[str, int] = {}
        owner: list[int] = []
        for name, param in named_params:
            layer = name.rsplit(".", 1)[0] if "." in name else "<model>"
            owner.append(layers.setdefault(layer, len(layers)))
            self.params.append(param)
        self.layers = list(layers)
        self.owner = torch.tensor(owner, dtype=torch.long)
        self._snapshot: list[Any] | None = None
        self._base: Any = None  # per-layer weight norms when the snapshot was taken
        self._kept: list[Any] | None = None

    def _norms(self, tensors: list[Any]) -> Any:
        import torch

        if not tensors:
            return torch.zeros(0)
        norms = torch._foreach_norm(tensors)
        device = norms[0].device
        return torch.stack([n.to(device) for n in norms]).float().cpu()

    def _per_layer(self, norms: Any) -> Any:
        import torch

        sq = torch.zeros(len(self.layers), dtype=torch.float64)
        sq.index_add_(0, self.owner, norms.double() ** 2)
        return sq.sqrt()

    def measure(self, *, keep_snapshot: bool) -> dict[str, Any]:
        """{"weight": per-layer tensor, "grad": per-layer tensor, "total_weight", "total_grad"}."""
        import torch

        with torch.no_grad():
            weight = self._norms(self.params)
            with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
            grad = torch.zeros(len(self.params))
            if with_grad:
                grad[with_grad] = self._norms([self.params[i].grad for i in with_grad])
            if keep_snapshot:
                self._snapshot = self._copy_of_weights()
        per_layer_weight = self._per_layer(weight)
        self._base = per_layer_weight
        return {
            "weight": per_layer_weight,
            "grad": self._per_layer(grad),
            "total_weight": float(weight.double().norm()),
            "total_grad": float(grad.double().norm()),
        }

    def _copy_of_weights(self) -> list[Any]:
        """The weights now, copied into buffers kept between samples on CPU: allocating and
        freeing a model-sized copy each time makes glibc move the training step's own
        temporaries between mmap and the heap, which costs more than the copy itself."""
        import torch

        weights = [p.detach() for p in self.params]
        if any(w.is_cuda for w in weights):
            return list(torch._foreach_mul(weights, 1.0))  # the caching allocator reuses it
        if self._kept is None:
            self._kept = [torch.empty_like(w) for w in weights]
        torch._foreach_copy_(self._kept, weights)
        return self._kept

    def update_ratio(self) -> tuple[Any, float] | None:
        """(per-layer ‖Δw‖/‖w_before‖, total ratio) since the snapshot; drops the snapshot."""
        import torch

        if self._snapshot is None or self._base is None:
            return None
        delta, self._snapshot = self._snapshot, None
        with torch.no_grad():
            torch._foreach_sub_(delta, [p.detach() for p in self.params])  # in place: no copy
            update = self._per_layer(self._norms(delta))
        base = self._base
        ratio = update / base.clamp_min(1e-30)
        total = float(update.norm() / base.norm().clamp_min(1e-30))
        return ratio, total
