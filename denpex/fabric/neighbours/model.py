"""The one record every neighbour source yields: a local port and the switch port it is
cabled to. Plain data; never runs a tool."""

from __future__ import annotations

from dataclasses import dataclass

# which tool named a peer, in the order the collector prefers them for one port
SOURCES = ("ibnetdiscover", "iblinkinfo", "lldp")


@dataclass(frozen=True, slots=True)
class PortPeer:
    """`port` is the local RDMA port ("mlx5_0/1"); `switch` the peer's name as the fabric
    knows it (IB node description, LLDP system name), else its id; `switch_id` the peer's
    GUID (IB) or chassis id (LLDP); `switch_port` its port number or name."""

    port: str
    switch: str
    switch_port: str | None
    switch_id: str | None
    via: str  # one of SOURCES

    def labels(self) -> dict[str, str]:
        """The labels of this peer's `host_port_peer` series."""
        out = {"port": self.port, "switch": self.switch, "via": self.via}
        if self.switch_port:
            out["switch_port"] = self.switch_port
        if self.switch_id:
            out["switch_id"] = self.switch_id
        return out
