"""Per-layer health of a training step: weight and gradient norms, the update/weight ratio,
and the first module with a non-finite output (the series rules on the loss itself, spikes,
NaN and loss-scale collapse, live in denpex.series, shared with the log scanner).

Forward hooks only record a lazy per-module sum (no host sync, no copy); gradient norms are
taken where the gradients exist (before the optimizer step, or as backward writes them), so
a `zero_grad()` before `guard.step()` cannot zero them. Nothing here emits: it returns findings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from denpex.series.findings import Finding

__all__ = ["Finding", "ForwardRecorder", "LayerNorms", "nonfinite_activation"]


def nonfinite_activation(step: int, module: str) -> Finding:
    return Finding("train.nan_loss.first_module", captures={"step": str(step), "module": module})


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


def _plain(norm: Any) -> Any:
    """A norm as a plain tensor: the norm of a sharded DTensor is a partial value, summed
    across its shards by full_tensor() (a collective every rank enters at the same step)."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class LayerNorms:
    """Weight L2, grad L2 and update/weight ratio per module, computed with batched
    (`_foreach`) kernels and one host read; no Python loop per parameter on the result.

    Gradient norms come from where the gradients exist: `capture_grads()` (the optimizer's
    pre-step hook, on sampled steps) or, without an optimizer, per-parameter hooks armed for
    the backward of a sampled step (`arm_backward`). Only when neither ran (the optimizer
    step was skipped) are the gradients read as they are at `measure()`."""

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
        self._captured: dict[int, Any] | None = None  # parameter index -> lazy grad norm
        self._grad_hooks: list[Any] = []

    # -- gradient norms, taken while the gradients exist -----------------------------------
    def capture_grads(self) -> None:
        """Norms of the gradients as they are now, as lazy tensors (no host read)."""
        import torch

        with torch.no_grad():
            with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
            grads = [self.params[i].grad for i in with_grad]
            norms = torch._foreach_norm(grads) if grads else []
        self._captured = dict(zip(with_grad, norms, strict=True))

    def arm_backward(self, armed: bool) -> None:
        """While armed, each parameter's gradient norm is taken as backward accumulates it
        (the last backward of a step wins, as with gradient accumulation)."""
        if armed and not self._grad_hooks:
            self._captured = {}
            self._grad_hooks = [
                p.register_post_accumulate_grad_hook(self._grad_hook(i))
                for i, p in enumerate(self.params)
                if p.requires_grad
            ]
        elif not armed and self._grad_hooks:
            for handle in self._grad_hooks:
                handle.remove()
            self._grad_hooks = []

    def _grad_hook(self, index: int) -> Any:
        import torch

        def hook(param: Any) -> None:
            if param.grad is not None and self._captured is not None:
                self._captured[index] = torch.linalg.vector_norm(param.grad.detach())

        return hook

    def _grad_norms(self) -> Any:
        """Per-parameter gradient norms on CPU: the captured ones, else the gradients now."""
        import torch

        captured, self._captured = self._captured, None
        if not captured:
            captured = {}
            with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
            if with_grad:
                norms = torch._foreach_norm([self.params[i].grad for i in with_grad])
                captured = dict(zip(with_grad, norms, strict=True))
        grad = torch.zeros(len(self.params))
        if captured:
            index = list(captured)
            values = [_plain(v) for v in captured.values()]
            device = values[0].device
            grad[index] = torch.stack([v.to(device) for v in values]).float().cpu()
        return grad

    def _norms(self, tensors: list[Any]) -> Any:
        import torch

        if not tensors:
            return torch.zeros(0)
        norms = [_plain(n) for n in torch._foreach_norm(tensors)]
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
            grad = self._grad_norms()
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
