"""Plans: what remediation would do about one incident on one target, derived from the
incident's proposed actions (DESIGN §7 vocabulary) and its component (host, GPU, switch).

Pure: an incident as the store returns it (a dict) and its proposals in, Plans out; it never
reads the store or decides whether a plan may run (that is policy.py and guards.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from denpex.core.diagnosis import ACTIONS
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


def _host_of_component(component: Mapping[str, Any], hosts: Sequence[str]) -> str | None:
    """The host a fleet incident's component sits on: its own `host`, the host itself, the
    `host/pci` prefix of a GPU id, else the incident's one linked host (a GPU known by its
    serial); None when that is not one host."""
    if component.get("host"):
        return str(component["host"])
    ident = str(component.get("id") or "")
    if component.get("kind") == "host":
        return ident or None
    if "/" in ident:
        return ident.split("/", 1)[0]
    return hosts[0] if len(hosts) == 1 else None


def _host_of_target(target: Any, hosts: Sequence[str]) -> str | None:
    """A diagnosis action's target as a host: the engine writes a host or "rank R on HOST";
    anything else (a job, a rank alone) is no host. With the incident's hosts known, only
    one of them counts."""
    text = str(target or "").strip()
    if " on " in text:
        text = text.rsplit(" on ", 1)[1].strip()
    elif text.startswith("rank "):
        return None
    if not text:
        return None
    return text if not hosts or text in hosts else None


def proposals_of(
    incident: Mapping[str, Any],
    evidence: Iterable[Mapping[str, Any]],
    diagnosis_actions: Iterable[Mapping[str, Any]] = (),
) -> list[Proposal]:
    """The proposals of an incident: its own `action` on its component when it carries one
    (fleet incidents do); else the `actions` of its reports' diagnoses (on the host their
    `target` names) and the action of each linked evidence row on that row's host."""
    component = incident.get("component") or {}
    hosts = [str(h) for h in incident.get("hosts") or []]
    own = incident.get("action")
    if own and component.get("kind") in COMPONENT_KINDS:
        host = _host_of_component(component, hosts)
        device = component.get("id") if component.get("kind") != "host" else None
        return [Proposal(str(own), host, device)]
    found = []
    for item in diagnosis_actions:
        action = item.get("action") or "none"
        if action != "none":
            found.append(Proposal(str(action), _host_of_target(item.get("target"), hosts)))
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
    Proposals without a host cannot be acted on by a scheduler and are left out; so are
    actions outside the §7 vocabulary (a report is outside input: one odd word must not stop
    the plans of every other incident), named in the plan's reason."""
    by_host: dict[str, tuple[set[str], set[str]]] = {}
    unknown = sorted({p.action for p in proposals if p.action not in ACTIONS})
    for p in proposals:
        if p.host and p.action in ACTIONS:
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
                f"{incident['category']}: {incident.get('title', '')}".strip()
                + (f" (unknown actions left out: {', '.join(unknown)})" if unknown else ""),
            )
        )
    return plans
