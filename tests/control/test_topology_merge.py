"""Topology from the agents: each agent reports where its fabric places the host
(`host_placement`, the leaf switch UFM sees its HCAs reach); the leader merges it with the
site topology file (the file wins on conflict, and says so), and shared_component finds the
switch behind a burst of IB failures with no site file at all."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from denpex.agent.otlp import encode_metrics, serialise
from denpex.control.fleet import correlate, load_fleet_rules
from denpex.control.fleet.model import Placement
from denpex.control.fleet.topology import merge_topology
from denpex.control.fleet_pass import FleetWindow
from denpex.control.fleet_store import FleetStore
from denpex.core.events import metric
from tests.control.fleet.fleet_cases import build_view

PROTOBUF = {"Content-Type": "application/x-protobuf"}
CASES = yaml.safe_load((Path(__file__).parent / "fleet" / "rule_cases.yaml").read_text())
SWITCH_CASE = next(c for c in CASES if c["name"].startswith("IB errors on four hosts behind one"))


def test_the_site_file_wins_and_says_so():
    site = {
        "h1": Placement("h1", rack="r1", switch="leaf-1", rails={"0000:18:00.0": "rail0"}),
        "h2": Placement("h2", rack="r1"),
    }
    agents = {"h1": Placement("h1", switch="leaf-9"), "h2": Placement("h2", switch="leaf-2"),
              "h3": Placement("h3", switch="leaf-3")}  # fmt: skip
    merged, conflicts = merge_topology(site, agents)
    assert merged["h1"].switch == "leaf-1" and merged["h1"].rails == {"0000:18:00.0": "rail0"}
    assert (merged["h2"].rack, merged["h2"].switch) == ("r1", "leaf-2")  # a gap filled
    assert merged["h3"].switch == "leaf-3"  # a host the site file does not know
    assert conflicts == [
        "h1: switch is leaf-1 in the site topology, leaf-9 as its agent reports it; "
        "the site topology wins"
    ]


def test_agents_placements_feed_shared_component(api):
    view, now = build_view(SWITCH_CASE)
    points = [
        metric("host_placement", 1, source="agent", labels={"switch": p.switch}, host=h, ts_ns=now)
        for h, p in view.topology.items()
        if p.switch
    ]
    body = serialise(encode_metrics(points, now_ns=now), "http/protobuf")
    assert api.post("/v1/metrics", content=body, headers=PROTOBUF).status_code == 200
    fleet = FleetStore(api.runtime.store.for_leader("acme", None))  # type: ignore[arg-type]

    def switch_incidents(site: dict) -> tuple[list[str], FleetWindow]:
        window = FleetWindow("acme", load_fleet_rules(), site)
        window.refresh(fleet, now)
        window.jobs = {j.job: j for j in view.jobs}  # the case's reports and agent events
        window.events = {e.id: e for e in view.host_events}
        window.hosts = dict(view.hosts)
        found = correlate(window.view(), now, window.config)
        return [c.component for c in found if c.rule == "shared_component"], window

    found, window = switch_incidents({})  # no site file: the agents' fabric alone
    assert found == ["sw2"] and window.conflicts == []
    assert window.view().topology["h16"].switch == "sw2"
    # a stale site file moving the failing hosts elsewhere wins, and the conflict is said
    stale = {h: replace(view.topology[h], switch="sw7") for h in ("h16", "h17", "h18", "h19")}
    found, window = switch_incidents(stale)
    assert "sw2" not in found
    assert len(window.conflicts) == 4 and all("site topology wins" in c for c in window.conflicts)
