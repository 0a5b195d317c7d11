"""Loads the fleet rules' thresholds, category roles and confidence tables (rules.yaml).

Only reads its own package data; callers may pass a parsed config of their own instead.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.control.fleet.model import COMPONENT_KINDS


def category_matcher(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A test for category ids against exact ids and `prefix.*` patterns."""
    patterns = list(patterns)
    exact = {p for p in patterns if not p.endswith(".*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith(".*"))
    return lambda category: category in exact or (bool(prefixes) and category.startswith(prefixes))


def lookup_by_pattern(table: dict[str, Any], category: str, default: Any = None) -> Any:
    """The value for `category` in a table keyed by ids and `prefix.*` patterns (exact first,
    then the longest prefix)."""
    if category in table:
        return table[category]
    best = None
    for key in table:
        matches = key.endswith(".*") and category.startswith(key[:-1])
        if matches and (best is None or len(key) > len(best)):
            best = key
    return table[best] if best is not None else default


@dataclass(slots=True)
class FleetConfig:
    raw: dict[str, Any]
    is_host_neutral: Callable[[str], bool] = field(init=False)
    is_corroborating: Callable[[str], bool] = field(init=False)
    _component_tests: dict[str, Callable[[str], bool]] = field(init=False)
    _accepts: dict[tuple[str, str], bool] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        r = self.raw
        self.is_host_neutral = category_matcher(r["host_neutral_categories"])
        self.is_corroborating = category_matcher(r["corroborating_categories"])
        self._component_tests = {
            kind: category_matcher(cats)
            for kind, cats in r["shared_component"]["categories"].items()
        }
        unknown = set(r["actions"]) - set(COMPONENT_KINDS)
        if unknown:
            raise ValueError(f"fleet rules: actions for unknown component kinds {sorted(unknown)}")
        for rule, points in r["confidence"].items():
            xs = [float(x) for x, _ in points]
            if not points or xs != sorted(xs):
                raise ValueError(f"fleet rules: confidence.{rule} needs points in score order")

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    @property
    def lookback_ns(self) -> int:
        return int(float(self.raw["lookback_s"]) * 1e9)

    def seconds_ns(self, section: str, key: str) -> int:
        return int(float(self.raw[section][key]) * 1e9)

    def component_accepts(self, kind: str, category: str) -> bool:
        """Whether a failure of `category` can be caused by a component of `kind`."""
        known = self._accepts.get((kind, category))
        if known is None:
            test = self._component_tests.get(kind)
            known = self._accepts[(kind, category)] = bool(test and test(category))
        return known

    def action(self, kind: str) -> str:
        return str(self.raw["actions"].get(kind, "none"))

    def confidence(self, rule: str, score: float) -> float:
        """The calibrated confidence for a rule's score: piecewise linear, flat beyond."""
        points = self.raw["confidence"][rule]
        xs = [float(x) for x, _ in points]
        ys = [float(y) for _, y in points]
        if score <= xs[0]:
            return round(ys[0], 3)
        if score >= xs[-1]:
            return round(ys[-1], 3)
        i = bisect_left(xs, score)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return round(y0 + (y1 - y0) * (score - x0) / (x1 - x0), 3)


def parse_fleet_rules(text: str) -> FleetConfig:
    return FleetConfig(yaml.safe_load(text))


@cache
def load_fleet_rules() -> FleetConfig:
    text = resources.files("denpex.control.fleet").joinpath("rules.yaml").read_text("utf-8")
    return parse_fleet_rules(text)
