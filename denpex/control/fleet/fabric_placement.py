"""What the agents report of where their host sits in the fabric, as two Placement layers
for merge_topology: UFM's (the leaf switch its HCAs reach, `host_placement`) and the
agent's own discovery (each GPU's NIC port and rail from the NCCL topology, `host_rail`;
each port's peer switch from ibnetdiscover / iblinkinfo / LLDP, `host_port_peer`).

A GPU's rail is the switch its NIC port is cabled to where the neighbours know it and it is
not the host's one leaf switch (on a rail-optimised fabric: the rail switch), else NCCL's
rail index ("rail3"): a fabric whose hosts hang off one leaf each has no rail component
apart from that switch. Pure: the
store's newest points in, placements out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from denpex.control.fleet.model import Placement

Point = tuple[str, str, Mapping[str, object], int, float]  # host, name, labels, ts_ns, value
UFM = "UFM"
NCCL = "the NCCL topology"


def _snapshot(points: list[Point], since_ns: int) -> list[Mapping[str, object]]:
    """The labels of one host's newest snapshot of a per-GPU / per-port series: the points
    of its newest stamp (the agent stamps all rows of one report alike), none older than
    `since_ns` (rows of a port or GPU that stopped being reported are gone)."""
    newest = max((ts for *_, ts, _ in points), default=-1)
    if newest < since_ns:
        return []
    return [labels for _, _, labels, ts, _ in points if ts == newest]


def fabric_placements(
    points: Iterable[Point], names: Mapping[str, str]
) -> tuple[dict[str, Placement], dict[str, Placement]]:
    """(UFM's, the agent's discovery) placement of each host that reported one. `names`
    maps placement / rail / port / labels to the metric names (rules.yaml host_state)."""
    by: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for point in points:
        by[(point[0], point[1])].append(point)
    ufm: dict[str, Placement] = {}
    found: dict[str, Placement] = {}
    hosts = {host for host, _ in by}
    for host in sorted(hosts):
        info = by.get((host, names["labels"]), [])
        since = max((ts for *_, ts, _ in info), default=-1)  # the host's newest report
        placement = by.get((host, names["placement"]))
        if placement:
            labels = max(placement, key=lambda p: p[3])[2]
            known = {k: str(labels[k]) for k in ("rack", "switch", "pdu", "pool") if labels.get(k)}
            if known:
                ufm[host] = Placement(
                    host,
                    rack=known.get("rack"),
                    switch=known.get("switch"),
                    pdu=known.get("pdu"),
                    pool=known.get("pool"),
                    sources=dict.fromkeys(known, UFM),
                )
        ports = _snapshot(by.get((host, names["port"]), []), since)
        rails = _snapshot(by.get((host, names["rail"]), []), since)
        place = _discovered(host, ports, rails)
        if place is not None:
            found[host] = place
    return ufm, found


def _discovered(
    host: str, ports: list[Mapping[str, object]], rails: list[Mapping[str, object]]
) -> Placement | None:
    peers = {str(p["port"]): str(p["switch"]) for p in ports if p.get("port") and p.get("switch")}
    via = "+".join(sorted({str(p.get("via") or "neighbours") for p in ports}))
    sources: dict[str, str] = {}
    switch = None
    if peers:
        sources["ports"] = via
        # the host's leaf switch: the one most of its ports reach, when it is most of them
        # (a rail-optimised host reaches one switch per rail and has no single leaf)
        top, count = Counter(peers.values()).most_common(1)[0]
        if count * 2 > len(peers):
            switch, sources["switch"] = top, via
    gpu_rails: dict[str, str] = {}
    by_switch = 0
    for row in rails:
        gpu, nic, rail = row.get("gpu"), str(row.get("nic") or ""), row.get("rail")
        if not gpu:
            continue
        peer = peers.get(nic)
        if peer is not None and peer != switch:  # a rail switch, not the host's one leaf
            gpu_rails[str(gpu)] = peer
            by_switch += 1
        elif rail not in (None, ""):
            gpu_rails[str(gpu)] = f"rail{rail}"
    if not peers and not gpu_rails:
        return None
    if gpu_rails:
        sources["rails"] = f"{NCCL} + {via}" if by_switch else NCCL
    return Placement(host, switch=switch, rails=gpu_rails, ports=peers, sources=sources)
