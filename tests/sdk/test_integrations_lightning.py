"""The Lightning callback on a tiny LightningModule (CPU, one device): one Guard step per
optimizer step (gradient accumulation included), a NaN loss reported, the Guard closed."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("lightning", reason="the Lightning callback needs: pip install lightning")
import lightning.pytorch as pl
import torch

import denpex.sdk.integrations.lightning as integration
from denpex.core.events import Evidence


class TinyModule(pl.LightningModule):
    def __init__(self, poison_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.poison_at = poison_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.poison_at is not None and self.global_step + 1 >= self.poison_at:
            loss = loss * math.nan
        return {"loss": loss}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Probe(integration.DenpexCallback):
    """Remembers what the Guard saw before the callback closes it."""

    def _close(self) -> None:
        if self.guard is not None:
            self.seen = (self.guard.step_index, self.guard.model, self.guard.optimizer)
        super()._close()


def fit(callback, module: TinyModule, batches: int, accumulate: int = 1) -> None:
    x = torch.randn(batches * 4, 4)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4
    )
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        accumulate_grad_batches=accumulate,
    )
    trainer.fit(module, loader)


def test_guard_steps_once_per_optimizer_step_and_closes() -> None:
    got: list = []
    probe = Probe(every=1, emit=got.append, hang_floor_s=60)
    module = TinyModule()
    fit(probe, module, batches=8, accumulate=2)
    steps, model, optimizer = probe.seen
    assert steps == 4 and model is module and isinstance(optimizer, torch.optim.SGD)
    assert probe.guard is None
    assert [e for e in got if isinstance(e, Evidence)] == []


def test_nan_loss_in_training_step_is_reported() -> None:
    got: list = []
    probe = Probe(every=1, emit=got.append, hang_floor_s=60)
    fit(probe, TinyModule(poison_at=3), batches=5)
    nan = [e for e in got if isinstance(e, Evidence) and e.category == "train.nan_loss"]
    assert nan, got
    assert nan[0].event.source == "sdk" and nan[0].captures["step"] == "3"
