"""Detect → cordon on the Kubernetes backend, end to end with real processes: an Xid 79 in a
node's kernel log (a real `denpex agent` reading its FIFO) → the ingest of a real `denpex
server` → an incident → a plan under AutoSafe → the node cordoned through the official client
against kmock's API server (tests/remediation/kube_drill.py). The time is printed, never
asserted (benchmarks/bench_remediation_kube.py measures it over several drills)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.remediation.kube import settings
from tests.remediation.kube_drill import KubeDrill
from tests.remediation.test_slurm import wait_for


@pytest.fixture
def drill(tmp_path: Path) -> Iterator[KubeDrill]:
    started = KubeDrill(tmp_path, nodes=2).start()
    try:
        yield started
    finally:
        started.close()


@pytest.mark.slow  # a server, two agents and the Kubernetes client's import: ≈ 45 s here
def test_an_xid_at_the_agent_cordons_its_node_in_autosafe(drill: KubeDrill) -> None:
    seen = drill.drill(1, timeout_s=120)
    print(f"kubernetes detect -> cordon: {seen}")
    assert set(seen) == {"evidence", "incident", "plan", "cordon"}
    node = drill.node("gpu-node2")
    keys = settings()["annotations"]
    assert node.metadata.annotations[keys["cordoned_by"]] == "denpex"
    assert "gpu.fallen_off_bus" in node.metadata.annotations[keys["reason"]]
    assert any(t.key == settings()["taint"]["key"] for t in node.spec.taints)
    assert not drill.unschedulable("gpu-node1")  # only the node whose GPU fell off the bus

    # AutoSafe ran the reversible steps (cordon, drain, checkpoint) and waits at eviction
    def waiting() -> dict | None:
        plans = [p for p in drill.read("/api/v1/remediation/plans") if p["host"] == "gpu-node2"]
        return plans[0] if plans and plans[0]["status"] == "waiting" else None

    plan = wait_for(waiting, 60)
    assert (plan["tier"], plan["state"]) == ("autosafe", "evict"), plan
