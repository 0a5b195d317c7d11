"""Small torch modules the SDK tests train (import after skipping when torch is absent)."""

from __future__ import annotations

import torch


class Poison(torch.nn.Module):
    """Turns its input non-finite while `on`: an activation going NaN inside the model."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x):
        return x * float("nan") if self.on else x
