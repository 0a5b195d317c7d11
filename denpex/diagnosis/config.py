"""Loads the rules' thresholds and category roles from rules.yaml (package data)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml


def _matcher(patterns: list[str]):
    exact = {p for p in patterns if not p.endswith(".*")}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith(".*"))
    return lambda category: category in exact or (bool(prefixes) and category.startswith(prefixes))


@dataclass(slots=True)
class RulesConfig:
    raw: dict[str, Any]
    is_infrastructure: Any = field(init=False)
    is_symptom: Any = field(init=False)
    is_weak: Any = field(init=False)
    is_oom: Any = field(init=False)
    is_numeric: Any = field(init=False)
    is_overflow: Any = field(init=False)
    is_scheduler: Any = field(init=False)
    can_explain_failure: Any = field(init=False)
    sigkill_marker: re.Pattern[str] = field(init=False)

    def __post_init__(self) -> None:
        r = self.raw
        self.is_infrastructure = _matcher(r["infrastructure_categories"])
        self.is_symptom = _matcher(r["symptom_categories"])
        self.is_weak = _matcher(r["weak_categories"])
        self.is_oom = _matcher(r["oom_categories"])
        self.is_numeric = _matcher(r["numeric_categories"])
        self.is_overflow = _matcher(r["overflow_categories"])
        self.is_scheduler = _matcher(r["scheduler_categories"])
        self.can_explain_failure = _matcher(r["warning_leads"])
        self.sigkill_marker = re.compile("|".join(f"(?:{p})" for p in r["sigkill_markers"]))

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def base_confidence(self, rule: str) -> float:
        return float(self.raw["confidence"]["base"][rule])

    def adjustment(self, name: str) -> float:
        return float(self.raw["confidence"][name])

    def explained_by(self, category: str) -> list[str]:
        """The categories that `category` evidence explains (rules.yaml `explains`)."""
        return list(self.raw.get("explains", {}).get(category, []))

    def followups(self, category: str) -> list[str]:
        return list(self.raw.get("followup_actions", {}).get(category, []))


def parse_rules(text: str) -> RulesConfig:
    return RulesConfig(yaml.safe_load(text))


@cache
def load_rules() -> RulesConfig:
    text = resources.files("denpex.diagnosis").joinpath("rules.yaml").read_text("utf-8")
    return parse_rules(text)
