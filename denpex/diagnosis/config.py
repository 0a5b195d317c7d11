"""Loads the rules' thresholds, category roles and causal edges from rules.yaml (package data).

Only reads and checks the data; the rules that use it live in rules.py, causality.py and
hangs.py. Category and signature lists accept a trailing `.*` (a prefix) or `*` wildcards.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.core.events import Evidence, severity_rank

Matcher = Callable[[str], bool]


def _matcher(patterns: list[str]) -> Matcher:
    exact = {p for p in patterns if "*" not in p}
    prefixes = tuple(p[:-1] for p in patterns if p.endswith(".*") and "*" not in p[:-2])
    globs = [p for p in patterns if "*" in p and not (p.endswith(".*") and "*" not in p[:-2])]

    # the answer per name: the rules ask about few names (categories, signatures), often;
    # bounded, since evidence from elsewhere may name anything
    known: dict[str, bool] = {}

    def matches(name: str) -> bool:
        answer = known.get(name)
        if answer is None:
            answer = name in exact or bool(prefixes and name.startswith(prefixes))
            answer = answer or any(fnmatch.fnmatchcase(name, g) for g in globs)
            if len(known) < 4096:
                known[name] = answer
        return answer

    return matches


@dataclass(slots=True)
class RulesConfig:
    raw: dict[str, Any]
    is_infrastructure: Matcher = field(init=False)
    is_symptom: Matcher = field(init=False)
    is_weak: Matcher = field(init=False)
    is_oom: Matcher = field(init=False)
    is_numeric: Matcher = field(init=False)
    is_overflow: Matcher = field(init=False)
    is_scheduler: Matcher = field(init=False)
    is_launcher_cancel: Matcher = field(init=False)
    is_task_failure_report: Matcher = field(init=False)
    is_collective_timeout: Matcher = field(init=False)
    can_explain_failure: Matcher = field(init=False)
    sigkill_marker: re.Pattern[str] = field(init=False)
    is_frame_signature: Matcher = field(init=False)
    _explains: dict[str, Matcher] = field(init=False)
    _refines: dict[str, Matcher] = field(init=False)
    _hardware_named_by: dict[str, Matcher] = field(init=False)
    _details: dict[str, Matcher] = field(init=False)
    _across: dict[str, Matcher] = field(init=False)
    _on_success_categories: Matcher = field(init=False)
    _on_success_signatures: Matcher = field(init=False)

    def __post_init__(self) -> None:
        r = self.raw
        self.is_infrastructure = _matcher(r["infrastructure_categories"])
        self.is_symptom = _matcher(r["symptom_categories"])
        self.is_weak = _matcher(r["weak_categories"])
        self.is_oom = _matcher(r["oom_categories"])
        self.is_numeric = _matcher(r["numeric_categories"])
        self.is_overflow = _matcher(r["overflow_categories"])
        self.is_scheduler = _matcher(r["scheduler_categories"])
        self.is_launcher_cancel = _matcher(r["launcher_cancel"]["categories"])
        self.is_task_failure_report = _matcher(r["launcher_cancel"]["after_signatures"])
        self.is_collective_timeout = _matcher(r["collective_timeout"]["categories"])
        self.can_explain_failure = _matcher(r["warning_leads"])
        self.sigkill_marker = re.compile("|".join(f"(?:{p})" for p in r["sigkill_markers"]))
        self._explains = {
            cause: _matcher(list(effects)) for cause, effects in r["explains"].items()
        }
        self._refines = {
            better: _matcher(list(roots)) for better, roots in r["refines"]["categories"].items()
        }
        self.is_frame_signature = _matcher(r["refines"]["frame_signatures"])
        self._details = {
            better: _matcher(list(roots)) for better, roots in r["refines"]["details"].items()
        }
        self._hardware_named_by = {
            better: _matcher(list(roots)) for better, roots in r["hardware_named_by"].items()
        }
        self._across = {}
        for entry in r["explains_across_hosts"]:
            named = entry if isinstance(entry, dict) else {entry: ["*"]}
            for cause, effects in named.items():
                self._across[cause] = _matcher(list(effects))
        success = r["failure_even_on_success"]
        self._on_success_categories = _matcher(success["categories"])
        self._on_success_signatures = _matcher(success["signatures"])

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def base_confidence(self, rule: str) -> float:
        return float(self.raw["confidence"]["base"][rule])

    def adjustment(self, name: str) -> float:
        return float(self.raw["confidence"][name])

    def explains(self, cause: str, effect: str) -> bool:
        """Whether evidence of category `cause` can explain evidence of category `effect`
        (rules.yaml `explains`: a lost GPU explains CUDA and NCCL errors, not ENOSPC)."""
        matches = self._explains.get(cause)
        return matches is not None and matches(effect)

    def refines(self, better: str, root: str) -> bool:
        """Whether evidence of category `better` names a root of category `root` more exactly
        (rules.yaml `refines`: a bare exception raised inside torch.save is a failed save)."""
        matches = self._refines.get(better)
        return matches is not None and matches(root)

    def details(self, better: str, root: str) -> bool:
        """Whether a line of category `better` in the message of a root of category `root`
        names it more exactly (rules.yaml `refines.details`: NCCL's "Last error:" reason)."""
        matches = self._details.get(better)
        return matches is not None and matches(root)

    def names_hardware(self, better: str, root: str) -> bool:
        """Whether hardware evidence of category `better` names an incident whose first line
        is of category `root` (rules.yaml `hardware_named_by`: the Xid 79 after the PCIe link
        dropped)."""
        matches = self._hardware_named_by.get(better)
        return matches is not None and matches(root)

    def crosses_hosts(self, cause: str, effect: str) -> bool:
        """Whether `cause` on one host explains `effect` on another (rules.yaml
        `explains_across_hosts`)."""
        matches = self._across.get(cause)
        return matches is not None and matches(effect)

    def fails_even_on_success(self, item: Evidence) -> bool:
        """Evidence that makes a run failed although it exited 0 (rules.yaml
        `failure_even_on_success`: silent data corruption, NaN loss, a corrupt checkpoint)."""
        success = self.raw["failure_even_on_success"]
        if severity_rank(item.severity) < severity_rank(success["min_severity"]):
            return False
        return self._on_success_categories(item.category) or self._on_success_signatures(
            item.signature
        )

    def followups(self, category: str) -> list[str]:
        return list(self.raw.get("followup_actions", {}).get(category, []))


def parse_rules(text: str) -> RulesConfig:
    return RulesConfig(yaml.safe_load(text))


@cache
def load_rules() -> RulesConfig:
    text = resources.files("denpex.diagnosis").joinpath("rules.yaml").read_text("utf-8")
    return parse_rules(text)
