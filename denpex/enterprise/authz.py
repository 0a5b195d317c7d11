"""Authorisation: `authorize(principal, action, resource, context)` asks the Cedar policy set
whether a principal may do an action on a resource, now; a denial is recorded through the
caller's DenialLog and raised as AuthError 403. The control plane calls it for every route,
remediation for every step.

It must never allow when Cedar says anything but Allow (an evaluation error denies), and
never raise a denial it has not first handed to the DenialLog it was given.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from denpex.enterprise.auth import AuthError, Principal, is_authentic
from denpex.enterprise.policy import PolicySet, load_policies

log = logging.getLogger("denpex.enterprise")


@dataclass(frozen=True, slots=True)
class Anonymous:
    """The caller of a public route: no tenant, no role; a store handle refuses it."""

    label: str = "anonymous"


ANONYMOUS = Anonymous()


@dataclass(frozen=True, slots=True)
class Resource:
    """What an action is on: a kind of one tenant and what is known of it (node_pool,
    partition, category, host, blast_radius: the attributes the schema names)."""

    kind: str
    tenant: str
    attrs: Mapping[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    action: str
    policies: tuple[str, ...]  # the @ids of the policies that decided (empty: no permit)
    version: str
    errors: tuple[str, ...] = ()

    def reason(self, principal: Principal | Anonymous) -> str:
        who = principal.role if isinstance(principal, Principal) else principal.label
        if self.policies:
            return f"{who} may not {self.action}: denied by policy {', '.join(self.policies)}"
        return f"{who} may not {self.action}: no policy permits it"


@dataclass(frozen=True, slots=True)
class Denial:
    """One refused request, as the DenialLog stores it (never a secret)."""

    ts_ns: int
    tenant: str  # "" for an anonymous caller
    principal: str
    role: str
    action: str
    resource: str
    attrs: dict[str, Any]
    policies: tuple[str, ...]
    version: str
    message: str


class DenialLog(Protocol):
    def record_denial(self, denial: Denial) -> None: ...


def principal_label(principal: Principal | Anonymous) -> str:
    return principal.label


def request_context(now: dt.datetime | None = None) -> dict[str, int]:
    """The context of a request made at `now` (default: the clock), in UTC."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return {"hour": now.hour, "weekday": now.isoweekday()}


def decide(
    principal: Principal | Anonymous,
    action: str,
    resource: Resource,
    context: Mapping[str, int] | None = None,
    *,
    policies: PolicySet | None = None,
) -> Decision:
    """The policy set's decision, without recording or raising (and without asking whether
    `principal` came out of authenticate(): `denpex policy test` decides made-up ones)."""
    import cedarpy

    policies = policies or load_policies()
    if isinstance(principal, Principal):
        me = {"type": "Denpex::Principal", "id": principal_label(principal)}
        entity = {
            "uid": me,
            "attrs": {
                "tenant": principal.tenant,
                "role": principal.role,
                "node_pools": sorted(principal.node_pools),
                "partitions": sorted(principal.partitions),
                "categories": sorted(principal.categories),
            },
            "parents": [{"type": "Denpex::Role", "id": principal.role}],
        }
    else:
        me = {"type": "Denpex::Anonymous", "id": principal.label}
        entity = {"uid": me, "attrs": {}, "parents": []}
    target = {"type": "Denpex::Resource", "id": resource.kind}
    entities = [
        *policies.role_entities(),
        entity,
        {
            "uid": target,
            "attrs": {"tenant": resource.tenant, "kind": resource.kind, **resource.attrs},
            "parents": [],
        },
    ]
    request = {
        "principal": me,
        "action": {"type": "Denpex::Action", "id": action},
        "resource": target,
        "context": dict(context) if context is not None else request_context(),
    }
    result = cedarpy.is_authorized(request, policies.cedar, entities, policies.schema)
    named = result.diagnostics.id_annotations_by_reason
    decided = tuple(named.get(r, r) for r in result.diagnostics.reasons)
    errors = tuple(str(e) for e in result.diagnostics.errors)
    return Decision(result.allowed, action, decided, policies.version, errors)


def authorize(
    principal: Principal | Anonymous,
    action: str,
    resource: Resource | None = None,
    context: Mapping[str, int] | None = None,
    *,
    policies: PolicySet | None = None,
    denials: DenialLog | None = None,
) -> Decision:
    """The Decision when the policy set allows; else the denial goes to `denials` and AuthError
    403 is raised. `resource` defaults to the action's kind in the principal's own tenant."""
    if isinstance(principal, Principal) and not is_authentic(principal):
        raise AuthError(401, "unauthenticated")
    if resource is None:
        tenant = principal.tenant if isinstance(principal, Principal) else ""
        resource = Resource(action.partition(":")[0], tenant)
    decision = decide(principal, action, resource, context, policies=policies)
    if decision.allowed:
        return decision
    message = decision.reason(principal)
    if decision.errors:
        log.warning("policy evaluation errors for %s: %s", action, "; ".join(decision.errors))
    if denials is not None:
        denials.record_denial(
            Denial(
                ts_ns=time.time_ns(),
                tenant=principal.tenant if isinstance(principal, Principal) else "",
                principal=principal_label(principal),
                role=principal.role if isinstance(principal, Principal) else "",
                action=action,
                resource=resource.kind,
                attrs={"tenant": resource.tenant, **resource.attrs},
                policies=decision.policies,
                version=decision.version,
                message=message,
            )
        )
    raise AuthError(403, message)
