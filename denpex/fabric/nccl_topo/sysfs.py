"""An NCCL-shaped topology built from sysfs (GPUs, RDMA NICs and the PCI switches above
them), for golden profiles of nodes where no job has dumped one yet. Read-only; NVLinks,
GDR and SM are NVML facts sysfs cannot give, so the result is marked source="sysfs".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from denpex.core.roots import Roots, read_text
from denpex.fabric.nccl_topo.model import Cpu, Gpu, Net, Pci, Topology
from denpex.fabric.pci_sysfs import HOST_BRIDGE, PciDevice, list_devices

ATTR_FILES = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device")


def nccl_ancestors(chain: tuple[str, ...]) -> list[str]:
    """The PCI nodes NCCL keeps above a device, top first. NCCL climbs two path levels at a
    time (a switch's downstream port is folded into its upstream port) and stops at the root
    complex: .../pci0000:00/RP/UP/DP/DEV keeps UP only; RP/DEV keeps nothing."""
    bdfs = [part for part in chain if not HOST_BRIDGE.match(part)]
    kept = []
    index = len(bdfs) - 1 - 2
    while index >= 0:
        kept.append(bdfs[index])
        index -= 2
    return kept[::-1]


def parse_rate_mbps(text: str | None) -> int | None:
    """`400 Gb/sec (4X NDR)` → 400000 (NCCL's speed unit, Mb/s)."""
    try:
        return int(float((text or "").split()[0]) * 1000)
    except (ValueError, IndexError):
        return None


def _min_link(a: str | None, b: str | None) -> str | None:
    """NCCL's link speed/width: the lower of the device's and its port's maxima."""
    values = [v.strip() for v in (a, b) if v and v.strip() and not v.startswith("Unknown")]
    if not values:
        return None
    return min(values, key=lambda v: float(v.split()[0]))


@dataclass
class _Node:
    busid: str
    attrs: tuple[tuple[str, str], ...] = ()
    children: dict[str, _Node] = field(default_factory=dict)
    gpu: Gpu | None = None
    nets: tuple[Net, ...] = ()

    def freeze(self) -> Pci:
        kids = tuple(self.children[k].freeze() for k in sorted(self.children))
        return Pci(self.busid, self.attrs, kids, self.gpu, self.nets)


def _attrs(roots: Roots, bdf: str) -> tuple[tuple[str, str], ...]:
    folder = roots.sys("bus", "pci", "devices", bdf)
    out = []
    for name in ATTR_FILES:
        value = read_text(folder / name)
        if value and value.strip():
            out.append((name, value.strip()))
    for attr, name in (("link_speed", "max_link_speed"), ("link_width", "max_link_width")):
        value = _min_link(read_text(folder / name), read_text(folder / ".." / name))
        if value:
            out.append((attr, value))
    return tuple(out)


def _nets(roots: Roots, device: PciDevice, first_dev: int) -> tuple[Net, ...]:
    nets: list[Net] = []
    for name in device.rdma:
        ports = roots.sys("class", "infiniband", name, "ports")
        try:
            numbers = sorted(os.listdir(ports), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            continue
        for port in numbers:
            # NCCL lists only ACTIVE ports: a port that is down is missing from a dump too
            if "ACTIVE" not in (read_text(ports / port / "state") or ""):
                continue
            nets.append(
                Net(
                    name=name,
                    dev=first_dev + len(nets),
                    speed_mbps=parse_rate_mbps(read_text(ports / port / "rate")),
                    port=int(port) if port.isdigit() else None,
                )
            )
    return tuple(nets)


def _cpu_attrs(roots: Roots, numaid: str) -> tuple[tuple[str, str], ...]:
    fields: dict[str, str] = {}
    for line in (read_text(roots.proc("cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip():
            break
    out = []
    cpumap = read_text(roots.sys("devices", "system", "node", f"node{numaid}", "cpumap"))
    if cpumap and cpumap.strip():
        out.append(("affinity", cpumap.strip()))
    for attr, key in (("vendor", "vendor_id"), ("familyid", "cpu family"), ("modelid", "model")):
        if fields.get(key):
            out.append((attr, fields[key]))
    return tuple(out)


def sysfs_topology(roots: Roots) -> Topology:
    """GPUs and RDMA NICs under <sysfs>/bus/pci/devices placed the way NCCL places them."""
    devices = [d for d in list_devices(roots) if d.kind in ("gpu", "rdma_nic")]
    cpus: dict[str, dict[str, _Node]] = {}
    gpu_index = net_index = 0
    for device in devices:
        numa = (
            read_text(roots.sys("bus", "pci", "devices", device.bdf, "numa_node")) or ""
        ).strip()
        numaid = numa if numa.isdigit() else "0"
        level = cpus.setdefault(numaid, {})
        for busid in nccl_ancestors(device.chain):
            node = level.setdefault(busid, _Node(busid, _attrs(roots, busid)))
            level = node.children
        node = level.setdefault(device.bdf, _Node(device.bdf, _attrs(roots, device.bdf)))
        if device.kind == "gpu":
            node.gpu = Gpu(dev=gpu_index)
            gpu_index += 1
        else:
            node.nets = _nets(roots, device, net_index)
            net_index += len(node.nets)
    frozen = tuple(
        Cpu(
            numaid=numaid,
            attrs=_cpu_attrs(roots, numaid),
            children=tuple(nodes[k].freeze() for k in sorted(nodes)),
        )
        for numaid, nodes in sorted(cpus.items(), key=lambda item: int(item[0]))
    )
    return Topology.of(frozen, source="sysfs")
