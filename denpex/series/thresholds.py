"""The thresholds of the training-series detectors, read from thresholds.yaml (package data):
one frozen dataclass per section, whose field names are also `dx.watch()` option names.

It never invents a default in code: a key missing from the file, or one the file has and no
dataclass knows, is an error at load time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from statistics import median
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ThresholdsError(ValueError):
    """thresholds.yaml (or an option overriding it) does not fit its dataclass."""


@dataclass(frozen=True, slots=True)
class LossRules:
    spike_threshold: float
    spike_window: int
    spike_min_history: int
    spike_refresh: int
    divergence_patience: int
    loss_warmup_steps: int
    nan_overflow_tolerance: int


@dataclass(frozen=True, slots=True)
class LossScaleRules:
    scale_halvings: int
    scale_window: int
    scale_floor: float
    scale_warmup_steps: int


@dataclass(frozen=True, slots=True)
class ThroughputRules:
    throughput_drop_ratio: float
    throughput_warmup: int
    throughput_baseline: int
    throughput_recent: int


@dataclass(frozen=True, slots=True)
class ProgressRules:
    """Hang and straggler thresholds (see progress.py for how each is used)."""

    hang_floor_s: float
    hang_ratio: float
    hang_startup_s: float
    straggler_ratio: float
    straggler_window: int
    straggler_min_s: float
    watchdog_interval_s: float
    unresponsive_s: float
    store_timeout_s: float
    store_failures_lost: int
    metric_every_s: float
    readers: int
    log_hang_floor_s: float

    @property
    def unresponsive_limit(self) -> float:
        return max(self.unresponsive_s, 3 * self.watchdog_interval_s)

    def deadline(self, intervals: list[float]) -> float:
        """max(hang_ratio × the median step time, floor); the start-up deadline while no step
        time is known yet."""
        if not intervals:
            return max(self.hang_floor_s, self.hang_startup_s)
        return max(self.hang_ratio * median(intervals), self.hang_floor_s)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ProgressRules:
        return with_options(cls, options)


SECTIONS: dict[str, type] = {
    "loss": LossRules,
    "loss_scale": LossScaleRules,
    "throughput": ThroughputRules,
    "progress": ProgressRules,
}


def _coerce(cls: type, name: str, kind: Any, value: Any) -> Any:
    kind = {"int": int, "float": float}.get(kind, kind)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ThresholdsError(f"{cls.__name__}.{name}: {value!r} is not a number")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise ThresholdsError(f"{cls.__name__}.{name}: {value!r} is not a number") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ThresholdsError(f"{cls.__name__}.{name}: {value!r} is not finite")
    if number < 0:
        raise ThresholdsError(f"{cls.__name__}.{name}: {value!r} is negative")
    return number


def build(cls: type[T], values: Mapping[str, Any]) -> T:
    """An instance of a section's dataclass from exactly its keys."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown, missing = set(values) - names, names - set(values)
    if unknown or missing:
        raise ThresholdsError(
            f"{cls.__name__}: unknown {sorted(unknown)}, missing {sorted(missing)}"
        )
    kinds = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: _coerce(cls, k, kinds[k], v) for k, v in values.items()})


def parse(text: str) -> dict[str, Any]:
    """Every section of a thresholds file, as its dataclass."""
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict) or set(raw) != set(SECTIONS):
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise ThresholdsError(f"sections must be {sorted(SECTIONS)}, not {got}")
    return {name: build(cls, raw[name] or {}) for name, cls in SECTIONS.items()}


@cache
def defaults() -> dict[str, Any]:
    text = resources.files("denpex.series").joinpath("thresholds.yaml").read_text("utf-8")
    return parse(text)


def default(cls: type[T]) -> T:
    """The shipped thresholds of one section."""
    return next(v for v in defaults().values() if isinstance(v, cls))


def with_options(cls: type[T], options: Mapping[str, Any]) -> T:
    """The shipped thresholds of `cls`, with the keys of `options` that are its fields (other
    keys belong to other parts of the caller) replacing them; None leaves a default."""
    base = default(cls)
    names = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
    picked = {
        k: _coerce(cls, k, names[k], v) for k, v in options.items() if k in names and v is not None
    }
    return replace(base, **picked) if picked else base  # type: ignore[type-var]


# thresholds only the log scanner reads: not options of dx.watch()
LOG_ONLY = frozenset({"log_hang_floor_s"})


def option_names(*, sdk: bool = False) -> set[str]:
    """Every threshold name (with `sdk`, those `dx.watch()` takes as options)."""
    names = {f.name for cls in SECTIONS.values() for f in fields(cls)}
    return names - LOG_ONLY if sdk else names
