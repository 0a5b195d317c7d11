"""The node side of the Kubernetes backend: holding a node out of service (one patch:
`spec.unschedulable`, denpex's taint, its annotations) and giving it back, each with the
NodeCondition and the Event node-problem-detector users expect, and the node read back after
the write. The keys written are data (kubernetes.yaml).

It must never touch a taint that is not denpex's, nor uncordon a node someone else cordoned
(one without denpex's annotation).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from typing import Any, Protocol

import yaml

from denpex.remediation.backend import (
    BackendError,
    NodeState,
    Operation,
    StepResult,
    Target,
    result,
)


@cache
def settings() -> Mapping[str, Any]:
    """kubernetes.yaml: the keys this backend writes and the eviction settings."""
    text = resources.files("denpex.remediation").joinpath("kubernetes.yaml").read_text()
    return dict(yaml.safe_load(text))


def now_iso() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeWrites(Protocol):
    """What holding and releasing a node needs of the backend (kube.KubernetesBackend)."""

    def api(self) -> Any: ...

    def state(self, target: Target, *, timeout_s: float) -> NodeState: ...

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...

    def _node(self, host: str, timeout_s: float) -> Any: ...

    def _patch(self, host: str, body: Mapping[str, Any], timeout_s: float) -> Any: ...


def set_condition(
    backend: NodeWrites, node: Any, held: bool, message: str, timeout_s: float
) -> None:
    """Set denpex's NodeCondition (status True while held) and record an Event."""
    conf = settings()["condition"]
    reason = conf["reason_held" if held else "reason_released"]
    now = now_iso()
    conditions = [
        c.to_dict() if hasattr(c, "to_dict") else dict(c)
        for c in node.status.conditions or []
        if c.type != conf["type"]
    ]
    conditions = [camel(c) for c in conditions]
    conditions.append(
        {
            "type": conf["type"],
            "status": "True" if held else "False",
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
    )
    api, host = backend.api(), node.metadata.name
    backend._call(
        f"set condition on {host}",
        api.patch_node_status,
        host,
        {"status": {"conditions": conditions}},
        _request_timeout=timeout_s,
    )
    events = settings()["events"]
    backend._call(
        f"record event on {host}",
        api.create_namespaced_event,
        events["namespace"],
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{host}.{time.time_ns():x}",
                "namespace": events["namespace"],
            },
            "involvedObject": {"kind": "Node", "name": host, "uid": node.metadata.uid},
            "reason": reason,
            "message": message,
            "type": "Warning" if held else "Normal",
            "source": {"component": events["source"]},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
        _request_timeout=timeout_s,
    )


def hold(
    backend: NodeWrites,
    op: Operation,
    target: Target,
    reason: str,
    timeout_s: float,
    taint_name: str,
) -> StepResult:
    """Cordon with our taint, annotations and condition; idempotent; refuses a node that
    someone else cordoned."""
    started = time.time_ns()
    keys, taint = settings()["annotations"], settings()[taint_name]
    node = backend._node(target.host, timeout_s)
    annotations = dict(node.metadata.annotations or {})
    ours = annotations.get(keys["cordoned_by"]) == "denpex"
    taints = [camel(t.to_dict()) for t in node.spec.taints or []]
    has_taint = any(t["key"] == taint["key"] for t in taints)
    if node.spec.unschedulable and not ours:
        raise BackendError(
            f"kubernetes: {target.host} is already cordoned outside denpex; "
            "denpex leaves it as it is"
        )
    if node.spec.unschedulable and has_taint and annotations.get(keys["reason"]) == reason:
        return result(
            op,
            target,
            started,
            ok=True,
            changed=False,
            detail=f"{target.host} already cordoned: {reason}",
            record={"node": backend.state(target, timeout_s=timeout_s).to_dict()},
        )
    if not has_taint:
        taints.append({"key": taint["key"], "value": taint["value"], "effect": taint["effect"]})
    body = {
        "metadata": {"annotations": {keys["cordoned_by"]: "denpex", keys["reason"]: reason}},
        "spec": {"unschedulable": True, "taints": taints},
    }
    patched = backend._patch(target.host, body, timeout_s)
    set_condition(backend, patched, True, reason, timeout_s)
    after = backend.state(target, timeout_s=timeout_s)
    done = after.raw["unschedulable"] and any(
        t.get("key") == taint["key"] for t in after.raw["taints"]
    )
    return result(
        op,
        target,
        started,
        ok=bool(done),
        changed=True,
        detail=f"node {target.host}: unschedulable, taint {taint['key']}, reason {reason!r}",
        record={"node": after.to_dict(), "patch": body},
    )


def release(backend: NodeWrites, target: Target, *, reason: str, timeout_s: float) -> StepResult:
    started = time.time_ns()
    conf = settings()
    keys = conf["annotations"]
    ours_taints = {conf["taint"]["key"], conf["rma_taint"]["key"]}
    node = backend._node(target.host, timeout_s)
    annotations = dict(node.metadata.annotations or {})
    ours = annotations.get(keys["cordoned_by"]) == "denpex"
    if not node.spec.unschedulable and not ours:
        return result(
            Operation.RESUME,
            target,
            started,
            ok=True,
            changed=False,
            detail=f"{target.host} already in service",
            record={"node": backend.state(target, timeout_s=timeout_s).to_dict()},
        )
    if not ours:
        raise BackendError(
            f"kubernetes: {target.host} was cordoned outside denpex (no {keys['cordoned_by']} "
            "annotation); denpex does not uncordon it"
        )
    taints = [camel(t.to_dict()) for t in node.spec.taints or []]
    body = {
        "metadata": {"annotations": {keys["cordoned_by"]: None, keys["reason"]: None}},
        "spec": {
            "unschedulable": False,
            "taints": [t for t in taints if t["key"] not in ours_taints],
        },
    }
    patched = backend._patch(target.host, body, timeout_s)
    set_condition(backend, patched, False, reason, timeout_s)
    after = backend.state(target, timeout_s=timeout_s)
    return result(
        Operation.RESUME,
        target,
        started,
        ok=not after.raw["unschedulable"],
        changed=True,
        detail=f"node {target.host}: schedulable, denpex taints removed",
        record={"node": after.to_dict(), "patch": body},
    )


def camel(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The client's snake_case model dict back in the API's camelCase (None fields dropped)."""
    out = {}
    for key, value in obj.items():
        if value is None:
            continue
        head, *rest = key.split("_")
        if isinstance(value, datetime.datetime):
            value = value.strftime("%Y-%m-%dT%H:%M:%SZ")
        out[head + "".join(w.title() for w in rest)] = value
    return out
