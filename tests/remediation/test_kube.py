"""The Kubernetes backend through the official client against kmock's API server emulator on
loopback (with the Eviction API and PodDisruptionBudget 429s as the real server answers them):
cordon with a denpex taint, annotation, NodeCondition and Event; eviction that waits on a
budget's 429 and never deletes a pod; the checkpoint handshake; uncordon only of our own
cordon; every operation idempotent and read back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from denpex.remediation.backend import BackendError, Target, TargetKind
from denpex.remediation.kube import KubernetesBackend, settings
from tests.remediation.kube_server import KubeServer


@pytest.fixture(scope="module")
def server() -> Iterator[KubeServer]:
    srv = KubeServer().start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def core(server: KubeServer) -> Iterator[client.CoreV1Api]:
    cfg = client.Configuration()
    cfg.host = server.url
    api = client.CoreV1Api(client.ApiClient(cfg))
    yield api
    for pod in api.list_pod_for_all_namespaces().items:
        api.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    for node in api.list_node().items:
        api.delete_node(node.metadata.name)
    policy = client.PolicyV1Api(api.api_client)
    for pdb in policy.list_pod_disruption_budget_for_all_namespaces().items:
        policy.delete_namespaced_pod_disruption_budget(pdb.metadata.name, pdb.metadata.namespace)
    server.evictions.clear()


@pytest.fixture
def backend(server: KubeServer, core: client.CoreV1Api) -> KubernetesBackend:
    return KubernetesBackend(
        host=server.url, diagnostics_command=["sh", "-c", "echo level {level} on {host}"]
    )


READY = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}


def node(api: client.CoreV1Api, name: str, pool: str = "gpu", **spec) -> None:
    api.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"denpex.io/pool": pool}, "uid": f"uid-{name}"},
            "spec": spec,
            "status": READY,
        }
    )


def pod(api, name, host, *, owner="ReplicaSet", labels=None, annotations=None) -> None:
    meta = {"name": name, "namespace": "train", "labels": labels or {"app": "trainer"}}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": f"{owner.lower()}-1",
                "uid": f"uid-{owner}",
                "controller": True,
            }
        ]
    api.create_namespaced_pod(
        "train",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": host, "containers": [{"name": "c", "image": "trainer"}]},
            "status": {"phase": "Running", **READY},
        },
    )


def budget(api, min_available: int) -> None:
    client.PolicyV1Api(api.api_client).create_namespaced_pod_disruption_budget(
        "train",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "trainer", "namespace": "train"},
            "spec": {
                "minAvailable": min_available,
                "selector": {"matchLabels": {"app": "trainer"}},
            },
        },
    )


def pod_deletes(server: KubeServer) -> int:
    """DELETE requests on pods the API server has seen (a drain must send none)."""
    return sum(
        1
        for r in server.emu
        if str(r.method).upper().endswith("DELETE") and r.resource and r.resource.plural == "pods"
    )


T = Target(TargetKind.HOST, "n1", None, "gpu")
REASON = "denpex: incident 7 gpu.fallen_off_bus"


def test_cordon_taints_annotates_sets_condition_and_event_and_is_idempotent(backend, core):
    node(core, "n1", taints=[{"key": "site/maintenance", "effect": "PreferNoSchedule"}])
    first = backend.cordon(T, reason=REASON, timeout_s=10)
    assert first.ok and first.changed
    read = core.read_node("n1")
    assert read.spec.unschedulable is True
    taints = {t.key: t.effect for t in read.spec.taints}
    assert taints == {"site/maintenance": "PreferNoSchedule", "denpex.io/unhealthy": "NoSchedule"}
    assert read.metadata.annotations["denpex.io/cordoned-by"] == "denpex"
    assert read.metadata.annotations["denpex.io/reason"] == REASON
    (cond,) = [c for c in read.status.conditions if c.type == settings()["condition"]["type"]]
    assert (cond.status, cond.reason, cond.message) == ("True", "DenpexCordoned", REASON)
    assert any(c.type == "Ready" for c in read.status.conditions)  # other conditions kept
    events = core.list_namespaced_event("default").items
    assert [(e.involved_object.name, e.reason) for e in events] == [("n1", "DenpexCordoned")]
    again = backend.cordon(T, reason=REASON, timeout_s=10)
    assert again.ok and not again.changed
    state = backend.state(T, timeout_s=10)
    assert not state.schedulable and state.reason == REASON


def test_a_node_cordoned_by_someone_else_is_left_alone(backend, core):
    node(core, "n1", unschedulable=True)  # `kubectl cordon` by an operator
    with pytest.raises(BackendError, match="cordoned outside denpex"):
        backend.cordon(T, reason=REASON, timeout_s=10)
    with pytest.raises(BackendError, match="does not uncordon"):
        backend.resume(T, reason=REASON, timeout_s=10)
    assert core.read_node("n1").spec.unschedulable is True


def test_resume_removes_only_our_taint_and_annotation(backend, core):
    node(core, "n1", taints=[{"key": "site/maintenance", "effect": "PreferNoSchedule"}])
    backend.cordon(T, reason=REASON, timeout_s=10)
    back = backend.resume(T, reason="denpex: diagnostics passed", timeout_s=10)
    assert back.ok and back.changed
    read = core.read_node("n1")
    assert not read.spec.unschedulable
    assert [t.key for t in read.spec.taints] == ["site/maintenance"]
    assert "denpex.io/cordoned-by" not in (read.metadata.annotations or {})
    (cond,) = [c for c in read.status.conditions if c.type == "DenpexRemediation"]
    assert cond.status == "False"
    assert not backend.resume(T, reason="again", timeout_s=10).changed


def test_eviction_waits_on_the_disruption_budget_and_never_deletes(server, backend, core):
    node(core, "n1")
    node(core, "n2")
    pod(core, "w1", "n1")
    pod(core, "w2", "n1")
    pod(core, "agent", "n1", owner="DaemonSet", labels={"app": "node-agent"})
    budget(core, min_available=1)
    backend.cordon(T, reason=REASON, timeout_s=10)

    def controller() -> None:  # what a ReplicaSet would do once w1 is gone: a pod on n2
        time.sleep(2.0)
        pod(core, "w3", "n2")

    threading.Thread(target=controller, daemon=True).start()
    deletes_before = pod_deletes(server)
    started = time.monotonic()
    out = backend.evict(T, reason=REASON, timeout_s=30)
    assert out.ok, out.detail
    assert out.record["evicted"] == ["train/w1", "train/w2"]
    # one went at once; the other was refused with 429 until the replacement was healthy
    codes = [code for _, code in server.evictions]
    assert codes.count(201) == 2 and 429 in codes and codes[0] == 201
    assert time.monotonic() - started >= 2.0
    left = sorted(p.metadata.name for p in core.list_namespaced_pod("train").items)
    assert left == ["agent", "w3"]  # the DaemonSet's pod stays, as with kubectl drain
    assert pod_deletes(server) == deletes_before  # pods left through the Eviction API only
    requeue = backend.requeue(T, exclude=["n1"], timeout_s=10)
    assert requeue.ok and requeue.record["replacements"]["train/w1"] == ["train/w3@n2"]


def test_a_budget_that_never_allows_it_fails_the_step_without_forcing(server, backend, core):
    node(core, "n1")
    pod(core, "w1", "n1")
    budget(core, min_available=1)
    out = backend.evict(T, reason=REASON, timeout_s=3)
    assert not out.ok and out.record["blocked"] == ["train/w1"]
    assert "PodDisruptionBudget" in out.detail
    assert {code for _, code in server.evictions} == {429}
    assert len(server.evictions) >= 2  # asked again after Retry-After, never forced
    assert [p.metadata.name for p in core.list_namespaced_pod("train").items] == ["w1"]


def test_a_pod_without_a_controller_is_not_evicted(backend, core):
    node(core, "n1")
    pod(core, "bare", "n1", owner=None)
    out = backend.evict(T, reason=REASON, timeout_s=5)
    assert not out.ok and out.record["unmanaged"] == ["train/bare"]
    assert [p.metadata.name for p in core.list_namespaced_pod("train").items] == ["bare"]


def test_checkpoint_handshake_through_pod_annotations(backend, core):
    node(core, "n1")
    keys = settings()["checkpoint"]
    pod(core, "w1", "n1", annotations={keys["opt_in"]: "true"})
    pod(core, "w2", "n1")

    def trainer() -> None:  # the SDK's side: answer the request with the step it saved
        for _ in range(100):
            ann = core.read_namespaced_pod("w1", "train").metadata.annotations or {}
            if keys["requested"] in ann:
                saved = f"41@{time.time_ns()}"
                core.patch_namespaced_pod(
                    "w1", "train", {"metadata": {"annotations": {keys["saved"]: saved}}}
                )
                return
            time.sleep(0.1)

    threading.Thread(target=trainer, daemon=True).start()
    out = backend.checkpoint(T, budget_s=10)
    assert out.ok, out.detail
    assert out.record["completed"]["train/w1"].startswith("41@")
    assert out.record["not_opted_in"] == ["train/w2"]
    late = backend.checkpoint(T, budget_s=0.5)  # nobody answers a second request
    assert not late.ok and late.record["completed"] == {"train/w1": None}


def test_pools_and_diagnostics(backend, core):
    node(core, "n1", pool="gpu")
    node(core, "n2", pool="gpu")
    node(core, "n3", pool="cpu")
    assert backend.pool_of("n1", timeout_s=5) == "gpu"
    assert backend.pool_hosts("gpu", timeout_s=5) == ("n1", "n2")
    diag = backend.run_diagnostics(T, level=3, timeout_s=10)
    assert diag.ok and "level 3 on n1" in diag.record["output"]


def test_unreachable_server_is_a_backend_error():
    dead = KubernetesBackend(host="http://127.0.0.1:9")
    with pytest.raises(BackendError, match="read node"):
        dead.state(T, timeout_s=2)
