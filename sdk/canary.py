"""Canary micro-batch and weight integrity: a fixed batch run forward on the same weights must
give bit-identical output, and weights must not change between optimizer steps.

Bounded by construction: at most `max_reruns` extra forwards per check, never a loop; the
model's train/eval mode is restored and no gradient is recorded. It never changes weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from denpex.sdk.checksums import byte_view, digest_buffers
from denpex.series.findings import Finding

MAX_RERUNS = 2


def _tensors(output: Any) -> list[Any]:
    """Every tensor in a model output (tensor, tuple/list, dict, or an object with a dict)."""
    if hasattr(output, "is_floating_point"):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in _tensors(v)]
    return []


def output_digest(output: Any) -> int:
    """XXH3-64 over the bytes of every tensor of an output (copied to the host if needed)."""
    from denpex.sdk.checksums import combine

    views = [byte_view(t.detach().cpu().contiguous()) for t in _tensors(output)]
    return combine(digest_buffers(views))


class CanaryRunner:
    """Runs the model on a fixed batch under no_grad and eval mode, restoring every module's
    mode afterwards; `before`/`after` let the caller pause its own forward hooks."""

    def __init__(self, model: Any, batch: Any) -> None:
        self.model = model
        self.batch = batch

    def __call__(self) -> int:
        import torch

        modules = list(self.model.modules())
        modes = [m.training for m in modules]
        try:
            self.model.eval()
            with torch.no_grad():
                batch = self.batch
                if isinstance(batch, dict):
                    out = self.model(**batch)
                elif isinstance(batch, (tuple, list)):
                    out = self.model(*batch)
                else:
                    out = self.model(batch)
            return output_digest(out)
        finally:
            for module, mode in zip(modules, modes, strict=True):
                module.training = mode


@dataclass
class CanaryCheck:
    """Reference (weights digest, output digest); a new one whenever the weights changed."""

    reference: tuple[int, int] | None = None
    max_reruns: int = MAX_RERUNS

    def check(self, step: int, weights: int, run: Callable[[], int]) -> Finding | None:
        """Run the canary; compare with the reference taken on the same weights. When the
        weights changed, the new reference is checked at once against a second run."""
        output = run()
        if self.reference is None or self.reference[0] != weights:
            self.reference = (weights, output)
            output = run()
        expected = self.reference[1]
        if output == expected:
            return None
        matching = sum(run() == expected for _ in range(self.max_reruns))
        kind = {self.max_reruns: "transient", 0: "persistent"}.get(matching, "intermittent")
        transient = kind == "transient"  # a one-off flip: look closer before draining
        return Finding(
            "train.sdc.canary_mismatch",
            captures={"step": str(step), "kind": kind, "reruns_matching": str(matching)},
            values={"reruns": self.max_reruns},
            severity="warning" if transient else "critical",
            action="run_diagnostics" if transient else "drain_node",
        )


@dataclass
class WeightIntegrity:
    """Weights change only in optimizer steps. The rule: the weights digest recorded by
    `record()` (taken in guard.step, right after an optimizer step) must still hold when the
    next optimizer step starts (`before_optimizer_step`), and at the next check if no optimizer
    step came in between. Any difference is a change made outside the optimizer."""

    recorded: tuple[int, int] | None = None  # (weights digest, optimizer steps at the time)
    armed: bool = False

    def record(self, digest: int, optimizer_steps: int) -> None:
        self.recorded = (digest, optimizer_steps)
        self.armed = True

    def verify(self, step: int, digest: int, optimizer_steps: int, where: str) -> Finding | None:
        """Compare with the record if no optimizer step ran since it; disarms after a look."""
        if not self.armed or self.recorded is None or self.recorded[1] != optimizer_steps:
            self.armed = False
            return None
        self.armed = False
        if digest == self.recorded[0]:
            return None
        return Finding(
            "train.sdc.weights_changed_outside_optimizer",
            captures={"step": str(step), "seen": where},
        )
