"""Hugging Face Trainer integration: `Trainer(..., callbacks=[DenpexCallback()])` watches the
model from the first to the last training step.

It never changes what the Trainer does (it returns no control changes) and never raises into
it: every call goes through the Guard, which swallows its own failures.
"""

from __future__ import annotations

import math
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised only without transformers
    raise ImportError(
        "denpex.sdk.integrations.hf needs Hugging Face transformers: pip install transformers"
    ) from exc

import denpex.sdk as dx


class DenpexCallback(TrainerCallback):  # type: ignore[misc]
    """Calls `dx.watch(model, optimizer, **watch_options)` when training begins, `guard.step()`
    after every optimizer step and `guard.close()` when training ends.

    The Trainer shows callbacks only the loss it logs (the mean over `logging_steps`, with
    NaN/Inf filtered out unless `logging_nan_inf_filter=False`); that loss reaches the Guard
    on the step after it is logged. Per-layer NaN hooks see every step regardless.
    """

    def __init__(self, **watch_options: Any) -> None:
        self.watch_options = watch_options
        self.guard: dx.Guard | None = None
        self._logged_loss: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if self.guard is not None or model is None:
            return
        optimizer = kwargs.get("optimizer")
        optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
        options = dict(self.watch_options)
        options.setdefault("rank", getattr(args, "process_index", None))
        self.guard = dx.watch(model, optimizer, **options)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float) and not isinstance(loss, bool):
            self._logged_loss = float(loss)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is None:
            return
        loss, self._logged_loss = self._logged_loss, None
        self.guard.step(loss=loss)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            loss, self._logged_loss = self._logged_loss, None
            if loss is not None and not math.isfinite(loss):
                self.guard.step(loss=loss)  # a last non-finite loss must not go unreported
            self.guard.close()
            self.guard = None
