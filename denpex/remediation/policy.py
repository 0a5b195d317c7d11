"""Remediation policy: the five tiers (DESIGN §7), policy as data per tenant, per pool and per
category (policy.yaml holds the default), and the decision whether a step runs now, waits
for a human, or only records.

Pure: a policy dict in, values out. It never decides what a guard decides (guards.py) and
never lets a step run under a tier that does not allow it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.core.audit import canonical
from denpex.core.taxonomy import load_taxonomy
from denpex.remediation.machine import State, info


class Tier(StrEnum):
    OBSERVE = "observe"
    RECOMMEND = "recommend"
    APPROVE = "approve"
    AUTOSAFE = "autosafe"
    AUTOREMEDIATE = "autoremediate"


class Decision(StrEnum):
    RUN = "run"  # the step runs now
    WAIT = "wait"  # the step waits for a named human's approval
    RECORD = "record"  # nothing runs under this tier; the plan is only recorded


class PolicyError(ValueError):
    """A policy that names an unknown tier, category or setting."""


@dataclass(frozen=True, slots=True)
class BlastRadius:
    max_nodes: int
    max_percent: float
    window_s: float


@dataclass(frozen=True, slots=True)
class RateLimit:
    operations: int
    window_s: float


@dataclass(frozen=True, slots=True)
class Guards:
    blast_radius: BlastRadius
    unhealthy_stop_percent: float
    rate_limits: Mapping[str, RateLimit]
    lemon_incidents: int
    lemon_window_s: float
    never_cordon_rules: frozenset[str]


@dataclass(frozen=True, slots=True)
class Policy:
    tier: Tier
    pools: Mapping[str, Tier]
    categories: Mapping[str, Tier]
    pool_categories: Mapping[str, Tier]
    guards: Guards
    diagnostics_level: int
    checkpoint_budget_s: float
    raw: Mapping[str, Any]

    def tier_for(self, pool: str | None, category: str) -> Tier:
        """The most specific tier: pool+category, category, pool, the tenant's default."""
        if pool is not None and f"{pool}/{category}" in self.pool_categories:
            return self.pool_categories[f"{pool}/{category}"]
        if category in self.categories:
            return self.categories[category]
        if pool is not None and pool in self.pools:
            return self.pools[pool]
        return self.tier

    def digest(self) -> str:
        """SHA-256 of the canonical policy (what the audit records on a change)."""
        return hashlib.sha256(canonical(self.raw)).hexdigest()


@cache
def _file() -> Mapping[str, Any]:
    text = resources.files("denpex.remediation").joinpath("policy.yaml").read_text()
    return dict(yaml.safe_load(text))


def tier_explanations() -> Mapping[str, str]:
    return dict(_file()["tiers"])


def default_policy_dict() -> dict[str, Any]:
    return copy.deepcopy(dict(_file()["default"]))


def default_policy() -> Policy:
    return parse_policy(default_policy_dict())


def _tier(value: Any, where: str) -> Tier:
    try:
        return Tier(str(value).lower())
    except ValueError:
        raise PolicyError(
            f"{where}: unknown tier {value!r} (one of {[str(t) for t in Tier]})"
        ) from None


def _category(name: str, where: str) -> str:
    if name not in load_taxonomy():
        raise PolicyError(f"{where}: unknown category {name!r} (denpex/core/taxonomy.yaml)")
    return name


def parse_policy(data: Mapping[str, Any]) -> Policy:
    """A Policy from its dict form; settings it leaves out take the defaults of policy.yaml."""
    if not isinstance(data, Mapping):
        raise PolicyError("a policy is a mapping")
    base = default_policy_dict()
    unknown = set(data) - set(base)
    if unknown:
        raise PolicyError(f"unknown policy settings {sorted(unknown)}")
    merged = {**base, **data, "guards": {**base["guards"], **(data.get("guards") or {})}}
    g = merged["guards"]
    unknown = set(g) - set(base["guards"])
    if unknown:
        raise PolicyError(f"unknown guard settings {sorted(unknown)}")
    try:
        pool_categories = {}
        for key, tier in (merged["pool_categories"] or {}).items():
            pool, _, category = str(key).partition("/")
            if not pool or not category:
                raise PolicyError(f"pool_categories: {key!r} is not POOL/CATEGORY")
            _category(category, "pool_categories")
            pool_categories[str(key)] = _tier(tier, f"pool_categories[{key}]")
        br = g["blast_radius"]
        guards = Guards(
            BlastRadius(int(br["max_nodes"]), float(br["max_percent"]), float(br["window_s"])),
            float(g["unhealthy_stop_percent"]),
            {
                str(name): RateLimit(int(r["operations"]), float(r["window_s"]))
                for name, r in (g["rate_limits"] or {}).items()
            },
            int(g["lemon"]["incidents"]),
            float(g["lemon"]["window_s"]),
            frozenset(str(r) for r in g["never_cordon_rules"] or ()),
        )
        return Policy(
            _tier(merged["tier"], "tier"),
            {str(p): _tier(t, f"pools[{p}]") for p, t in (merged["pools"] or {}).items()},
            {
                _category(str(c), "categories"): _tier(t, f"categories[{c}]")
                for c, t in (merged["categories"] or {}).items()
            },
            pool_categories,
            guards,
            int(merged["diagnostics_level"]),
            float(merged["checkpoint_budget_s"]),
            merged,
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise PolicyError(f"malformed policy: {exc!r}") from None


def decide(tier: Tier, state: State, *, approved: bool) -> Decision:
    """Whether the step entering `state` runs now under `tier` (`approved`: a named human
    approved this very step)."""
    if tier in (Tier.OBSERVE, Tier.RECOMMEND):
        return Decision.RECORD
    if approved or tier is Tier.AUTOREMEDIATE:
        return Decision.RUN
    if tier is Tier.AUTOSAFE and info(state).reversible:
        return Decision.RUN
    return Decision.WAIT
