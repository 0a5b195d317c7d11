"""PyTorch Lightning integration: `Trainer(callbacks=[DenpexCallback()])` watches the
LightningModule for the whole fit, one Guard step per optimizer step.

It never changes the fit and never raises into it; it works with `lightning` (2.x) or the
older `pytorch_lightning` package, whichever is installed.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    except ImportError as exc:
        raise ImportError(
            "denpex.sdk.integrations.lightning needs PyTorch Lightning: pip install lightning"
        ) from exc

import denpex.sdk as dx


def _loss_of(outputs: Any) -> float | None:
    """The training loss from what `training_step` returned (a tensor or a dict with 'loss')."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if loss is None:
        return None
    try:
        return float(loss.detach()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None


class DenpexCallback(Callback):  # type: ignore[misc]
    """`dx.watch(pl_module, first optimizer, rank=global rank, **watch_options)` when training
    starts; `guard.step(loss=...)` after each batch that stepped the optimizer (so gradient
    accumulation counts optimizer steps, not batches); `guard.close()` at the end."""

    def __init__(self, **watch_options: Any) -> None:
        super().__init__()
        self.watch_options = watch_options
        self.guard: dx.Guard | None = None
        self._last_global_step = -1

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.guard is not None:
            return
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        options = dict(self.watch_options)
        options.setdefault("rank", getattr(trainer, "global_rank", None))
        self.guard = dx.watch(pl_module, optimizers[0] if optimizers else None, **options)
        self._last_global_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.guard is None or trainer.global_step == self._last_global_step:
            return  # no optimizer step in this batch (gradient accumulation)
        self._last_global_step = trainer.global_step
        self.guard.step(loss=_loss_of(outputs))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self.guard is not None:
            self.guard.close()
            self.guard = None
