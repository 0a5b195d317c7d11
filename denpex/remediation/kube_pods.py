"""Which pods of a Kubernetes node a drain moves, the pre-stop checkpoint handshake with
them (pod annotations), and the eviction loop: one policy/v1 Eviction per pod, a 429 (a
PodDisruptionBudget forbids the disruption now) asked again after Retry-After until the
step's timeout, then a wait until the evicted pods are gone.

It must never delete a pod directly nor retry a refusal other than 429: a 500 (a pod covered
by several budgets) or a 403 is reported as it is. DaemonSet pods and static (mirror) pods are
left, as `kubectl drain` leaves them; pods without a controller only when the data says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # static pods: the kubelet owns them
TERMINAL_PHASES = ("Succeeded", "Failed")


def pod_key(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def controller_of(pod: Any) -> Any | None:
    for ref in pod.metadata.owner_references or []:
        if ref.controller:
            return ref
    return None


def evictable(pod: Any) -> bool:
    """A pod a drain moves: not a DaemonSet's (it would come straight back), not static."""
    if MIRROR_ANNOTATION in (pod.metadata.annotations or {}):
        return False
    owner = controller_of(pod)
    return not (owner is not None and owner.kind == "DaemonSet")


@dataclass
class Pods:
    host: str
    items: list[Any]

    def present(self) -> list[Any]:
        """Pods still on the node, those terminating (grace period running) included."""
        return [p for p in self.items if p.status is None or p.status.phase not in TERMINAL_PHASES]

    def running(self) -> list[Any]:
        return [
            p
            for p in self.items
            if (p.status is None or p.status.phase not in TERMINAL_PHASES)
            and not p.metadata.deletion_timestamp
        ]


class NodeAccess(Protocol):
    """What the eviction loop needs of the backend (kube.KubernetesBackend)."""

    def api(self) -> Any: ...

    def pods(self, host: str, timeout_s: float) -> Pods: ...

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...


def checkpoint_pods(
    backend: NodeAccess,
    host: str,
    keys: Mapping[str, str],
    *,
    budget_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """The pre-stop handshake: annotate each opted-in pod of `host` with `requested` (ns)
    and wait up to `budget_s` for each to answer `saved` = <step>@<ns> after the request."""
    started = time.time_ns()
    pods = backend.pods(host, budget_s).running()
    opted = [p for p in pods if (p.metadata.annotations or {}).get(keys["opt_in"]) == "true"]
    api = backend.api()
    for pod in opted:
        backend._call(
            f"annotate pod {pod_key(pod)}",
            api.patch_namespaced_pod,
            pod.metadata.name,
            pod.metadata.namespace,
            {"metadata": {"annotations": {keys["requested"]: str(started)}}},
            _request_timeout=budget_s,
        )
    completed: dict[str, str | None] = {pod_key(p): None for p in opted}
    deadline = time.monotonic() + budget_s
    while opted and time.monotonic() < deadline and not all(completed.values()):
        for pod in opted:
            if completed[pod_key(pod)]:
                continue
            now = backend._call(
                f"read pod {pod_key(pod)}",
                api.read_namespaced_pod,
                pod.metadata.name,
                pod.metadata.namespace,
                _request_timeout=budget_s,
            )
            saved = (now.metadata.annotations or {}).get(keys["saved"], "")
            _step, _, at = saved.partition("@")
            if at.isdigit() and int(at) >= started:
                completed[pod_key(pod)] = saved
        if not all(completed.values()):
            sleep(0.2)
    return {
        "asked": sorted(completed),
        "completed": completed,
        "not_opted_in": sorted(pod_key(p) for p in pods if p not in opted),
        "seconds": round((time.time_ns() - started) / 1e9, 3),
        "budget_s": budget_s,
    }


def _retry_after(exc: Any, default: float) -> float:
    try:
        return max(0.1, float((exc.headers or {}).get("Retry-After", default)))
    except (TypeError, ValueError):
        return default


def _owners(pods: Iterable[Any]) -> list[dict[str, Any]]:
    owners = []
    for pod in pods:
        ref = controller_of(pod)
        owners.append(
            {
                "pod": pod_key(pod),
                "namespace": pod.metadata.namespace,
                "owner_kind": ref.kind if ref else None,
                "owner_name": ref.name if ref else None,
                "owner_uid": ref.uid if ref else None,
            }
        )
    return owners


def evict_all(
    backend: NodeAccess,
    host: str,
    *,
    timeout_s: float,
    retry_s: float,
    evict_unmanaged: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Evict every evictable pod of `host`; answer what happened to each (for the record)."""
    import kubernetes

    api = backend.api()
    deadline = time.monotonic() + timeout_s
    candidates = [p for p in backend.pods(host, timeout_s).running() if evictable(p)]
    unmanaged = [p for p in candidates if controller_of(p) is None and not evict_unmanaged]
    pending = {pod_key(p): p for p in candidates if p not in unmanaged}
    answers: dict[str, list[str]] = {key: [] for key in pending}
    evicted: list[Any] = []
    refused: dict[str, str] = {}
    while pending and time.monotonic() < deadline:
        wait = retry_s
        for key, pod in list(pending.items()):
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace},
            }
            try:
                api.create_namespaced_pod_eviction(
                    pod.metadata.name,
                    pod.metadata.namespace,
                    body,
                    _request_timeout=max(1.0, deadline - time.monotonic()),
                )
                answers[key].append("201")
                evicted.append(pod)
                del pending[key]
            except kubernetes.client.ApiException as exc:
                answers[key].append(str(exc.status))
                if exc.status == 429:  # a disruption budget forbids it now: ask again later
                    wait = min(wait, _retry_after(exc, retry_s))
                elif exc.status == 404:  # already gone
                    del pending[key]
                else:
                    refused[key] = f"{exc.status} {exc.reason}"
                    del pending[key]
        if pending:
            sleep(min(wait, max(0.0, deadline - time.monotonic())))
    # an evicted pod is gone once the node no longer lists it (its grace period ended)
    gone_keys = {pod_key(p) for p in evicted}
    still = [pod_key(p) for p in backend.pods(host, timeout_s).present() if pod_key(p) in gone_keys]
    while still and time.monotonic() < deadline:
        sleep(0.25)
        present = backend.pods(host, timeout_s).present()
        still = [pod_key(p) for p in present if pod_key(p) in gone_keys]
    return {
        "evicted": sorted(gone_keys),
        "blocked": sorted(pending),
        "refused": refused,
        "unmanaged": sorted(pod_key(p) for p in unmanaged),
        "still_running": still,
        "answers": answers,
        "owners": _owners(evicted),
    }
