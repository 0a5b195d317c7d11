"""A site topology file as the Placement records the fleet rules read: which rack, leaf
switch, PDU and pool each host sits in, and the rail of each of its GPUs (by PCI address).

    defaults: {rails: {"0000:18:00.0": rail-0, …}}   # every host's, unless it says otherwise
    hosts:
      node-000: {rack: rack-00, switch: leaf-00, pdu: pdu-00, pool: a}

`merge_topology` joins it with what the agents report of their own placement (the site
file wins on conflict, and says so). Pure: parses what the caller read (YAML or JSON
text); never opens a file itself.
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


def merge_topology(
    site: Mapping[str, Placement], agents: Mapping[str, Placement]
) -> tuple[dict[str, Placement], list[str]]:
    """The topology the rules read: each host's placement from the site file, its gaps
    filled from what the host's agent reported (its fabric: the leaf switch UFM sees its
    HCAs reach). Where both name a field and disagree the site file wins, and a line for
    each such conflict says so (a recabled host, or a stale site file)."""
    merged: dict[str, Placement] = {}
    conflicts: list[str] = []
    for host in sorted(set(site) | set(agents)):
        mine, seen = site.get(host), agents.get(host)
        if mine is None or seen is None:
            merged[host] = mine or seen  # type: ignore[assignment]
            continue
        fields: dict[str, Any] = {}
        for name in ("rack", "switch", "pdu", "pool"):
            ours, theirs = getattr(mine, name), getattr(seen, name)
            fields[name] = ours or theirs
            if ours and theirs and ours != theirs:
                conflicts.append(
                    f"{host}: {name} is {ours} in the site topology, {theirs} as its agent "
                    f"reports it; the site topology wins"
                )
        fields["rails"] = {**seen.rails, **mine.rails}
        merged[host] = Placement(host=host, **fields)
    return merged, conflicts
