"""Throughput over training series: a drop of one series against its own baseline (the whole
job, or one rank), and ranks slower than their peers (stragglers).

Pure: callers pass step times (or throughputs) in step order; no clocks, no I/O. The first
observations (compilation, warming caches) never set the baseline.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median

from denpex.series.findings import Finding, fmt
from denpex.series.thresholds import ThroughputRules, default

RECOVERY_FRACTION = 0.5  # a drop ends when the slowdown falls below half of the threshold's


class ThroughputDrop:
    """One series' cost per step (seconds per step, or 1 / throughput) against its baseline:
    the median of `throughput_baseline` observations after `throughput_warmup`. A drop is
    the median of the last `throughput_recent` observations at `throughput_drop_ratio` × the
    baseline or more; reported once until the series recovers.

    `subject` names the series in the summary ("the job", "rank 3"); `measure` is either
    "step_time" (values are seconds per step) or "throughput" (values are per second, in
    `unit`)."""

    def __init__(
        self,
        rules: ThroughputRules | None = None,
        *,
        subject: str = "the job",
        measure: str = "step_time",
        unit: str = "s",
    ) -> None:
        if measure not in ("step_time", "throughput"):
            raise ValueError(f"measure must be step_time or throughput, not {measure!r}")
        self.rules = rules or default(ThroughputRules)
        self.subject, self.measure, self.unit = subject, measure, unit
        self.seen = 0
        self._base_values: list[float] = []
        self.baseline: float | None = None  # in the caller's values
        self.recent: deque[float] = deque(maxlen=max(1, self.rules.throughput_recent))
        self.dropped = False

    def _cost(self, value: float) -> float:
        return value if self.measure == "step_time" else 1.0 / value

    def observe(self, step: int, value: float) -> Finding | None:
        if not math.isfinite(value) or value <= 0:
            return None
        self.seen += 1
        rules = self.rules
        if self.seen <= rules.throughput_warmup:
            return None
        if self.baseline is None:
            self._base_values.append(value)
            if len(self._base_values) >= max(1, rules.throughput_baseline):
                self.baseline = median(self._base_values)
            return None
        self.recent.append(value)
        if len(self.recent) < self.recent.maxlen:  # type: ignore[operator]
            return None
        now = median(self.recent)
        slowdown = self._cost(now) / self._cost(self.baseline)
        if self.dropped:
            recovered = 1 + (rules.throughput_drop_ratio - 1) * RECOVERY_FRACTION
            self.dropped = slowdown >= recovered
            return None
        if slowdown < rules.throughput_drop_ratio:
            return None
        self.dropped = True
        return self._finding(step, now, slowdown)

    def _finding(self, step: int, now: float, slowdown: float) -> Finding:
        assert self.baseline is not None
        return Finding(
            "train.straggler.throughput_drop",
            captures={
                "step": str(step),
                "baseline": fmt(self.baseline),
                "now": fmt(now),
                "slowdown": f"{slowdown:.2f}",
                "measure": self.measure,
            },
            values={
                "subject": self.subject,
                "what": "its step time" if self.measure == "step_time" else "its throughput",
                "unit": self.unit,
            },
        )


@dataclass(frozen=True, slots=True)
class Slower:
    """A member whose step time is at least `ratio` × the median of the others'."""

    member: int
    value: float
    peers_median: float


def slower_than_peers(values: Mapping[int, float], ratio: float, min_diff: float) -> list[Slower]:
    """Members (ranks) whose step time is ≥ `ratio` × the median of their peers' and at least
    `min_diff` above it: the peers, not the whole group, so that two members compare with
    each other."""
    timed = {k: v for k, v in values.items() if math.isfinite(v)}
    if len(timed) < 2:
        return []
    found = []
    for member, value in sorted(timed.items()):
        peers = median(v for k, v in timed.items() if k != member)
        if value >= ratio * peers and value - peers >= min_diff:
            found.append(Slower(member, value, peers))
    return found
