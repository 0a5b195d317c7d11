"""Which rail each GPU's traffic leaves the host on, from the NCCL topology: every GPU is
paired with the NIC port(s) under its nearest PCI switch (what NCCL's PIX/PXB pairing picks
for GPUDirect RDMA), and a port's rail is NCCL's `rail` attribute where the dump has one,
else the port's index among the paired ports in NCCL's device order (net `dev`): on a
rail-optimised fabric the k-th such port of every host is cabled to the rail-k switch.

Pure: a Topology in, pairs out; the NICs no GPU sits near (storage, front end) get no rail.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from denpex.fabric.nccl_topo.diff import near_nets
from denpex.fabric.nccl_topo.model import Placed, Topology


@dataclass(frozen=True, slots=True)
class GpuRail:
    gpu: str  # the GPU's PCI address, as the driver prints it
    nic: str  # the RDMA device NCCL names the port by ("mlx5_3")
    port: int  # its port number (1 when NCCL gives none)
    rail: int

    @property
    def nic_port(self) -> str:
        """The port as sysfs and the neighbour tools name it: "mlx5_3/1"."""
        return f"{self.nic}/{self.port}"

    def labels(self) -> dict[str, str]:
        """The labels of this GPU's `host_rail` series."""
        return {"gpu": self.gpu, "nic": self.nic_port, "rail": str(self.rail)}


def _order(placed: Placed) -> tuple[int, str]:
    net = placed.net
    dev = net.dev if net is not None and net.dev is not None else 1 << 30
    return dev, placed.key


def gpu_rails(topology: Topology) -> list[GpuRail]:
    """One GpuRail per GPU that has a NIC port near it, in GPU bus order. GPUs sharing a PCI
    switch with as many ports are paired in order (the first GPU with the first port)."""
    near: dict[str, list[Placed]] = {}
    groups: dict[tuple[str, ...], list[Placed]] = defaultdict(list)
    for gpu in sorted(topology.gpus, key=lambda p: p.key):
        nets = sorted((net for net, _ in near_nets(gpu, topology.nets)), key=_order)
        if nets:
            near[gpu.key] = nets
            groups[tuple(n.key for n in nets)].append(gpu)
    paired = sorted({n.key: n for nets in near.values() for n in nets}.values(), key=_order)
    index = {net.key: i for i, net in enumerate(paired)}
    out: list[GpuRail] = []
    for gpus in groups.values():
        nets = near[gpus[0].key]
        for i, gpu in enumerate(gpus):
            net = nets[i % len(nets)]
            if net.net is None:
                continue
            rail = net.net.rail if net.net.rail is not None else index[net.key]
            port = net.net.port if net.net.port is not None else 1
            out.append(GpuRail(gpu.key, net.net.name, port, rail))
    return sorted(out, key=lambda r: r.gpu)
