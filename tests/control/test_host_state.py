"""Host state, agent → server: the agent's `host_info` (driver, firmware, kernel labels) and
its last passing diagnostics travel through the agent's own OTLP encoder to `/v1/metrics`
and come out of the store as the HostState the fleet rules read (rollout, recovered)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from denpex.agent.host_state import (
    host_labels,
    host_state_metrics,
    last_diagnostics,
    missing,
    record_diagnostics,
)
from denpex.agent.otlp import encode_metrics, serialise
from denpex.control.fleet import load_fleet_rules
from denpex.control.fleet_pass import host_states
from denpex.control.fleet_store import FleetStore
from denpex.core.collector import CollectContext, Collector, Observation
from denpex.core.roots import Roots

PROTOBUF = {"Content-Type": "application/x-protobuf"}


class GpuFacts(Collector):
    """A GPU collector after its first poll, as NvmlCollector.host_facts answers (that
    answer is tested against the fake libnvidia-ml in tests/gpu/test_nvml.py)."""

    name = "nvml"

    def __init__(self, facts: Mapping[str, str]) -> None:
        super().__init__(Roots(), {})
        self.facts = dict(facts)

    def available(self) -> tuple[bool, str]:
        return True, "facts"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        return []

    def host_facts(self) -> Mapping[str, str]:
        return self.facts


@pytest.fixture
def procfs(tmp_path):
    root = tmp_path / "proc"
    (root / "sys" / "kernel").mkdir(parents=True)
    (root / "sys" / "kernel" / "osrelease").write_text("6.8.0-49-generic\n")
    return root


def test_labels_merge_the_collectors_facts_and_the_kernel(procfs):
    roots = Roots(procfs=str(procfs))
    nvml = GpuFacts({"driver": "570.86.15", "firmware": "96.00.89.00.01"})
    dcgm = GpuFacts({"driver": "570.86.10"})  # later in the registry: NVML's answer wins
    labels = host_labels([nvml, dcgm], roots)
    assert labels == {
        "driver": "570.86.15",
        "firmware": "96.00.89.00.01",
        "kernel": "6.8.0-49-generic",
    }
    assert missing(labels) == {}
    bare = host_labels([], Roots(procfs=str(procfs / "nowhere")))
    assert bare == {}
    assert set(missing(bare)) == {"driver", "firmware", "kernel"}


def test_a_failed_diagnostic_keeps_the_last_pass(tmp_path):
    record_diagnostics(tmp_path, level=3, tool="dcgm", passed=True)
    first = last_diagnostics(tmp_path)
    assert first is not None and first["last_verdict"] == "pass"
    record_diagnostics(tmp_path, level=3, tool="dcgm", passed=False)
    after = last_diagnostics(tmp_path)
    assert after is not None and after["last_verdict"] == "fail"
    assert after["passed_ns"] == first["passed_ns"] and after["ran_ns"] >= first["ran_ns"]


def test_host_state_reaches_the_fleet_rules(api, procfs, tmp_path):
    roots = Roots(procfs=str(procfs))
    state_dir = tmp_path / "state"
    now = time.time_ns()
    gpu = GpuFacts({"driver": "550.54.15", "firmware": "96.00.89.00.01"})
    before = host_state_metrics([gpu], roots, state_dir, "node1", now)
    assert [e.body for e in before] == ["host_info"]  # no diagnostic has passed yet
    placed = host_state_metrics([GpuFacts({"switch": "leaf-3"})], roots, state_dir, "n", now)
    assert [(e.body, e.attrs.get("switch")) for e in placed] == [
        ("host_info", None),  # a placement fact is not a dependency label
        ("host_placement", "leaf-3"),
    ]
    record_diagnostics(state_dir, level=3, tool="dcgm", passed=True)
    passed_ns = last_diagnostics(state_dir)["passed_ns"]  # type: ignore[index]
    gpu.facts["driver"] = "570.86.15"  # the rollout reached this host
    after = host_state_metrics([gpu], roots, state_dir, "node1", now + 1000)
    for points, ts in ((before, now), (after, now + 1000)):
        body = serialise(encode_metrics(points, now_ns=ts), "http/protobuf")
        assert api.post("/v1/metrics", content=body, headers=PROTOBUF).status_code == 200

    fleet = FleetStore(api.runtime.store.for_leader("acme", None))  # type: ignore[arg-type]
    names = {name for _h, name, *_ in fleet.host_metrics(("denpex_host_info",))}
    assert names == {"denpex_host_info"}
    state = host_states(fleet, load_fleet_rules())["node1"]
    assert state.labels == {
        "driver": "570.86.15",
        "firmware": "96.00.89.00.01",
        "kernel": "6.8.0-49-generic",
    }
    assert abs(state.diagnostics_passed_ns - passed_ns) < 1000  # type: ignore[operator]
    other = FleetStore(api.runtime.store.for_leader("other", None))  # type: ignore[arg-type]
    assert host_states(other, load_fleet_rules()) == {}


def test_the_agent_scrape_and_health_show_its_host_state(procfs, tmp_path):
    from denpex.agent.config import load_config
    from denpex.agent.daemon import Agent
    from denpex.agent.exposition import AgentView, render
    from denpex.agent.pipeline import Pipeline

    config = load_config(None, {"state_dir": str(tmp_path), "roots.procfs": str(procfs)})
    agent = Agent(config, collector_classes=(), persist=False)
    record_diagnostics(tmp_path, level=3, tool="dcgm", passed=True)
    view = AgentView(
        host="node1",
        pipeline=Pipeline(agent.catalog, agent.jobs, host="node1"),
        states=list,
        unavailable=dict,
        help_texts=dict,
        extra=[agent._host_state_samples],
    )
    text = render(view).decode()
    assert 'denpex_host_info{kernel="6.8.0-49-generic"} 1.0' in text
    assert "denpex_diagnostics_last_pass_timestamp_seconds " in text
    health = agent.health()["host_info"]
    assert health["labels"] == {"kernel": "6.8.0-49-generic"}
    assert set(health["missing"]) == {"driver", "firmware"}
