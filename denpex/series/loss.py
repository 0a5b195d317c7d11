"""Loss detectors over one training series: spikes and divergence (median/MAD robust z-score)
and non-finite (NaN/Inf) losses, the same rules for the SDK and for losses read from a log.

Pure: callers pass (step, value) in step order; nothing here reads a clock or emits. A spike
is a warning, a loss that stays spiky is a divergence (a failure); early in training a spike
that recovers, or a NaN on a step the fp16 loss scaler skipped, is not reported at all.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from denpex.series.findings import Finding, fmt
from denpex.series.thresholds import LossRules, default

MAD_TO_SIGMA = 1.4826  # MAD × this estimates the standard deviation of a normal sample
# a spike must also rise this far above the median, relative to it: on a flat or coarsely
# printed loss (MAD near 0) a wiggle in the last digit is not a spike
MIN_RELATIVE_RISE = 0.25


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
    """Judges each finite loss against the median/MAD of the last `spike_window` losses (a
    spike is not added to them). Past `loss_warmup_steps` the first spike of a run is a
    warning at once; `divergence_patience` spikes in a row are a divergence (an error), once
    per run of spikes. Before that step a spike is held back: a recovery drops it."""

    def __init__(self, rules: LossRules | None = None) -> None:
        self.rules = rules or default(LossRules)
        self.history: deque[float] = deque(maxlen=max(1, self.rules.spike_window))
        self._stats: tuple[float, float] | None = None
        self._age = 0
        self._run: list[tuple[int, float, float]] = []  # the current run of spikes
        self._diverged = False

    def observe(self, step: int, loss: float) -> Finding | None:
        if not math.isfinite(loss):
            return None
        rules = self.rules
        if len(self.history) < max(1, rules.spike_min_history):
            self._keep(loss)
            return None
        if self._stats is None or self._age >= rules.spike_refresh:
            self._stats, self._age = robust_center_scale(self.history), 0
        center, scale = self._stats
        z = (loss - center) / scale
        rise = loss - center
        if z <= rules.spike_threshold or rise < MIN_RELATIVE_RISE * abs(center):
            self._run.clear()
            self._diverged = False
            self._keep(loss)
            return None
        self._run.append((step, loss, z))
        if self._diverged:
            self._keep(loss)  # reported: let the new level become the baseline
            return None
        if len(self._run) >= max(1, rules.divergence_patience):
            self._diverged = True
            return self._divergence(center)
        if len(self._run) == 1 and step > rules.loss_warmup_steps:
            return self._spike(step, loss, z, center)
        return None

    def _keep(self, loss: float) -> None:
        self.history.append(loss)
        self._age += 1

    def _spike(self, step: int, loss: float, z: float, center: float) -> Finding:
        return Finding(
            "train.loss_spike.robust_z",
            captures={"step": str(step), "loss": fmt(loss), "z": f"{z:.1f}"},
            values={"median": fmt(center), "window": len(self.history)},
        )

    def _divergence(self, center: float) -> Finding:
        first_step, first_loss, _ = self._run[0]
        last_step, last_loss, last_z = self._run[-1]
        return Finding(
            "train.loss_spike.divergence",
            captures={
                "step": str(first_step),
                "loss": fmt(first_loss),
                "last_step": str(last_step),
                "last_loss": fmt(last_loss),
                "z": f"{last_z:.1f}",
                "median": fmt(center),
            },
            values={"count": len(self._run), "threshold": self.rules.spike_threshold},
        )


@dataclass(slots=True)
class NanEpisode:
    """Consecutive non-finite losses: where it started, how long, how many were skipped
    steps of the loss scaler."""

    first_step: int
    first_value: float
    count: int = 0
    skipped: int = 0
    last_step: int = 0


class NonFiniteLoss:
    """NaN/Inf losses, one report per episode (a run of non-finite losses). Reported on the
    first one, except early in training (step ≤ `loss_warmup_steps`) on a step the loss scaler
    skipped for overflow: up to `nan_overflow_tolerance` of those are held back, and dropped
    when the loss comes back finite (the scaler calibrating, not a failure)."""

    def __init__(self, rules: LossRules | None = None) -> None:
        self.rules = rules or default(LossRules)
        self.episode: NanEpisode | None = None
        self.reported = False

    @property
    def started(self) -> bool:
        """Whether the last observation began an episode (the caller may look for its cause)."""
        return self.episode is not None and self.episode.count == 1

    def observe(self, step: int, value: float, *, skipped: bool = False) -> NanEpisode | None:
        """The episode to report now, if any."""
        if math.isfinite(value):
            self.episode, self.reported = None, False  # an unreported episode is forgiven
            return None
        if self.episode is None:
            self.episode = NanEpisode(step, value)
        episode = self.episode
        episode.count += 1
        episode.skipped += bool(skipped)
        episode.last_step = step
        if self.reported:
            return None
        rules = self.rules
        held = skipped and step <= rules.loss_warmup_steps
        if held and episode.count <= rules.nan_overflow_tolerance:
            return None
        self.reported = True
        return episode

    def finish(self) -> NanEpisode | None:
        """At the end of the series: an episode still held back is reported (it never
        recovered)."""
        if self.episode is None or self.reported:
            return None
        self.reported = True
        return self.episode


def nan_finding(episode: NanEpisode, module: str | None = None) -> Finding:
    """The Finding for a non-finite loss episode (`module`: the first module whose output was
    non-finite, when the SDK could tell)."""
    captures = {"step": str(episode.first_step), "loss": str(episode.first_value)}
    if episode.count > 1:
        captures["steps"] = str(episode.count)
    if not module:
        return Finding("train.nan_loss.value", captures=captures)
    return Finding("train.nan_loss.first_module", captures={**captures, "module": module})
