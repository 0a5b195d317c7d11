"""A site topology file as the Placement records the fleet rules read: which rack, leaf
switch, PDU and pool each host sits in, and the rail of each of its GPUs (by PCI address).

    defaults: {rails: {"0000:18:00.0": rail-0, …}}   # every host's, unless it says otherwise
    hosts:
      node-000: {rack: rack-00, switch: leaf-00, pdu: pdu-00, pool: a}

`merge_topology` joins it with what the agents report of their own placement (UFM's
leaf switch, then the agent's own discovery: fabric_placement.py), each field from the
first source naming it, saying which won and where the others disagree. Pure: parses what
the caller read (YAML or JSON text); never opens a file itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from denpex.control.fleet.model import Placement

_FIELDS = ("rack", "switch", "pdu", "pool", "rails")


def parse_topology(text: str) -> dict[str, Placement]:
    """host → Placement; ValueError naming the first thing that is not of the form above."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"topology: not YAML or JSON: {exc}") from None
    if not isinstance(data, Mapping) or set(data) - {"defaults", "hosts"}:
        raise ValueError("topology: a mapping with 'hosts' (and optionally 'defaults')")
    defaults = _entry("defaults", data.get("defaults") or {})
    hosts = data.get("hosts") or {}
    if not isinstance(hosts, Mapping):
        raise ValueError("topology: 'hosts' maps host names to their placement")
    out = {}
    for host, entry in hosts.items():
        fields = {**defaults, **_entry(f"hosts.{host}", entry or {})}
        out[str(host)] = Placement(host=str(host), **fields)
    return out


def _entry(where: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, Mapping) or set(entry) - set(_FIELDS):
        raise ValueError(f"topology: {where} takes only {', '.join(_FIELDS)}")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "rails":
            if not isinstance(value, Mapping):
                raise ValueError(f"topology: {where}.rails maps PCI addresses to rails")
            out["rails"] = {str(pci): str(rail) for pci, rail in value.items()}
        elif value is not None:
            out[key] = str(value)
    return out


SITE = "site topology"
SCALARS = ("rack", "switch", "pdu", "pool")


def merge_topology(
    site: Mapping[str, Placement], *reported: Mapping[str, Placement]
) -> tuple[dict[str, Placement], list[str]]:
    """The topology the rules read: each host's placement from the site file, its gaps
    filled from what the host's agent reported, in the order given (UFM's leaf switch
    before the neighbours the agent found with ibnetdiscover or LLDP). Each field comes
    from the first source that names it, and `sources` says which; where a later source
    disagrees a line says so and who won (a recabled host, or a stale site file). Rails
    and ports merge per GPU and per port, the earlier source winning each."""
    layers = [(site, SITE), *((r, "") for r in reported)]
    merged: dict[str, Placement] = {}
    conflicts: list[str] = []
    hosts = sorted(set().union(*(set(layer) for layer, _ in layers)))
    for host in hosts:
        mine = [(p, name or _source_of(p)) for layer, name in layers if (p := layer.get(host))]
        fields: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name in SCALARS:
            said = [(getattr(p, name), source) for p, source in mine if getattr(p, name)]
            if not said:
                continue
            (value, winner), rest = said[0], said[1:]
            fields[name], sources[name] = value, _field_source(mine, winner, name)
            for other, source in rest:
                if other != value:
                    conflicts.append(
                        f"{host}: {name} is {value} {_as(winner)}, {other} {_as(source)}; "
                        f"the {winner} wins"
                    )
        for name in ("rails", "ports"):
            value = {}
            for p, _source in reversed(mine):
                value.update(getattr(p, name))
            if value:
                fields[name] = value
                sources[name] = next(p.sources.get(name, s) for p, s in mine if getattr(p, name))
        merged[host] = Placement(host=host, **fields, sources=sources)
    return merged, conflicts


def _source_of(place: Placement) -> str:
    """The name of an agent-reported placement's source (what its `sources` says most)."""
    return next(iter(place.sources.values()), "its agent")


def _field_source(mine: list[tuple[Placement, str]], winner: str, name: str) -> str:
    for place, source in mine:
        if source == winner:
            return place.sources.get(name, source)
    return winner


def _as(source: str) -> str:
    return "in the site topology" if source == SITE else f"as {source} reports it"
