"""A Kubernetes API server for the tests: kmock's KubernetesEmulator (the k3s resource list,
objects kept in memory, served over real HTTP on loopback) driven by the official client.
kmock answers 404 to `pods/eviction`, so this adds the Eviction API as the real API server
does it: policy/v1 Eviction, 429 TooManyRequests with the real Status body while a
PodDisruptionBudget allows no disruption, 201 and the pod's graceful deletion otherwise.

No real kube-apiserver installs on these machines; the wire formats (strategic-merge patches,
policy/v1 Eviction, Status bodies) are the real ones, the scheduler and controllers are not
there: a test creates a replacement pod where a controller would.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import threading
from typing import Any

import kmock

PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 300 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class KubeServer:
    """Start with start(), stop with stop(); `url` is the API server's address."""

    def __init__(self, *, grace_s: float = 0.3) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grace_s = grace_s  # how long an evicted pod takes to terminate
        self.emu = kmock.KubernetesEmulator()
        self.emu.resources.load_bundled()
        self.evictions: list[tuple[str, int]] = []  # (namespace/name, status) per request
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kube-server", daemon=True)
        self.emu[kmock.subresource("eviction")] ** 10 << self._evict

    # --- the server ------------------------------------------------------------------------

    def _serve(self) -> None:
        async def main() -> None:
            self._stop = asyncio.Event()
            async with self.emu, kmock.Server(self.emu, host="127.0.0.1", port=self.port):
                self._ready.set()
                await self._stop.wait()

        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.close()

    def start(self) -> KubeServer:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the kmock Kubernetes emulator did not start in 15 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # --- the Eviction API ------------------------------------------------------------------

    def _objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        found = []
        for (resource, ns, _name), obj in self.emu.objects.items():
            if resource.plural == plural and not obj.deleted and (namespace in (None, ns)):
                found.append(dict(obj.raw))
        return found

    def _evict(self, request: Any) -> Any:
        namespace, name = request.namespace, request.name
        key = f"{namespace}/{name}"
        pods = {p["metadata"]["name"]: p for p in self._objects("pods", namespace)}
        pod = pods.get(name)
        if pod is None:
            self.evictions.append((key, 404))
            return kmock.Response(
                status=404,
                payload=_status(404, "NotFound", f'pods "{name}" not found', name=name),
            )
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            b
            for b in self._objects("poddisruptionbudgets", namespace)
            if _selects(b["spec"].get("selector") or {}, labels)
        ]
        if len(budgets) > 1:
            self.evictions.append((key, 500))
            message = (
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support."
            )
            return kmock.Response(status=500, payload=_status(500, "InternalError", message))
        if budgets and not _allows(budgets[0], list(pods.values())):
            self.evictions.append((key, 429))
            body = _status(
                429,
                "TooManyRequests",
                PDB_MESSAGE,
                causes=[
                    {
                        "reason": "DisruptionBudget",
                        "message": (
                            f"The disruption budget {budgets[0]['metadata']['name']} needs more "
                            "healthy pods"
                        ),
                    }
                ],
            )
            return kmock.Response(status=429, payload=body, headers={"Retry-After": "1"})
        self.evictions.append((key, 201))
        self._delete_later(namespace, name)
        return kmock.Response(status=201, payload=_status(201, "", ""))

    def _delete_later(self, namespace: str, name: str) -> None:
        """Graceful deletion: deletionTimestamp now, the object gone after the grace period."""
        for (resource, ns, obj_name), obj in self.emu.objects.items():
            if resource.plural == "pods" and ns == namespace and obj_name == name:
                now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                obj.patch({"metadata": {"deletionTimestamp": now}})
                assert self._loop is not None
                self._loop.call_later(self.grace_s, obj.delete)
                return


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels") or {}
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def _healthy(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not pod["metadata"].get("deletionTimestamp")


def _allows(budget: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """The disruption controller's arithmetic: may one more selected pod go now?"""
    selector = budget["spec"].get("selector") or {}
    selected = [p for p in pods if _selects(selector, p["metadata"].get("labels") or {})]
    healthy = sum(1 for p in selected if _healthy(p))
    spec = budget["spec"]
    if "minAvailable" in spec:
        return healthy - 1 >= int(spec["minAvailable"])
    return len(selected) - healthy + 1 <= int(spec.get("maxUnavailable", 0))
