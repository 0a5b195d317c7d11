"""The `neighbours` collector: which switch port each of this host's RDMA ports is cabled
to. InfiniBand ports from `iblinkinfo` (a partial scan of this host's own node per port:
cheap enough for every host) or `ibnetdiscover` (a sweep of the whole subnet: peers named
by GUID where switches carry only their model's default description), as `ib_tool` says,
matched to this host by its HCAs' node and port GUIDs in sysfs; RoCE/Ethernet ports from lldpd's
`lldpcli -f json0 show neighbors`, matched by netdev. The control plane reads the result
(`host_port_peer`) to know each host's leaf switch per port without UFM.

Runs only read-only discovery tools, each under a timeout and rarely; never changes a
port or the fabric.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.roots import Roots, read_text
from denpex.fabric.base import FabricCollector
from denpex.fabric.ib.ports import rdma_ports
from denpex.fabric.neighbours.ibdiags import (
    IbLink,
    parse_iblinkinfo,
    parse_ibnetdiscover,
    switch_name,
)
from denpex.fabric.neighbours.lldp import LldpNeighbour, parse_lldp_neighbors, switch_port
from denpex.fabric.neighbours.model import SOURCES, PortPeer
from denpex.fabric.roce.collector import port_netdev
from denpex.fabric.ufm.collector import normalise_guid

IB_TOOLS: dict[str, tuple[str, Callable[[str], list[IbLink]]]] = {
    "ibnetdiscover": ("ibnetdiscover_command", parse_ibnetdiscover),
    "iblinkinfo": ("iblinkinfo_command", parse_iblinkinfo),
}
HELP = {
    "fabric_neighbours": "This host's RDMA ports whose peer switch port is known (label via)",
    "fabric_neighbour_tool_failures_total": "Neighbour tool runs that failed (label tool)",
}


class LocalPort:
    """One RDMA port of this host as sysfs describes it."""

    __slots__ = ("device", "link_layer", "netdev", "node_guid", "port", "port_guid")

    def __init__(self, device: str, port: str, folder: Path) -> None:
        self.device, self.port = device, port
        self.link_layer = (read_text(folder / "link_layer") or "").strip() or "InfiniBand"
        device_folder = folder.parent.parent
        self.node_guid = normalise_guid(read_text(device_folder / "node_guid") or "") or None
        gid = normalise_guid(read_text(folder / "gids" / "0") or "")[-16:]
        self.port_guid = gid if len(gid) == 16 and gid.strip("0") else None
        self.netdev = port_netdev(folder, device_folder) if self.link_layer == "Ethernet" else None

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"


def local_ports(roots: Roots) -> list[LocalPort]:
    return [LocalPort(d, p, f) for d, p, f in rdma_ports(roots)]


def ib_peers(links: list[IbLink], ports: list[LocalPort], via: str) -> list[PortPeer]:
    """The peers of this host's InfiniBand ports among a fabric's links: a link from one of
    its HCAs (node GUID and port number, or port GUID), else a switch's link to it."""
    by_node: dict[tuple[str | None, str], LocalPort] = {
        (p.node_guid, p.port): p for p in ports if p.node_guid
    }
    by_port_guid = {p.port_guid: p for p in ports if p.port_guid}
    found: dict[str, PortPeer] = {}
    for link in links:
        mine = by_node.get((link.node_guid, str(link.port))) if link.node_type != "Switch" else None
        if mine is None and link.port_guid and link.node_type != "Switch":
            mine = by_port_guid.get(link.port_guid)
        name = switch_name(link.peer_desc, link.peer_guid)
        if mine is None or mine.link_layer != "InfiniBand" or not name:
            continue
        found[mine.key] = PortPeer(
            port=mine.key,
            switch=name,
            switch_port=str(link.peer_port),
            switch_id=link.peer_guid,
            via=via,
        )
    return [found[k] for k in sorted(found)]


def lldp_peers(neighbours: list[LldpNeighbour], ports: list[LocalPort]) -> list[PortPeer]:
    """The peers of this host's RoCE ports among lldpd's neighbours, by netdev."""
    by_netdev = {p.netdev: p for p in ports if p.netdev}
    found: dict[str, PortPeer] = {}
    for neighbour in neighbours:
        mine = by_netdev.get(neighbour.interface)
        name = neighbour.chassis_name or neighbour.chassis_id
        if mine is None or not name:
            continue
        found[mine.key] = PortPeer(
            port=mine.key,
            switch=name,
            switch_port=switch_port(neighbour),
            switch_id=neighbour.chassis_id,
            via="lldp",
        )
    return [found[k] for k in sorted(found)]


class NeighboursCollector(FabricCollector):
    name = "neighbours"
    stability = "experimental"
    default_interval_s = 900.0  # cabling changes rarely; a sweep costs the subnet SMPs
    default_budget_s = 90.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self.peers: list[PortPeer] = []
        self.failures: dict[str, int] = {}
        self._blind: str | None = None

    def _command(self, option: str) -> list[str]:
        value = self.options.get(option) or []
        return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]

    def _found(self, command: list[str]) -> bool:
        program = command[0] if command else ""
        return bool(program) and (shutil.which(program) is not None or Path(program).is_file())

    def _ib_tool(self) -> str | None:
        tool = str(self.options.get("ib_tool") or "none")
        if tool not in (*IB_TOOLS, "none"):
            raise ValueError(f"ib_tool is {tool!r}: one of ibnetdiscover, iblinkinfo, none")
        return None if tool == "none" else tool

    def available(self) -> tuple[bool, str]:
        try:
            tool = self._ib_tool()
        except ValueError as exc:
            return False, str(exc)
        ports = local_ports(self.roots)
        base = self.roots.sys("class", "infiniband")
        if not ports:
            return False, f"no RDMA ports under {base} (no InfiniBand/RoCE device or driver)"
        ib = [p for p in ports if p.link_layer == "InfiniBand"]
        roce = [p for p in ports if p.link_layer == "Ethernet"]
        said, blind = [], []
        if ib:
            command = self._command(IB_TOOLS[tool][0]) if tool else []
            if tool is None:
                blind.append(f"{len(ib)} InfiniBand port(s): ib_tool is none")
            elif not self._found(command):
                blind.append(
                    f"{len(ib)} InfiniBand port(s): `{command[0] if command else tool}` not "
                    "found (install infiniband-diags or set "
                    f"collectors.neighbours.{IB_TOOLS[tool][0]})"
                )
            else:
                said.append(f"{len(ib)} InfiniBand port(s) by {tool}")
        if roce:
            command = self._command("lldpcli_command")
            if not self._found(command):
                blind.append(
                    f"{len(roce)} RoCE port(s): `{command[0] if command else 'lldpcli'}` not "
                    "found (install and run lldpd, or set collectors.neighbours.lldpcli_command)"
                )
            else:
                said.append(f"{len(roce)} RoCE port(s) by lldpcli")
        if not said:
            return False, "no neighbour tool for any port: " + "; ".join(blind)
        return True, "peers of " + ", ".join(said) + (
            "; blind: " + "; ".join(blind) if blind else ""
        )

    def degraded(self) -> str | None:
        return self._blind

    def _run(self, tool: str, command: list[str]) -> str | None:
        """The tool's output, or None (and a failure counted and said) when it failed. A
        tool past its timeout is killed with its whole process group (a wrapper script's
        children too), so a hung sweep never outlives the poll."""
        timeout = float(self.options["timeout_s"])
        try:
            child = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        except OSError as exc:
            self._failed(tool, f"cannot run {command[0]}: {exc.strerror}")
            return None
        try:
            stdout, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            self._failed(tool, f"timed out after {timeout:g} s")
            return None
        if child.returncode != 0:
            self._failed(tool, f"exit {child.returncode}: {stderr.strip()[:200]}")
            return None
        return stdout

    def _failed(self, tool: str, why: str) -> None:
        self.failures[tool] = self.failures.get(tool, 0) + 1
        self._blind = f"neighbours: {tool} {why}"

    def _ib_outputs(self, tool: str, command: list[str], ports: list[LocalPort]) -> list[str]:
        """The tool's output: one `ibnetdiscover` sweep of the subnet, or one `iblinkinfo`
        partial scan per port, of this host's own node only (`-C dev -P port -G guid`: a
        few SMPs, where a sweep sends one per node and port of the fabric)."""
        if tool == "ibnetdiscover":
            text = self._run(tool, command)
            return [] if text is None else [text]
        out = []
        for port in ports:
            if port.port_guid is None:
                continue
            args = ["-C", port.device, "-P", port.port, "-G", f"0x{port.port_guid}"]
            text = self._run(tool, [*command, *args])
            if text is not None:
                out.append(text)
        return out

    def collect(self, ctx: CollectContext) -> list[Observation]:
        ports = local_ports(ctx.roots)
        self._blind = None
        peers: dict[str, PortPeer] = {}
        tool = self._ib_tool()
        ib = [p for p in ports if p.link_layer == "InfiniBand"]
        command = self._command(IB_TOOLS[tool][0]) if tool else []
        if tool and ib and self._found(command):
            for text in self._ib_outputs(tool, command, ib):
                try:
                    links = IB_TOOLS[tool][1](text)
                except ValueError as exc:
                    self._blind = f"neighbours: {tool}: {exc}"
                    continue
                peers.update((p.port, p) for p in ib_peers(links, ports, tool))
        if any(p.link_layer == "Ethernet" for p in ports):
            command = self._command("lldpcli_command")
            if self._found(command):
                answer = self._run("lldp", [*command, "-f", "json0", "show", "neighbors"])
                if answer is not None:
                    try:
                        heard = parse_lldp_neighbors(answer)
                    except ValueError as exc:
                        self._blind = f"neighbours: {exc}"
                        heard = []
                    for peer in lldp_peers(heard, ports):
                        peers.setdefault(peer.port, peer)
        self.peers = [peers[k] for k in sorted(peers)]
        out: list[Observation] = []
        for via in SOURCES:
            count = sum(1 for p in self.peers if p.via == via)
            if count:
                out.append(self.metric_event(ctx, "fabric_neighbours", count, {"via": via}))
        for name, count in sorted(self.failures.items()):
            out.append(
                self.metric_event(
                    ctx, "fabric_neighbour_tool_failures_total", count, {"tool": name}, counter=True
                )
            )
        return out

    def host_links(self) -> list[tuple[str, Mapping[str, str]]]:
        """The peer switch port of each port the last poll found one for."""
        return [("port", peer.labels()) for peer in self.peers]
