"""fp16 dynamic loss scaling over one training series: a scale that falls to its minimum, or
keeps halving for overflow after the scaler settled, is a collapse (train.grad_overflow).

Pure: callers pass (step, scale) in step order, with the number of skipped steps when the
log says it. The halvings of the first `scale_warmup_steps` steps are the scaler finding its
level (DeepSpeed and Megatron start at 2**16–2**32 and halve down), never a failure; a scale
that never was above the floor (a bf16 run printing `loss scale: 1.0`) never collapsed.
"""

from __future__ import annotations

import math
from collections import deque

from denpex.series.findings import Finding
from denpex.series.thresholds import LossScaleRules, default


class LossScaleTracker:
    """Counts overflow events (halvings of the scale, or skipped steps when they are known)
    after warm-up within a sliding window of `scale_window` steps; `scale_halvings` of them,
    or a scale that fell to `scale_floor`, is one collapse, reported again only after the
    scale grew."""

    def __init__(self, rules: LossScaleRules | None = None) -> None:
        self.rules = rules or default(LossScaleRules)
        self.events: deque[tuple[int, int]] = deque()  # (step, overflow steps)
        self.last: float | None = None
        self.highest = 0.0
        self.reported = False
        self.overflowed = False  # whether the last observation was an overflow (a skipped step)

    def observe(
        self, step: int, scale: float | None, *, skipped: int | None = None
    ) -> Finding | None:
        """`scale` None: the line said only how many steps were skipped; `skipped`: steps the
        scaler skipped since the previous observation, when known."""
        self.overflowed = False
        if scale is not None and (not math.isfinite(scale) or scale < 0):
            return None
        overflow = 0
        if scale is not None:
            previous, self.last = self.last, scale
            if previous is not None and scale < previous:
                overflow = max(1, round(math.log2(previous / scale))) if scale > 0 else 1
            elif previous is not None and scale > previous:
                self.reported = False  # the scale grew: a new collapse is a new report
        if skipped:
            overflow = max(overflow, int(skipped))
        self.overflowed = overflow > 0
        rules = self.rules
        if overflow and step > rules.scale_warmup_steps:
            self.events.append((step, overflow))
        while self.events and self.events[0][0] <= step - rules.scale_window:
            self.events.popleft()
        fell_to_floor = scale is not None and scale <= rules.scale_floor < self.highest
        if scale is not None:
            self.highest = max(self.highest, scale)
        halvings = sum(count for _, count in self.events)
        if self.reported or not (fell_to_floor or halvings >= max(1, rules.scale_halvings)):
            return None
        self.reported = True
        if fell_to_floor:
            what = f"loss scale fell to its minimum {scale:g}"
        elif scale is not None:
            what = f"loss scale fell to {scale:g}"
        else:
            what = "steps kept being skipped for fp16 overflow"
        return Finding(
            "train.grad_overflow.loss_scale_collapse",
            captures={
                "step": str(step),
                "scale": f"{scale:g}" if scale is not None else "",
                "halvings": str(halvings),
                "at_minimum": "true" if fell_to_floor else "false",
            },
            values={"what": what, "window": rules.scale_window},
        )
