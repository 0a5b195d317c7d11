"""`bench_fleet.py --fabric agents`: the simulated fleet's topology as the agents would
report it instead of a site file naming every switch. Each host's eight compute NIC ports
are cabled to its leaf switch (what `ibnetdiscover` would find: `host_port_peer`) and its
GPUs sit on NCCL's rails 0-7 (`host_rail`); the site file keeps only what no agent can see
(rack, PDU). The leader merges them as in production (site file > UFM > discovery)."""

from __future__ import annotations

from dataclasses import replace

from fleet_records import GPU_BUSES

from denpex.control.fleet.fabric_placement import fabric_placements
from denpex.control.fleet.model import Placement
from denpex.control.fleet.topology import merge_topology
from denpex.core.events import Event, metric

NAMES = {
    "labels": "denpex_host_info",
    "placement": "denpex_host_placement",
    "rail": "denpex_host_rail",
    "port": "denpex_host_port_peer",
}


def site_without_fabric(site: dict[str, Placement]) -> dict[str, Placement]:
    """The site file a site keeps when its agents report the fabric: racks and PDUs."""
    return {h: replace(p, switch=None, rails={}) for h, p in site.items()}


def fabric_rows(site: dict[str, Placement], host: str) -> list[tuple[str, dict[str, str]]]:
    """(agent metric, labels) of one host's fabric report."""
    rows: list[tuple[str, dict[str, str]]] = []
    leaf = site[host].switch or ""
    for g, bus in enumerate(GPU_BUSES):
        nic = f"mlx5_{g}/1"
        rows.append(("host_rail", {"gpu": f"0000:{bus}:00.0", "nic": nic, "rail": str(g)}))
        rows.append(
            (
                "host_port_peer",
                {"port": nic, "switch": leaf, "switch_port": str(g + 1), "via": "ibnetdiscover"},
            )
        )
    return rows


def fabric_events(site: dict[str, Placement], host: str, ts_ns: int) -> list[Event]:
    """The same report as the agent's OTLP metric events (bench_fleet --server)."""
    return [
        metric(name, 1, source="agent", labels=labels, host=host, ts_ns=ts_ns)
        for name, labels in fabric_rows(site, host)
    ]


def agents_topology(site: dict[str, Placement]) -> tuple[dict[str, Placement], list[str]]:
    """What the leader's topology becomes from the reduced site file and the agents'
    reports, through the production merge."""
    points = [
        (host, "denpex_" + name, labels, 1, 1.0)
        for host in sorted(site)
        for name, labels in fabric_rows(site, host)
    ]
    ufm, found = fabric_placements(points, NAMES)
    return merge_topology(site_without_fabric(site), ufm, found)
