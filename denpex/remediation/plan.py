"""Plans: what remediation would do about one incident on one target, derived from the
incident's proposed actions (DESIGN §7 vocabulary) and its component (host, GPU, switch).

Pure: an incident as the store returns it (a dict) and its proposals in, Plans out; it never
reads the store or decides whether a plan may run (that is policy.py and guards.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from denpex.remediation.backend import Target, TargetKind
from denpex.remediation.machine import State, plan_steps

COMPONENT_KINDS = {"host": TargetKind.HOST, "gpu": TargetKind.GPU, "switch": TargetKind.SWITCH}


@dataclass(frozen=True, slots=True)
class Proposal:
    """One action an incident's evidence proposes, on one host (and device, if any)."""

    action: str
    host: str | None
    device: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    incident_id: int | None  # None: a node-local plan (node_check), no incident stored
    category: str
    rule: str
    target: Target
    actions: tuple[str, ...]
    steps: tuple[State, ...]
    reason: str

    @property
    def acts(self) -> bool:
        """Whether the plan asks anything of a backend (an empty plan only records)."""
        return bool(self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "incident": self.incident_id,
            "category": self.category,
            "rule": self.rule,
            "target": self.target.to_dict(),
            "actions": list(self.actions),
            "steps": [str(s) for s in self.steps],
            "reason": self.reason,
        }


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    return Plan(
        int(data["incident"]),
        str(data["category"]),
        str(data.get("rule", "")),
        Target.from_dict(data["target"]),
        tuple(data["actions"]),
        tuple(State(s) for s in data["steps"]),
        str(data.get("reason", "")),
    )


def proposals_of(
    incident: Mapping[str, Any],
    evidence: Iterable[Mapping[str, Any]],
    diagnosis_actions: Iterable[Mapping[str, Any]] = (),
) -> list[Proposal]:
    """The proposals of an incident: its own `action` on its component when it carries one
    (fleet incidents do); else the `actions` of its reports' diagnoses (their `target` is a
    host) and the action of each linked evidence row on that row's host."""
    component = incident.get("component") or {}
    own = incident.get("action")
    if own and component.get("kind") in COMPONENT_KINDS:
        host = component.get("host") or component.get("id")
        device = component.get("id") if component.get("kind") != "host" else None
        return [Proposal(str(own), host, device)]
    found = []
    for item in diagnosis_actions:
        action = item.get("action") or "none"
        if action != "none":
            found.append(Proposal(str(action), item.get("target") or None))
    for row in evidence:
        action = row.get("action") or "none"
        if action != "none":
            attrs = row.get("attrs") or {}
            device = attrs.get("pci") or attrs.get("gpu") if isinstance(attrs, Mapping) else None
            found.append(Proposal(str(action), row.get("host"), device))
    return found


def derive_plans(
    incident: Mapping[str, Any], proposals: Sequence[Proposal], *, pool_of: Mapping[str, str]
) -> list[Plan]:
    """One plan per host the proposals name (their actions merged), sorted by host.
    Proposals without a host cannot be acted on by a scheduler and are left out."""
    by_host: dict[str, tuple[set[str], set[str]]] = {}
    for p in proposals:
        if p.host:
            actions, devices = by_host.setdefault(p.host, (set(), set()))
            actions.add(p.action)
            if p.device:
                devices.add(p.device)
    component_kind = (incident.get("component") or {}).get("kind")
    plans = []
    for host in sorted(by_host):
        actions, devices = by_host[host]
        kind = COMPONENT_KINDS.get(str(component_kind), TargetKind.HOST)
        if kind is TargetKind.HOST and devices:
            kind = TargetKind.GPU
        device = ",".join(sorted(devices)) or None
        target = Target(kind, host, device, pool_of.get(host))
        ordered = tuple(sorted(actions))
        plans.append(
            Plan(
                int(incident["id"]),
                str(incident["category"]),
                str(incident.get("rule", "")),
                target,
                ordered,
                plan_steps(ordered),
                f"{incident['category']}: {incident.get('title', '')}".strip(),
            )
        )
    return plans
