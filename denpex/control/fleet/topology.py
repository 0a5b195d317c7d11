"""A site topology file as the Placement records the fleet rules read: which rack, leaf
switch, PDU and pool each host sits in, and the rail of each of its GPUs (by PCI address).

    defaults: {rails: {"0000:18:00.0": rail-0, …}}   # every host's, unless it says otherwise
    hosts:
      node-000: {rack: rack-00, switch: leaf-00, pdu: pdu-00, pool: a}

Pure: parses what the caller read (YAML or JSON text); never opens a file itself.
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
