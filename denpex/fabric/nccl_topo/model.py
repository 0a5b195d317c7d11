"""The NCCL topology model: parse the XML NCCL writes with NCCL_TOPO_DUMP_FILE (CPUs, PCI
switches and the links between them, GPUs with their NVLinks and C2C link, NICs with their
net ports, rails and planes) and write it back as a stable, diffable golden profile. Pure:
text in, values out; never opens a file.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field

# Per-link NVLink bandwidth NCCL assumes, GB/s, by GPU generation (src/graph/topo.h,
# ncclTopoNVLinkBw): SM86 (A40, A10, RTX A6000) is its own case, the rest by minimum SM
NVLINK_GB_S_EXACT_SM = {86: 12.0}
NVLINK_GB_S_BY_SM = ((100, 40.1), (90, 20.6), (80, 20.0), (70, 20.0), (60, 18.0))
NVSWITCH_CLASS = "0x068000"
# the target NCCL writes when NVML cannot name the NVLink's remote end (NVSwitches hidden
# from a VM): it assumes an NVSwitch and merges all such links into one <nvlink>
HIDDEN_NVSWITCH = "fffffff:ffff:ff"
MAX_XML_BYTES = 16 << 20
PCI_ATTRS = (
    "busid",
    "class",
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "link_speed",
    "link_width",
)
CPU_ATTRS = ("numaid", "affinity", "arch", "vendor", "familyid", "modelid")
_BUSID = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class TopologyError(ValueError):
    """The text is not an NCCL topology: says what is wrong and where."""


@dataclass(frozen=True, slots=True)
class NvLink:
    target: str  # bus id of the peer GPU, NVSwitch or CPU
    count: int
    tclass: str  # PCI class of the target: 0x068000 NVSwitch, 0x030200 GPU, 0x060400 CPU

    @property
    def to_nvswitch(self) -> bool:
        return self.tclass.lower() == NVSWITCH_CLASS or self.target == HIDDEN_NVSWITCH

    @property
    def hidden(self) -> bool:
        return self.target == HIDDEN_NVSWITCH

    def bandwidth_gb_s(self, sm: int | None) -> float | None:
        """Bandwidth of these links as NCCL rates them (count x per-link GB/s of the SM)."""
        if sm is None:
            return None
        per_link = NVLINK_GB_S_EXACT_SM.get(sm) or next(
            (bw for min_sm, bw in NVLINK_GB_S_BY_SM if sm >= min_sm), None
        )
        return None if per_link is None else round(self.count * per_link, 1)


@dataclass(frozen=True, slots=True)
class C2c:
    """A GPU's chip-to-chip link to its CPU (Grace Hopper/Blackwell NVLink-C2C): NCCL reads
    `<c2c count bw>` with bw in MB/s per link."""

    count: int
    bw_mb_s: int

    @property
    def bandwidth_gb_s(self) -> float:
        return round(self.count * self.bw_mb_s / 1000.0, 1)


@dataclass(frozen=True, slots=True)
class Gpu:
    dev: int | None = None
    rank: int | None = None
    sm: int | None = None
    gdr: bool | None = None
    nvlinks: tuple[NvLink, ...] = ()
    c2c: C2c | None = None


@dataclass(frozen=True, slots=True)
class Net:
    name: str
    dev: int | None = None
    speed_mbps: int | None = None
    port: int | None = None
    guid: str | None = None
    gdr: bool | None = None
    rail: int | None = None  # the rail (and plane) the port is cabled to, where NCCL knows
    plane: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.port is None else f"{self.name}:{self.port}"


@dataclass(frozen=True, slots=True)
class Pci:
    """A PCI node: a switch (its upstream port) with children, or an endpoint holding a GPU
    or a NIC. `attrs` keeps the NCCL attributes by name (class, vendor, link_speed, …)."""

    busid: str
    attrs: tuple[tuple[str, str], ...] = ()
    children: tuple[Pci, ...] = ()
    gpu: Gpu | None = None
    nets: tuple[Net, ...] = ()
    pcilinks: tuple[str, ...] = ()  # bus ids of PCI switches this one links to directly

    def attr(self, name: str) -> str | None:
        return dict(self.attrs).get(name)


@dataclass(frozen=True, slots=True)
class Cpu:
    numaid: str
    attrs: tuple[tuple[str, str], ...] = ()
    children: tuple[Pci, ...] = ()
    nets: tuple[Net, ...] = ()  # NICs NCCL found no PCI path for (virtual, sockets)


@dataclass(frozen=True, slots=True)
class Placed:
    """A GPU or net port with where it sits: `chain` names its ancestors from the CPU down
    ("cpu 0", "pci 0000:15:00.0", …), `node` is the device itself ("gpu 0000:1b:00.0")."""

    key: str  # identity across snapshots: GPU bus id, NIC "busid port" (or name)
    chain: tuple[str, ...]
    node: str
    pci: Pci | None
    gpu: Gpu | None = None
    net: Net | None = None

    @property
    def path(self) -> str:
        return " / ".join((*self.chain, self.node))


@dataclass(frozen=True, slots=True)
class Topology:
    cpus: tuple[Cpu, ...]
    version: str = "1"
    source: str = "nccl"  # "nccl" (a dump or its snapshot) or "sysfs" (no NVLink/GDR/SM)
    gpus: tuple[Placed, ...] = field(default=(), compare=False)
    nets: tuple[Placed, ...] = field(default=(), compare=False)

    @staticmethod
    def of(cpus: tuple[Cpu, ...], version: str = "1", source: str = "nccl") -> Topology:
        gpus, nets = _place(cpus)
        return Topology(cpus, version, source, gpus, nets)

    def switches(self) -> list[str]:
        """Bus ids of the PCI nodes that hold other PCI nodes (switches, bridges)."""
        found: list[str] = []
        for cpu in self.cpus:
            for pci, _ in _walk(cpu.children, ()):
                if pci.children:
                    found.append(pci.busid)
        return found

    def pcilinks(self) -> list[tuple[str, str]]:
        """(switch, target) of every direct link between PCI switches (`<pcilink>`)."""
        return [
            (pci.busid, target)
            for cpu in self.cpus
            for pci, _ in _walk(cpu.children, ())
            for target in pci.pcilinks
        ]

    def nvlink_count(self) -> int:
        return sum(link.count for placed in self.gpus if placed.gpu for link in placed.gpu.nvlinks)


def _walk(
    children: tuple[Pci, ...], chain: tuple[str, ...]
) -> Iterator[tuple[Pci, tuple[str, ...]]]:
    for pci in children:
        yield pci, chain
        yield from _walk(pci.children, (*chain, f"pci {pci.busid}"))


def _place(cpus: tuple[Cpu, ...]) -> tuple[tuple[Placed, ...], tuple[Placed, ...]]:
    gpus: list[Placed] = []
    nets: list[Placed] = []
    for cpu in cpus:
        top = (f"cpu {cpu.numaid}",)
        for net in cpu.nets:
            nets.append(Placed(net.label, top, f"net {net.label}", None, net=net))
        for pci, chain in _walk(cpu.children, top):
            if pci.gpu is not None:
                gpus.append(Placed(pci.busid, chain, f"gpu {pci.busid}", pci, gpu=pci.gpu))
            for net in pci.nets:
                port = "" if net.port is None else f" port {net.port}"
                nets.append(
                    Placed(
                        f"{pci.busid}{port}",
                        (*chain, f"nic {pci.busid}"),
                        f"net {net.label}",
                        pci,
                        net=net,
                    )
                )
    return tuple(gpus), tuple(nets)


def _int(value: str | None, where: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value, 0) if value.lower().startswith("0x") else int(float(value))
    except ValueError:
        raise TopologyError(f"{where}: {value!r} is not a number") from None


def _flag(value: str | None) -> bool | None:
    return None if value is None else value.strip() not in ("0", "")


def _busid(value: str | None, where: str) -> str:
    busid = (value or "").strip().lower()
    if not _BUSID.match(busid):
        raise TopologyError(f"{where}: busid {value!r} is not a PCI address like 0000:1b:00.0")
    return busid


def _nets(nic: ET.Element, where: str) -> list[Net]:
    found = []
    for net in nic.iter("net"):
        name = net.get("name") or ""
        at = f"{where} / net {name or '?'}"
        if not name:
            raise TopologyError(f"{at}: <net> without a name")
        found.append(
            Net(
                name=name,
                dev=_int(net.get("dev"), at),
                speed_mbps=_int(net.get("speed"), at),
                port=_int(net.get("port"), at),
                guid=net.get("guid"),
                gdr=_flag(net.get("gdr")),
                rail=_int(net.get("rail"), at),
                plane=_int(net.get("plane"), at),
            )
        )
    return found


def _gpu(element: ET.Element, where: str) -> Gpu:
    links = []
    for link in element.findall("nvlink"):
        target = (link.get("target") or "").strip().lower()
        tclass = link.get("tclass") or (NVSWITCH_CLASS if target == HIDDEN_NVSWITCH else "")
        links.append(NvLink(target, _int(link.get("count"), where) or 0, tclass))
    c2c = element.find("c2c")
    return Gpu(
        dev=_int(element.get("dev"), where),
        rank=_int(element.get("rank"), where),
        sm=_int(element.get("sm"), where),
        gdr=_flag(element.get("gdr")),
        nvlinks=tuple(sorted(links, key=lambda link: link.target)),
        c2c=None
        if c2c is None
        else C2c(_int(c2c.get("count"), where) or 0, _int(c2c.get("bw"), where) or 0),
    )


def _pci(element: ET.Element, where: str) -> Pci:
    busid = _busid(element.get("busid"), where)
    at = f"{where} / pci {busid}"
    children = tuple(sorted((_pci(c, at) for c in element.findall("pci")), key=_pci_key))
    gpu_elements = element.findall("gpu")
    nets: list[Net] = []
    for nic in element.findall("nic"):
        nets += _nets(nic, f"{where} / nic {busid}")
    return Pci(
        busid=busid,
        attrs=tuple((k, element.get(k, "")) for k in PCI_ATTRS[1:] if element.get(k) is not None),
        children=children,
        gpu=_gpu(gpu_elements[0], f"{where} / gpu {busid}") if gpu_elements else None,
        nets=tuple(sorted(nets, key=lambda n: (n.port or 0, n.name))),
        pcilinks=tuple(
            sorted(
                _busid(link.get("target"), f"{at} / pcilink") for link in element.findall("pcilink")
            )
        ),
    )


def _pci_key(pci: Pci) -> str:
    return pci.busid


def parse_topology(text: str | bytes) -> Topology:
    """An NCCL topology XML (`<system version="1"><cpu …><pci …>…`) → Topology; raises
    TopologyError on anything else. Document type declarations are refused (entity
    expansion is the one XML feature a hostile dump could use against a root reader)."""
    data = text.encode() if isinstance(text, str) else text
    if len(data) > MAX_XML_BYTES:
        raise TopologyError(f"topology is {len(data)} bytes, more than {MAX_XML_BYTES}")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise TopologyError("topology XML declares a DOCTYPE or entities: refused")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise TopologyError(f"not well-formed XML: {exc}") from None
    if root.tag != "system":
        raise TopologyError(f"root element is <{root.tag}>, expected NCCL's <system>")
    cpus: list[Cpu] = []
    for element in root.findall("cpu"):
        numaid = element.get("numaid", "").strip() or str(len(cpus))
        where = f"cpu {numaid}"
        nets: list[Net] = []
        for nic in element.findall("nic"):
            nets += _nets(nic, where)
        children = tuple(sorted((_pci(c, where) for c in element.findall("pci")), key=_pci_key))
        cpus.append(
            Cpu(
                numaid=numaid,
                attrs=tuple((k, element.get(k, "")) for k in CPU_ATTRS[1:] if element.get(k)),
                children=children,
                nets=tuple(nets),
            )
        )
    cpus.sort(key=lambda cpu: (len(cpu.numaid), cpu.numaid))
    return Topology.of(tuple(cpus), root.get("version", "1"), root.get("source", "nccl"))


# Attributes a golden profile keeps: what is the same on every healthy node of one SKU.
# Dropped: rank (the job's), guid (the node's), latency/maxconn (tunables), keep flags.
def _set(element: ET.Element, name: str, value: object) -> None:
    if value is None:
        return
    element.set(name, str(int(value)) if isinstance(value, bool) else str(value))


def snapshot_xml(topology: Topology) -> str:
    """The normalised golden profile: NCCL's format, children sorted by bus id, only the
    attributes that identify a SKU's layout; byte-identical for equal topologies."""
    system = ET.Element("system", version=topology.version)
    if topology.source != "nccl":
        system.set("source", topology.source)
    for cpu in topology.cpus:
        cpu_el = ET.SubElement(system, "cpu", numaid=cpu.numaid)
        for name, value in cpu.attrs:
            cpu_el.set(name, value)
        for pci in cpu.children:
            _write_pci(cpu_el, pci)
        if cpu.nets:
            _write_nets(ET.SubElement(cpu_el, "nic"), cpu.nets)
    ET.indent(system, space="  ")
    return ET.tostring(system, encoding="unicode") + "\n"


def _write_pci(parent: ET.Element, pci: Pci) -> None:
    element = ET.SubElement(parent, "pci", busid=pci.busid)
    for name, value in pci.attrs:
        element.set(name, value)
    for child in pci.children:
        _write_pci(element, child)
    for target in pci.pcilinks:
        ET.SubElement(element, "pcilink", target=target)
    if pci.gpu is not None:
        gpu = ET.SubElement(element, "gpu")
        _set(gpu, "dev", pci.gpu.dev)
        _set(gpu, "sm", pci.gpu.sm)
        _set(gpu, "gdr", pci.gpu.gdr)
        for link in pci.gpu.nvlinks:
            ET.SubElement(
                gpu, "nvlink", target=link.target, count=str(link.count), tclass=link.tclass
            )
        if pci.gpu.c2c is not None:
            c2c = pci.gpu.c2c
            ET.SubElement(gpu, "c2c", count=str(c2c.count), bw=str(c2c.bw_mb_s))
    if pci.nets:
        _write_nets(ET.SubElement(element, "nic"), pci.nets)


def _write_nets(nic: ET.Element, nets: tuple[Net, ...]) -> None:
    for net in nets:
        element = ET.SubElement(nic, "net", name=net.name)
        _set(element, "dev", net.dev)
        _set(element, "speed", net.speed_mbps)
        _set(element, "port", net.port)
        _set(element, "gdr", net.gdr)
        _set(element, "rail", net.rail)
        _set(element, "plane", net.plane)
