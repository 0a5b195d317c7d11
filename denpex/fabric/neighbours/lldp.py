"""Parse lldpd's neighbour table as `lldpcli -f json0 show neighbors` prints it (every value
a list, one shape however many neighbours), and the `-f json` form too, whose shape changes
with the count (one interface: an object; several: a list of one-key objects) and with
whether the chassis has a name. Pure: text in, neighbours out; never runs lldpcli.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LldpNeighbour:
    interface: str  # the local netdev the neighbour was heard on
    chassis_name: str | None  # SysName
    chassis_id: str | None  # ChassisID value (a MAC, usually)
    port_id: str | None  # PortID value: the switch's interface name when its type is ifname
    port_id_type: str | None  # ifname, local, mac …
    port_descr: str | None
    via: str  # LLDP, CDPv2, EDP … (lldpd speaks several)


def _first(value: Any) -> Any:
    """json0 wraps every value in a list; the json form does not."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _text(value: Any) -> str | None:
    value = _first(value)
    if isinstance(value, Mapping):
        value = value.get("value")
    return None if value in (None, "") else str(value)


def parse_lldp_neighbors(text: str) -> list[LldpNeighbour]:
    """Every neighbour in lldpcli's JSON (json0 or json); ValueError when the text is not
    lldpcli's JSON."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"lldpcli: not JSON: {exc}") from None
    if not isinstance(data, Mapping) or "lldp" not in data:
        raise ValueError("lldpcli: JSON without the top-level 'lldp' key")
    lldp = _first(data["lldp"]) or {}
    if not isinstance(lldp, Mapping):
        raise ValueError("lldpcli: 'lldp' is neither an object nor a list of one")
    out = []
    for name, entry in _interfaces(lldp.get("interface")):
        out.append(_neighbour(name, entry))
    return out


def _interfaces(value: Any) -> list[tuple[str, Mapping[str, Any]]]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    found: list[tuple[str, Mapping[str, Any]]] = []
    for item in items:
        if not isinstance(item, Mapping):
            raise ValueError("lldpcli: an interface entry is not an object")
        if "name" in item and not isinstance(item["name"], Mapping):  # json0: named inline
            found.append((str(_first(item["name"])), item))
            continue
        for name, entry in item.items():  # json: {"eth0": {…}}
            if isinstance(entry, Mapping):
                found.append((str(name), entry))
    return found


def _neighbour(interface: str, entry: Mapping[str, Any]) -> LldpNeighbour:
    chassis = _first(entry.get("chassis")) or {}
    name = _text(chassis.get("name"))
    if name is None and "id" not in chassis and len(chassis) == 1:
        # the json form keys a named chassis by its name: {"chassis": {"sw1": {"id": …}}}
        name, chassis = next(iter(chassis.items()))
    port = _first(entry.get("port")) or {}
    port_id = _first(port.get("id"))
    return LldpNeighbour(
        interface=interface,
        chassis_name=name,
        chassis_id=_text(chassis.get("id")) if isinstance(chassis, Mapping) else None,
        port_id=_text(port_id),
        port_id_type=str(port_id.get("type")) if isinstance(port_id, Mapping) else None,
        port_descr=_text(port.get("descr")),
        via=str(_first(entry.get("via")) or "LLDP"),
    )


def switch_port(neighbour: LldpNeighbour) -> str | None:
    """The switch's name for the port: its PortID when that is an interface name, else its
    description (a PortID that is a MAC names no port a switch operator would know)."""
    if neighbour.port_id and neighbour.port_id_type in ("ifname", "local", None):
        return neighbour.port_id
    return neighbour.port_descr or neighbour.port_id
