"""The PCI tree as sysfs shows it: which devices are GPUs and RDMA NICs, the bridges above
each (from the device's sysfs path), and the ACS control bits of a bridge read from its
config space. Read-only: opens config space for reading, never writes or resets a device.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from denpex.core.roots import Roots, read_text

BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
NVIDIA = "0x10de"
EXT_CAP_START = 0x100
CONFIG_BYTES = 4096
ACS_CAP_ID = 0x000D
# ACS Control register bits (PCIe base spec 7.7.8.3)
ACS_BITS = {
    "source_validation": 1 << 0,
    "translation_blocking": 1 << 1,
    "p2p_request_redirect": 1 << 2,
    "p2p_completion_redirect": 1 << 3,
    "upstream_forwarding": 1 << 4,
    "p2p_egress_control": 1 << 5,
    "direct_translated_p2p": 1 << 6,
}
# Bits that send peer-to-peer traffic up to the root complex (or block it) instead of
# letting the switch route it directly: what breaks or slows GPUDirect P2P and RDMA.
ACS_REDIRECT_BITS = ("p2p_request_redirect", "p2p_completion_redirect", "p2p_egress_control")


@dataclass(frozen=True, slots=True)
class AcsState:
    offset: int  # of the ACS extended capability in config space
    capability: int  # which controls the port implements
    control: int  # which are enabled

    def enabled(self) -> list[str]:
        return [name for name, bit in ACS_BITS.items() if self.control & bit]

    def redirects(self) -> list[str]:
        return [name for name in ACS_REDIRECT_BITS if self.control & ACS_BITS[name]]


def find_ext_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of a PCIe extended capability, walking the list from 0x100; None when absent,
    when config space is short (an unprivileged read returns 64 bytes) or the list loops."""
    offset, seen = EXT_CAP_START, set()
    while EXT_CAP_START <= offset <= len(config) - 4 and offset not in seen:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == cap_id:
            return offset
        offset = (header >> 20) & 0xFFC
    return None


def parse_acs(config: bytes) -> AcsState | None:
    """The ACS capability and control registers of a port, or None when it has none."""
    offset = find_ext_capability(config, ACS_CAP_ID)
    if offset is None or offset + 8 > len(config):
        return None
    capability, control = struct.unpack_from("<HH", config, offset + 4)
    return AcsState(offset, capability, control)


def config_readable(config: bytes) -> bool:
    """Whether the extended config space was read (root reads 4096 bytes, others 64)."""
    return len(config) > EXT_CAP_START


def pci_chain(real_path: str) -> tuple[str, ...]:
    """A device's sysfs path (realpath of /sys/bus/pci/devices/<bdf>) → its host bridge and
    PCI addresses from the top down: ("pci0000:00", "0000:00:01.0", …, the device)."""
    parts = real_path.rstrip("/").split("/")
    for index, part in enumerate(parts):
        if HOST_BRIDGE.match(part):
            tail = parts[index + 1 :]
            return (part, *(p for p in tail if BDF.match(p)))
    return tuple(p for p in parts if BDF.match(p))


def device_kind(pci_class: str, vendor: str, has_rdma: bool) -> str | None:
    """ "gpu" (an NVIDIA display/3D controller), "rdma_nic" (InfiniBand, or a NIC with an RDMA
    device), "bridge", or None for what GPUDirect does not involve."""
    code = pci_class.strip().lower().removeprefix("0x")
    if code.startswith(("0300", "0302")) and vendor.strip().lower() == NVIDIA:
        return "gpu"
    if code.startswith("0207") or (code.startswith("02") and has_rdma):
        return "rdma_nic"
    if code.startswith("0604"):
        return "bridge"
    return None


@dataclass(frozen=True, slots=True)
class PciDevice:
    bdf: str
    kind: str | None
    chain: tuple[str, ...]  # host bridge, bridges, then the device itself
    rdma: tuple[str, ...] = ()  # RDMA device names (mlx5_0) on this function

    @property
    def bridges(self) -> tuple[str, ...]:
        """The PCI bridges above the device, root port first."""
        return (
            self.chain[1:-1] if self.chain and HOST_BRIDGE.match(self.chain[0]) else self.chain[:-1]
        )


def list_devices(roots: Roots) -> list[PciDevice]:
    """Every PCI function under <sysfs>/bus/pci/devices with its kind and upstream chain."""
    folder = roots.sys("bus", "pci", "devices")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for bdf in names:
        path = folder / bdf
        try:
            rdma = tuple(sorted(os.listdir(path / "infiniband")))
        except OSError:
            rdma = ()
        kind = device_kind(
            read_text(path / "class") or "", read_text(path / "vendor") or "", bool(rdma)
        )
        found.append(PciDevice(bdf, kind, pci_chain(os.path.realpath(path)) or (bdf,), rdma))
    return found


def read_config(roots: Roots, bdf: str) -> bytes:
    """Up to 4096 bytes of the function's config space; b"" when unreadable."""
    try:
        with open(roots.sys("bus", "pci", "devices", bdf, "config"), "rb") as handle:
            return handle.read(CONFIG_BYTES)
    except OSError:
        return b""


def iommu_group_type(roots: Roots, bdf: str) -> str | None:
    """The default-domain type of the device's IOMMU group: "identity" (passthrough), "DMA"
    or "DMA-FQ" (translated), "blocked"; None without a group."""
    group = roots.sys("bus", "pci", "devices", bdf, "iommu_group")
    if not group.exists():
        return None
    text = read_text(Path(os.path.realpath(group)) / "type")
    return text.strip() if text else None
