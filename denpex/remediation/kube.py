"""The Kubernetes backend, through the official `kubernetes` client: the client and the node
read back (here), holding a node out of service and giving it back (kube_node.py: cordon as
`spec.unschedulable` with a denpex taint, annotations, a NodeCondition and an Event, as
node-problem-detector users expect), and the node's pods (kube_pods.py: the pre-stop
checkpoint as a pod annotation handshake, eviction through the Eviction API (policy/v1) that
waits on a PodDisruptionBudget's 429 instead of forcing). The keys it writes are data
(kubernetes.yaml).

It must never delete a pod directly, force past a PodDisruptionBudget, touch a taint that is
not its own, or uncordon a node that someone else cordoned (one without its annotation).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from denpex.core import jsonio, kube_client
from denpex.remediation import diagnostics
from denpex.remediation.backend import (
    REASON_PREFIX,
    Backend,
    BackendError,
    NodeState,
    Operation,
    StepResult,
    Target,
    result,
)
from denpex.remediation.kube_node import hold, release, settings
from denpex.remediation.kube_pods import Pods, checkpoint_pods, evict_all, evictable, pod_key

__all__ = ["KubernetesBackend", "settings"]


def _client() -> Any:
    try:
        return kube_client.kubernetes_module()
    except kube_client.KubeUnavailable as exc:
        raise BackendError(f"kubernetes: {exc}") from None


class KubernetesBackend(Backend):
    name = "kubernetes"

    def __init__(
        self,
        *,
        host: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        diagnostics_command: Sequence[str] = diagnostics.DEFAULT_COMMAND,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._host, self._kubeconfig, self._context = host, kubeconfig, context
        self.diagnostics_command = tuple(diagnostics_command)
        self.sleep = sleep
        self._api: Any = None

    # --- the client ------------------------------------------------------------------------

    def api(self) -> Any:
        """The CoreV1Api, configured once: an explicit host, else in-cluster, else kubeconfig."""
        if self._api is None:
            try:
                self._api = kube_client.core_v1(self._host, self._kubeconfig, self._context)
            except kube_client.KubeUnavailable as exc:
                raise BackendError(f"kubernetes: {exc}") from None
        return self._api

    def available(self) -> str | None:
        try:
            self.api()
        except BackendError as exc:
            return str(exc)
        return None

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import urllib3

        k8s = _client()
        try:
            return fn(*args, **kwargs)
        except k8s.client.ApiException as exc:
            raise BackendError(f"kubernetes: {what}: {exc.status} {_message(exc)}") from None
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # unreachable, timed out
            raise BackendError(f"kubernetes: {what}: {exc}") from None

    # --- reading back ----------------------------------------------------------------------

    def _node(self, host: str, timeout_s: float) -> Any:
        api = self.api()
        return self._call(f"read node {host}", api.read_node, host, _request_timeout=timeout_s)

    def pods(self, host: str, timeout_s: float) -> Pods:
        api = self.api()
        listed = self._call(
            f"list pods on {host}",
            api.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={host}",
            _request_timeout=timeout_s,
        )
        return Pods(host, [p for p in listed.items if p.spec and p.spec.node_name == host])

    def state(self, target: Target, *, timeout_s: float) -> NodeState:
        node = self._node(target.host, timeout_s)
        return self._state(node, self.pods(target.host, timeout_s))

    def _state(self, node: Any, pods: Pods) -> NodeState:
        keys = settings()["annotations"]
        annotations = dict(node.metadata.annotations or {})
        unschedulable = bool(node.spec.unschedulable)
        ours = annotations.get(keys["cordoned_by"]) == "denpex"
        reason = annotations.get(keys["reason"]) if ours else None
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        running = tuple(pod_key(p) for p in pods.running())
        return NodeState(
            node.metadata.name,
            schedulable=not unschedulable and ready,
            drained=unschedulable and not [p for p in pods.running() if evictable(p)],
            reason=reason if reason else ("cordoned outside denpex" if unschedulable else None),
            jobs=running,
            raw={
                "unschedulable": unschedulable,
                "ready": ready,
                "taints": [t.to_dict() for t in node.spec.taints or []],
                "annotations": {k: v for k, v in annotations.items() if k in keys.values()},
                "labels": dict(node.metadata.labels or {}),
            },
        )

    def pool_of(self, host: str, *, timeout_s: float) -> str | None:
        labels = dict(self._node(host, timeout_s).metadata.labels or {})
        for label in settings()["pool_labels"]:
            if labels.get(label):
                return str(labels[label])
        return None

    def pool_hosts(self, pool: str, *, timeout_s: float) -> tuple[str, ...]:
        api = self.api()
        nodes = self._call("list nodes", api.list_node, _request_timeout=timeout_s).items
        hosts = []
        for node in nodes:
            labels = dict(node.metadata.labels or {})
            named = [labels[k] for k in settings()["pool_labels"] if labels.get(k)]
            if named and named[0] == pool:
                hosts.append(node.metadata.name)
        return tuple(sorted(hosts))

    # --- writing ---------------------------------------------------------------------------

    def _patch(self, host: str, body: Mapping[str, Any], timeout_s: float) -> Any:
        api = self.api()
        return self._call(
            f"patch node {host}", api.patch_node, host, dict(body), _request_timeout=timeout_s
        )

    def cordon(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return hold(self, Operation.CORDON, target, reason, timeout_s, "taint")

    def drain(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        # draining is marking the node to empty (cordoned, tainted, condition set); the pods
        # leave in the evict step, after their checkpoint
        return hold(self, Operation.DRAIN, target, reason, timeout_s, "taint")

    def rma(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return hold(
            self, Operation.RMA, target, f"{REASON_PREFIX} rma {reason}", timeout_s, "rma_taint"
        )

    def resume(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return release(self, target, reason=reason, timeout_s=timeout_s)

    # --- the node's pods -------------------------------------------------------------------

    def checkpoint(self, target: Target, *, budget_s: float) -> StepResult:
        """Ask each opted-in pod to checkpoint (annotation `requested`), wait up to `budget_s`
        for each to answer with `saved` = <step>@<ns> later than the request."""
        started = time.time_ns()
        record = checkpoint_pods(
            self, target.host, settings()["checkpoint"], budget_s=budget_s, sleep=self.sleep
        )
        asked, done = record["asked"], [k for k, v in record["completed"].items() if v]
        return result(
            Operation.CHECKPOINT,
            target,
            started,
            ok=len(done) == len(asked),
            changed=bool(asked),
            detail=f"checkpoint asked of {len(asked)} pod(s) on {target.host}, "
            f"{len(done)} saved in budget",
            record=record,
        )

    def evict(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        started = time.time_ns()
        conf = settings()["eviction"]
        _client()  # says what to install when the client is missing
        outcome = evict_all(
            self,
            target.host,
            timeout_s=timeout_s,
            retry_s=float(conf["retry_s"]),
            evict_unmanaged=bool(conf["evict_unmanaged_pods"]),
            sleep=self.sleep,
        )
        keys = settings()["annotations"]
        self._patch(
            target.host,
            {
                "metadata": {
                    "annotations": {keys["evicted"]: jsonio.dumps(outcome["owners"]).decode()}
                }
            },
            timeout_s,
        )
        left = [*outcome["blocked"], *outcome["unmanaged"], *outcome["still_running"]]
        left += list(outcome["refused"])
        detail = f"{len(outcome['evicted'])} pod(s) evicted from {target.host}"
        if outcome["blocked"]:
            detail += f"; {len(outcome['blocked'])} held by a PodDisruptionBudget (not forced)"
        if outcome["unmanaged"]:
            detail += f"; {len(outcome['unmanaged'])} without a controller left in place"
        if outcome["refused"]:
            detail += f"; {len(outcome['refused'])} refused by the API server"
        return result(
            Operation.EVICT,
            target,
            started,
            ok=not left,
            changed=bool(outcome["evicted"]),
            detail=detail,
            record=outcome,
        )

    def requeue(self, target: Target, *, exclude: Sequence[str], timeout_s: float) -> StepResult:
        """Evicted pods come back through their controllers (a Job, a StatefulSet, a
        training operator); the cordon and the NoSchedule taint keep them off `exclude`. This
        step checks that each evicted pod's owner has a pod again, on another node."""
        started = time.time_ns()
        keys = settings()["annotations"]
        node = self._node(target.host, timeout_s)
        owners = jsonio.loads((node.metadata.annotations or {}).get(keys["evicted"]) or "[]")
        api = self.api()
        listed = self._call(
            "list pods", api.list_pod_for_all_namespaces, _request_timeout=timeout_s
        ).items
        placed: dict[str, list[str]] = {}
        for owner in owners:
            placed[owner["pod"]] = [
                f"{p.metadata.namespace}/{p.metadata.name}@{p.spec.node_name or '-'}"
                for p in listed
                if p.metadata.namespace == owner["namespace"]
                and owner["owner_uid"] in {o.uid for o in p.metadata.owner_references or []}
                and p.spec.node_name not in set(exclude) | {target.host}
                and not p.metadata.deletion_timestamp
            ]
        return result(
            Operation.REQUEUE,
            target,
            started,
            ok=True,
            changed=False,
            detail=f"{sum(1 for v in placed.values() if v)} of {len(placed)} evicted pod(s) "
            "recreated by their controllers off the node",
            record={"owners": owners, "replacements": placed, "exclude": sorted(exclude)},
        )

    def run_diagnostics(self, target: Target, *, level: int, timeout_s: float) -> StepResult:
        return diagnostics.run(
            target, level=level, timeout_s=timeout_s, command=self.diagnostics_command
        )


def _message(exc: Any) -> str:
    try:
        return str(jsonio.loads(exc.body).get("message", exc.reason))
    except (ValueError, TypeError, AttributeError):
        return str(exc.reason)
