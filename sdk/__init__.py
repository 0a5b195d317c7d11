"""Layer 4, the training SDK (`import denpex.sdk as dx`): per-layer health, checksums,
replica agreement, canaries, progress, checkpoint integrity, inside the training process.

It never raises into the training loop and never blocks it; torch and the framework
integrations are imported lazily, so importing denpex.sdk costs nothing without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from denpex.sdk.watch import Guard, Monitor, watch

if TYPE_CHECKING:  # resolved lazily below, so a missing module never breaks the import
    from denpex.sdk.checkpoint import (
        CheckpointCorrupt,
        load,
        protect_torch_checkpoints,
        save,
        unprotect_torch_checkpoints,
    )
    from denpex.sdk.transport import default_emit as emit

__all__ = [
    "CheckpointCorrupt",
    "Guard",
    "Monitor",
    "emit",
    "jax",
    "load",
    "protect_torch_checkpoints",
    "save",
    "unprotect_torch_checkpoints",
    "watch",
]

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "save": ("denpex.sdk.checkpoint", "save"),
    "load": ("denpex.sdk.checkpoint", "load"),
    "protect_torch_checkpoints": ("denpex.sdk.checkpoint", "protect_torch_checkpoints"),
    "unprotect_torch_checkpoints": ("denpex.sdk.checkpoint", "unprotect_torch_checkpoints"),
    "CheckpointCorrupt": ("denpex.sdk.checkpoint", "CheckpointCorrupt"),
    "emit": ("denpex.sdk.transport", "default_emit"),
    "jax": ("denpex.sdk.integrations.jax", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'denpex.sdk' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AttributeError(
            f"denpex.sdk.{name} is unavailable: importing {module_name} failed ({exc})"
        ) from exc
    return module if attribute is None else getattr(module, attribute)
