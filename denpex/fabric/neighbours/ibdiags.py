"""Parse what infiniband-diags prints of the fabric's links: the topology file of
`ibnetdiscover` and the link list of `iblinkinfo` (default and `--line` forms). Pure
functions of the tools' text, tested on their real output; never runs a tool.

    Ca	1 "H-e09d730300857d78"		# "a06-p1-dgx-02-c01 HCA-6"
    [1](e09d730300857d78) 	"S-2c5eab0300b87bc0"[1]		# lid 522 lmc 0 "MF0;…:MQM9701/U1" lid 159 4xNDR

    CA: centos-data-200 HCA-1:
        0x0002c903000d81f9      4    1[  ] ==( 4X  10.0 Gbps Active/ LinkUp)==>  2    3[  ] "…" ( )

Written by hand: no library parses these formats (infiniband-diags itself only writes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `Switch 65 "S-2c5e…"	# "MF0;…" enhanced port 0 lid 73 lmc 0` (ibnetdiscover.c, out_node)
_ND_NODE = re.compile(r'^(Switch|Ca|Rtr)\s+(\d+)\s+"([SHR])-([0-9a-fA-F]+)"\s*(?:#\s*"([^"]*)")?')
# `[port](port guid) "X-peer guid"[peer port](peer port guid)	# … "peer description" …`
_ND_LINK = re.compile(
    r'^\[(\d+)\](?:\(([0-9a-fA-F]+)\))?\s*"([SHR])-([0-9a-fA-F]+)"\[(\d+)\]'
    r"(?:\(([0-9a-fA-F]+)\))?\s*(?:#(.*))?$"
)
_QUOTED = re.compile(r'"([^"]*)"')
_ND_TYPES = {"S": "Switch", "H": "Ca", "R": "Rtr"}
# `CA: centos-data-200 HCA-1:` / `Switch: 0x0002c9020046c588 Infiniscale-IV …:`
_LI_NODE = re.compile(r"^(CA|Switch|Router):\s+(?:(0x[0-9a-fA-F]+)\s+)?(.*?):?\s*$")
# `[guid ["desc"]] lid port[ ] ==( width speed state/ phys)==> [peer guid] lid port[ ] "desc"`
_LI_LINK = re.compile(
    r'^\s*(?:(0x[0-9a-fA-F]+)\s+)?(?:"([^"]*)"\s+)?(\d+)\s+(\d+)\[[^\]]*\]\s+==\(\s*(.*?)\)==>'
    r'\s*(?:(0x[0-9a-fA-F]+)\s+)?(?:(\d+)\s+(\d+)\[[^\]]*\]\s+"([^"]*)")?'
)
# A managed Mellanox/NVIDIA switch describes itself "MF0;<system name>:<model>/<unit>"
_MANAGED = re.compile(r"^MF0;([^:]+):")
# switches never given a name all carry their model's default description, so a GUID is
# then the only name that tells two of them apart
_DEFAULT_DESCRIPTIONS = ("Mellanox Technologies", "SwitchX", "Infiniscale", "Quantum")


@dataclass(frozen=True, slots=True)
class IbLink:
    """One cabled, active port as a tool printed it. GUIDs are 16 lowercase hex digits."""

    node_type: str | None  # Switch | Ca | Rtr; None where the tool does not say
    node_guid: str | None
    node_desc: str
    port: int
    port_guid: str | None
    peer_type: str | None
    peer_guid: str | None
    peer_port: int
    peer_desc: str


def _guid(text: str | None) -> str | None:
    if not text:
        return None
    value = text.lower().removeprefix("0x")
    return value.rjust(16, "0")


def switch_name(description: str, guid: str | None) -> str:
    """The name a switch goes by in the fleet's topology: the system name of a managed
    switch ("MF0;leaf-04:MQM9701/U1" → "leaf-04"), its GUID where its description is a
    model's default, else its description; "" when only a default description is known
    (it would name every such switch alike, merging them into one component)."""
    managed = _MANAGED.match(description)
    if managed:
        return managed.group(1)
    if not description or any(d in description for d in _DEFAULT_DESCRIPTIONS):
        return guid or ""
    return description


def parse_ibnetdiscover(text: str) -> list[IbLink]:
    """Every link of an `ibnetdiscover` topology file, from each node's side (a link between
    two nodes appears twice). ValueError when the text holds no node at all."""
    out: list[IbLink] = []
    node: tuple[str, str, str] | None = None
    seen_node = False
    for line in text.splitlines():
        line = line.strip()
        match = _ND_NODE.match(line)
        if match:
            kind, _ports, _letter, guid, desc = match.groups()
            node = (kind, _guid(guid) or "", desc or "")
            seen_node = True
            continue
        if node is None or not line.startswith("["):
            continue
        link = _ND_LINK.match(line)
        if link is None:
            continue
        # the peer's port GUID (group 6) is said again by the peer's own side of the link
        port, port_guid, letter, peer_guid, peer_port, _peer_port_guid, comment = link.groups()
        descs = _QUOTED.findall(comment or "")
        out.append(
            IbLink(
                node_type=node[0],
                node_guid=node[1],
                node_desc=node[2],
                port=int(port),
                port_guid=_guid(port_guid),
                peer_type=_ND_TYPES[letter],
                peer_guid=_guid(peer_guid),
                peer_port=int(peer_port),
                peer_desc=descs[0] if descs else "",
            )
        )
    if not seen_node and text.strip():
        raise ValueError("not ibnetdiscover output: no 'Switch', 'Ca' or 'Rtr' node line")
    return out


def parse_iblinkinfo(text: str) -> list[IbLink]:
    """Every active link `iblinkinfo` printed (ports that are down have no peer and are
    left out). ValueError when no line has the link form."""
    out: list[IbLink] = []
    node_type: str | None = None
    node_guid: str | None = None
    node_desc = ""
    seen_link = False
    for line in text.splitlines():
        if not line.strip():
            continue
        header = _LI_NODE.match(line.strip())
        if header and "==(" not in line:
            kind, guid, desc = header.groups()
            node_type = {"CA": "Ca", "Router": "Rtr"}.get(kind, kind)
            node_guid, node_desc = _guid(guid), desc
            continue
        link = _LI_LINK.match(line)
        if link is None:
            continue
        seen_link = True
        guid, desc, _lid, port, state, peer_guid, _peer_lid, peer_port, peer_desc = link.groups()
        if peer_port is None or "LinkUp" not in state:
            continue
        # a CA's lines start with its port GUID; a switch's with nothing (or, with --line,
        # the node GUID, which a switch shares with its port 0)
        is_ca = node_type == "Ca"
        out.append(
            IbLink(
                node_type=node_type,
                node_guid=node_guid if node_guid else (None if is_ca else _guid(guid)),
                node_desc=desc.strip() if desc is not None else node_desc,
                port=int(port),
                port_guid=_guid(guid) if (is_ca or node_type is None) else None,
                peer_type=None,
                peer_guid=_guid(peer_guid),
                peer_port=int(peer_port),
                peer_desc=peer_desc or "",
            )
        )
    if not seen_link and text.strip():
        raise ValueError("not iblinkinfo output: no '… ==( … )==> …' link line")
    return out
