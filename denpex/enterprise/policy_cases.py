"""Policy cases: a YAML list of requests (principal, action, resource, context) with the
decision each must get, run against a policy set by `denpex policy test`. The bundled set
carries its own cases (policies/cases.yaml), run by the test suite.

It must never count a case as passed unless Cedar's decision (and, when the case names one,
the deciding policy) is the one expected; a malformed case is an error, not a pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from denpex.enterprise.auth import Principal
from denpex.enterprise.authz import ANONYMOUS, Anonymous, Decision, Resource, decide
from denpex.enterprise.policy import PolicyError, PolicySet

# cases run at a fixed time unless they say otherwise: Wednesday noon UTC
DEFAULT_CONTEXT = {"hour": 12, "weekday": 3}
_RESOURCE_KEYS = {"kind", "tenant", "node_pool", "partition", "category", "host", "blast_radius"}
_SCOPES = ("node_pools", "partitions", "categories")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    principal: Principal | Anonymous
    action: str
    resource: Resource
    context: dict[str, int]
    expect: bool  # True: allow
    policy: str | None  # the @id that must be among the deciding policies


@dataclass(frozen=True, slots=True)
class Outcome:
    case: Case
    decision: Decision

    @property
    def passed(self) -> bool:
        if self.decision.allowed != self.case.expect:
            return False
        return self.case.policy is None or self.case.policy in self.decision.policies

    def describe(self) -> str:
        got = "allow" if self.decision.allowed else "deny"
        want = "allow" if self.case.expect else "deny"
        by = ", ".join(self.decision.policies) or "no policy"
        line = f"{self.case.name}: expected {want}"
        if self.case.policy:
            line += f" by {self.case.policy}"
        line += f", got {got} by {by}"
        if self.decision.errors:
            line += f" (errors: {'; '.join(self.decision.errors)})"
        return line


def load_cases(path: str | Path) -> list[Case]:
    """The cases of a YAML file (`cases:` list); PolicyError names the first bad one."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PolicyError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path}: not YAML ({exc})") from None
    entries = raw.get("cases") if isinstance(raw, Mapping) else None
    if not isinstance(entries, list) or not entries:
        raise PolicyError(f"{path}: expected a non-empty `cases:` list")
    cases = []
    for index, entry in enumerate(entries, 1):
        try:
            cases.append(_case(entry, index))
        except (KeyError, TypeError, ValueError) as exc:
            raise PolicyError(f"{path}: case {index}: {exc}") from None
    return cases


def _case(entry: Mapping[str, Any], index: int) -> Case:
    expect = str(entry["expect"])
    if expect not in ("allow", "deny"):
        raise ValueError(f"expect must be allow or deny, not {expect!r}")
    who = entry["principal"]
    principal: Principal | Anonymous
    if who == "anonymous":
        principal = ANONYMOUS
    else:
        unknown = set(who) - {"tenant", "role", "id", *_SCOPES}
        if unknown:
            raise ValueError(f"principal: unknown keys {sorted(unknown)}")
        scopes = {k: frozenset(str(v) for v in who.get(k) or ()) for k in _SCOPES}
        principal = Principal(
            str(who["tenant"]),
            str(who["role"]),
            str(who.get("id", f"case{index}")),
            node_pools=scopes["node_pools"],
            partitions=scopes["partitions"],
            categories=scopes["categories"],
        )
    res = dict(entry["resource"])
    unknown = set(res) - _RESOURCE_KEYS
    if unknown:
        raise ValueError(f"resource: unknown keys {sorted(unknown)}")
    kind, tenant = str(res.pop("kind")), str(res.pop("tenant", ""))
    attrs = {k: (int(v) if k == "blast_radius" else str(v)) for k, v in res.items()}
    context = {**DEFAULT_CONTEXT, **{k: int(v) for k, v in (entry.get("context") or {}).items()}}
    return Case(
        name=str(entry.get("name") or f"case {index}"),
        principal=principal,
        action=str(entry["action"]),
        resource=Resource(kind, tenant, attrs),
        context=context,
        expect=expect == "allow",
        policy=str(entry["policy"]) if entry.get("policy") else None,
    )


def run_cases(cases: list[Case], policies: PolicySet) -> list[Outcome]:
    return [
        Outcome(c, decide(c.principal, c.action, c.resource, c.context, policies=policies))
        for c in cases
    ]
