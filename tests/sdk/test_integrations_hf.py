"""The Hugging Face Trainer callback on a tiny torch model (CPU): the Guard watches the
model and the unwrapped optimizer, steps once per optimizer step, sees a NaN loss, closes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the HF callback needs: pip install transformers")
pytest.importorskip("accelerate", reason="transformers' Trainer needs: pip install accelerate")
import torch
from transformers import Trainer, TrainingArguments

import denpex.sdk.integrations.hf as integration
from denpex.core.events import Evidence


class TinyRegressor(torch.nn.Module):
    def __init__(self, poison_from: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.poison_from = poison_from
        self.calls = 0

    def forward(self, x, labels):
        self.calls += 1
        out = self.layer(x)
        if self.poison_from is not None and self.calls >= self.poison_from:
            out = out * math.nan
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 4)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}


class Probe(integration.DenpexCallback):
    def on_train_end(self, args, state, control, **kwargs) -> None:
        if self.guard is not None:
            self.seen = (self.guard.step_index, self.guard.model, self.guard.optimizer)
        super().on_train_end(args, state, control, **kwargs)


def train(tmp_path: Path, model: torch.nn.Module, callback, steps: int) -> None:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_nan_inf_filter=False,
        dataloader_num_workers=0,
    )
    Trainer(model=model, args=args, train_dataset=Rows(64), callbacks=[callback]).train()


def test_guard_follows_the_trainer(tmp_path: Path) -> None:
    got: list = []
    probe = Probe(every=1, emit=got.append, hang_floor_s=60)
    model = TinyRegressor()
    train(tmp_path, model, probe, steps=6)
    steps, watched, optimizer = probe.seen
    assert steps == 6 and watched is model
    assert type(optimizer).__module__.startswith("torch.optim")  # accelerate's wrapper removed
    assert probe.guard is None
    assert [e for e in got if isinstance(e, Evidence)] == []


def test_nan_loss_is_reported(tmp_path: Path) -> None:
    got: list = []
    probe = Probe(every=1, emit=got.append, hang_floor_s=60)
    train(tmp_path, TinyRegressor(poison_from=3), probe, steps=5)
    nan = [e for e in got if isinstance(e, Evidence) and e.category == "train.nan_loss"]
    assert nan, got
    assert nan[0].event.source == "sdk" and int(nan[0].captures["step"]) <= 4
