"""The agents' own view of the fabric: each GPU's NIC port and rail (`host_rail`, from the
NCCL topology) and each port's peer switch (`host_port_peer`, from ibnetdiscover / LLDP).
The leader turns them into rails named by the rail switch, merges them under the site file
and UFM (site file > UFM > discovery, each field saying who won), and shared_component then
finds a rail switch that only the neighbours reveal."""

from __future__ import annotations

from typing import Any

from denpex.agent.otlp import encode_metrics, serialise
from denpex.control.fleet import correlate, load_fleet_rules
from denpex.control.fleet.fabric_placement import fabric_placements
from denpex.control.fleet.model import Placement
from denpex.control.fleet.topology import merge_topology
from denpex.control.fleet_pass import FleetWindow
from denpex.control.fleet_store import FleetStore
from denpex.core.events import metric
from tests.control.fleet.fleet_cases import GPU_BUSES, at, build_view

PROTOBUF = {"Content-Type": "application/x-protobuf"}
NAMES = {
    "labels": "denpex_host_info",
    "placement": "denpex_host_placement",
    "rail": "denpex_host_rail",
    "port": "denpex_host_port_peer",
}
PER_UNIT = 16  # hosts per scalable unit: each unit has its own eight rail switches


def rail_switch(host_index: int, rail: int) -> str:
    return f"su{host_index // PER_UNIT}-rail{rail}"


def agent_rows(host: str, index: int, ts: int, *, peers: bool = True) -> list[tuple]:
    """What the agent of a rail-optimised DGX sends: host_info, its eight GPUs' rails and,
    where its neighbour tools ran, the rail switch of each of their ports."""
    rows: list[tuple] = [(host, NAMES["labels"], {"driver": "good"}, ts, 1.0)]
    for g, bus in enumerate(GPU_BUSES):
        nic = f"mlx5_{g}/1"
        rows.append(
            (host, NAMES["rail"], {"gpu": f"0000:{bus}:00.0", "nic": nic, "rail": str(g)}, ts, 1.0)
        )
        if peers:
            peer = {"port": nic, "switch": rail_switch(index, g), "via": "ibnetdiscover"}
            rows.append((host, NAMES["port"], peer, ts, 1.0))
    return rows


def test_rails_are_named_by_the_rail_switch_the_neighbours_found() -> None:
    rows = agent_rows("h17", 17, ts=100) + agent_rows("h18", 18, ts=100, peers=False)
    ufm, found = fabric_placements(rows, NAMES)
    assert ufm == {}
    h17 = found["h17"]
    assert h17.rails["0000:4c:00.0"] == "su1-rail3" and h17.ports["mlx5_3/1"] == "su1-rail3"
    assert h17.switch is None  # eight ports, eight switches: no one leaf switch
    assert h17.sources == {
        "ports": "ibnetdiscover",
        "rails": "the NCCL topology + ibnetdiscover",
    }
    # no neighbour tool on h18: NCCL's rail index is all there is
    assert found["h18"].rails["0000:4c:00.0"] == "rail3"
    assert found["h18"].sources == {"rails": "the NCCL topology"}


def test_a_host_whose_ports_mostly_reach_one_switch_has_that_leaf() -> None:
    rows = [
        ("h1", NAMES["port"], {"port": f"mlx5_{i}/1", "switch": s, "via": "lldp"}, 5, 1.0)
        for i, s in enumerate(["tor-7", "tor-7", "tor-7", "storage-1"])
    ]
    _, found = fabric_placements(rows, NAMES)
    assert (found["h1"].switch, found["h1"].sources["switch"]) == ("tor-7", "lldp")


def test_only_the_newest_report_counts_and_a_port_gone_drops_out() -> None:
    old = agent_rows("h1", 1, ts=100)
    new = [r for r in agent_rows("h1", 1, ts=200) if r[2].get("port") != "mlx5_3/1"]
    _, found = fabric_placements(old + new, NAMES)
    assert "mlx5_3/1" not in found["h1"].ports and len(found["h1"].ports) == 7
    assert found["h1"].rails["0000:4c:00.0"] == "rail3"  # its port's peer is no longer known
    # a host that reports (host_info) but no longer has any rail or peer: nothing stale kept
    gone = [(h, n, lab, ts, v) for h, n, lab, ts, v in old] + [
        ("h1", NAMES["labels"], {"driver": "good"}, 300, 1.0)
    ]
    assert fabric_placements(gone, NAMES)[1] == {}


def test_site_file_then_ufm_then_the_neighbours_and_each_says_who_won() -> None:
    site = {"h1": Placement("h1", rack="r1", rails={"0000:18:00.0": "site-rail0"})}
    ufm = {"h1": Placement("h1", switch="leaf-ufm", sources={"switch": "UFM"}),
           "h2": Placement("h2", switch="leaf-ufm-2", sources={"switch": "UFM"})}  # fmt: skip
    rows = [
        ("h1", NAMES["port"], {"port": "mlx5_0/1", "switch": "leaf-lldp", "via": "lldp"}, 5, 1.0),
        ("h1", NAMES["rail"], {"gpu": "0000:18:00.0", "nic": "mlx5_0/1", "rail": "0"}, 5, 1.0),
        ("h1", NAMES["rail"], {"gpu": "0000:2a:00.0", "nic": "mlx5_0/1", "rail": "0"}, 5, 1.0),
        ("h3", NAMES["port"], {"port": "mlx5_0/1", "switch": "leaf-3", "via": "lldp"}, 5, 1.0),
    ]
    _, found = fabric_placements(rows, NAMES)
    merged, conflicts = merge_topology(site, ufm, found)
    h1 = merged["h1"]
    assert (h1.rack, h1.switch) == ("r1", "leaf-ufm")
    assert h1.rails == {"0000:18:00.0": "site-rail0", "0000:2a:00.0": "rail0"}  # its one leaf
    assert h1.ports == {"mlx5_0/1": "leaf-lldp"}
    assert h1.sources == {
        "rack": "site topology",
        "switch": "UFM",
        "rails": "site topology",
        "ports": "lldp",
    }
    assert conflicts == [
        "h1: switch is leaf-ufm as UFM reports it, leaf-lldp as lldp reports it; the UFM wins"
    ]
    assert merged["h2"].switch == "leaf-ufm-2" and merged["h3"].switch == "leaf-3"
    assert merged["h3"].sources["switch"] == "lldp"
    # the site file naming the switch wins over both
    site["h1"] = Placement("h1", rack="r1", switch="leaf-site")
    merged, conflicts = merge_topology(site, ufm, found)
    assert merged["h1"].switch == "leaf-site" and merged["h1"].sources["switch"] == "site topology"
    assert conflicts == [
        "h1: switch is leaf-site in the site topology, leaf-ufm as UFM reports it; "
        "the site topology wins",
        "h1: switch is leaf-site in the site topology, leaf-lldp as lldp reports it; "
        "the site topology wins",
    ]


# IB errors on GPU 3 (rail 3) of five hosts of the first scalable unit, within two hours
RAIL_CASE: dict[str, Any] = {
    "fleet": {"hosts": 64},
    "background": {"clean_jobs": 6},
    "jobs": [
        {
            "id": f"j{i}",
            "hosts": [f"h{h:02d}"],
            "end": 10.0 + i * 0.3,
            "category": "net.ib_error",
            "gpu": 3,
        }
        for i, h in enumerate((0, 3, 5, 9, 12))
    ],
    "now": 40,
}


def test_failures_behind_one_rail_switch_found_only_through_neighbours(api) -> None:  # type: ignore[no-untyped-def]
    view, now = build_view(RAIL_CASE)
    fleet = FleetStore(api.runtime.store.for_leader("acme", None))  # type: ignore[arg-type]

    def ship(peers: bool) -> None:
        ts = at(30 + peers)
        points = [
            metric(
                name.removeprefix("denpex_"),
                value,
                source="agent",
                labels=dict(labels),
                host=host,
                ts_ns=ts,
            )
            for i in range(64)
            for host, name, labels, _ts, value in agent_rows(f"h{i:02d}", i, ts, peers=peers)
        ]
        body = serialise(encode_metrics(points, now_ns=ts), "http/protobuf")
        assert api.post("/v1/metrics", content=body, headers=PROTOBUF).status_code == 200

    def shared(site: dict) -> list[tuple[str, str]]:
        window = FleetWindow("acme", load_fleet_rules(), site)
        window.refresh(fleet, now)
        window.jobs = {j.job: j for j in view.jobs}  # the case's reports and agent events
        window.events = {e.id: e for e in view.host_events}
        window.hosts = dict(view.hosts)
        return [(c.kind, c.component) for c in correlate(window.view(), now, window.config)
                if c.rule == "shared_component"]  # fmt: skip

    # NCCL's rails alone: rail 3 spans all 64 hosts, and five failures on it are no cluster
    ship(peers=False)
    assert shared({}) == []
    # the neighbours say which rail switch each port reaches: one incident, that switch
    ship(peers=True)
    assert shared({}) == [("rail", "su0-rail3")]


def test_a_host_on_one_leaf_keeps_nccls_rails_not_a_second_name_for_its_switch() -> None:
    rows = [
        ("h1", NAMES["port"], {"port": f"mlx5_{g}/1", "switch": "leaf-2", "via": "lldp"}, 5, 1.0)
        for g in range(8)
    ] + [
        (
            "h1",
            NAMES["rail"],
            {"gpu": f"0000:{b}:00.0", "nic": f"mlx5_{g}/1", "rail": str(g)},
            5,
            1.0,
        )
        for g, b in enumerate(GPU_BUSES)
    ]
    _, found = fabric_placements(rows, NAMES)
    assert found["h1"].switch == "leaf-2"
    assert found["h1"].rails["0000:4c:00.0"] == "rail3"
    assert found["h1"].sources["rails"] == "the NCCL topology"


def test_an_agents_real_collectors_place_its_gpus_on_their_rail_switches(api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The whole path: the NCCL topology dump and the ibnetdiscover fixture read by the
    agent's collectors, host_state_metrics, OTLP to the server, the leader's topology."""
    from pathlib import Path

    from denpex.agent.host_state import host_state_metrics
    from denpex.core.collector import CollectContext
    from denpex.fabric.nccl_topo.collector import NcclTopoCollector
    from tests.fabric.neighbours.test_collector import _collector

    neighbours, roots = _collector(tmp_path, ib_tool="ibnetdiscover")
    dump = Path(__file__).parents[1] / "fabric" / "fixtures" / "nccl_topo" / "dgx_h100.xml"
    nccl = NcclTopoCollector(roots, {"dump_files": str(dump)})
    now = at(1)
    for collector in (neighbours, nccl):
        collector.collect(CollectContext(roots, "a06-p1-dgx-02-c01", now_ns=now))
    points = host_state_metrics(
        [nccl, neighbours], roots, tmp_path / "state", "a06-p1-dgx-02-c01", now
    )
    body = serialise(encode_metrics(points, now_ns=now), "http/protobuf")
    assert api.post("/v1/metrics", content=body, headers=PROTOBUF).status_code == 200
    window = FleetWindow("acme", load_fleet_rules(), {})
    window.refresh(FleetStore(api.runtime.store.for_leader("acme", None)), now)  # type: ignore[arg-type]
    place = window.view().topology["a06-p1-dgx-02-c01"]
    assert place.rails == {
        "0000:18:00.0": "A09-P1-IBLEAF-01-02",  # GPU 0 → mlx5_0 (HCA-1) → its rail switch
        "0000:2a:00.0": "A09-P1-IBLEAF-02-02",
        "0000:3a:00.0": "A09-P1-IBLEAF-03-02",
        "0000:5d:00.0": "A09-P1-IBLEAF-04-02",
        "0000:9a:00.0": "ns-2.example.com",  # mlx5_4 is a RoCE port here: its LLDP peer
        "0000:ab:00.0": "rail5",  # mlx5_5 … have no port here: NCCL's rail index
        "0000:ba:00.0": "rail6",
        "0000:db:00.0": "rail7",
    }
    assert place.switch is None and place.ports["mlx5_4/1"] == "ns-2.example.com"  # LLDP
    assert place.sources["rails"] == "the NCCL topology + ibnetdiscover+lldp"
