"""Writes the sysfs/procfs fixture trees of the GPUDirect tests (tests/fabric/fixtures/
gpudirect_*), binary PCI config space included. The committed trees are this module's
output; test_gpudirect checks they still are. Regenerate: python -m tests.fabric.gpudirect_fixtures
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
VARIANTS = ("gpudirect_good", "gpudirect_bad")

# ACS capability a Broadcom switch port advertises: SV TB RR CR UF DT
ACS_CAPABILITY = 0x005F
ACS_ROOT_PORT_DEFAULT = 0x001D  # SV RR CR UF: what Linux sets on root ports with an IOMMU
ACS_REDIRECT = 0x000C  # RR CR

# (bdf, parent bdf or host bridge, role); two root complexes, one switch under each with a
# GPU and a NIC behind their own downstream ports, plus a SATA controller that is ignored.
TREE = (
    ("0000:00:01.0", "pci0000:00", "root_port"),
    ("0000:01:00.0", "0000:00:01.0", "upstream"),
    ("0000:02:00.0", "0000:01:00.0", "downstream"),
    ("0000:02:01.0", "0000:01:00.0", "downstream"),
    ("0000:03:00.0", "0000:02:00.0", "gpu"),
    ("0000:04:00.0", "0000:02:01.0", "nic"),
    ("0000:00:1f.2", "pci0000:00", "sata"),
    ("0000:80:01.0", "pci0000:80", "root_port"),
    ("0000:81:00.0", "0000:80:01.0", "upstream"),
    ("0000:82:00.0", "0000:81:00.0", "downstream"),
    ("0000:82:01.0", "0000:81:00.0", "downstream"),
    ("0000:83:00.0", "0000:82:00.0", "gpu"),
    ("0000:84:00.0", "0000:82:01.0", "nic"),
)
IDS = {  # role → (class, vendor, device)
    "root_port": ("0x060400", "0x8086", "0x352a"),
    "upstream": ("0x060400", "0x1000", "0xc030"),
    "downstream": ("0x060400", "0x1000", "0xc030"),
    "gpu": ("0x030200", "0x10de", "0x2330"),
    "nic": ("0x020700", "0x15b3", "0x1021"),
    "sata": ("0x010601", "0x8086", "0x1bd2"),
}
RDMA = {"0000:04:00.0": "mlx5_0", "0000:84:00.0": "mlx5_1"}


def config_space(vendor: str, device: str, bridge: bool, acs_control: int | None) -> bytes:
    """4096 bytes of config space: an AER extended capability at 0x100, then (for ports
    with ACS) Secondary PCIe, ACS at 0x170 and DPC, as a Gen5 switch port lays them out."""
    data = bytearray(4096)
    struct.pack_into("<HH", data, 0, int(vendor, 16), int(device, 16))
    data[0x0E] = 0x01 if bridge else 0x00
    data[0x34] = 0x40  # standard capability list: PCI Express capability at 0x40
    data[0x40:0x42] = bytes((0x10, 0x00))

    def ext(offset: int, cap_id: int, version: int, following: int) -> None:
        struct.pack_into("<I", data, offset, cap_id | version << 16 | following << 20)

    if acs_control is None:
        ext(0x100, 0x0001, 2, 0)
    else:
        ext(0x100, 0x0001, 2, 0x140)
        ext(0x140, 0x0019, 1, 0x170)
        ext(0x170, 0x000D, 1, 0x180)
        struct.pack_into("<HH", data, 0x174, ACS_CAPABILITY, acs_control)
        ext(0x180, 0x001D, 1, 0)
    return bytes(data)


def acs_controls(variant: str) -> dict[str, int]:
    controls = {bdf: 0 for bdf, _, role in TREE if role == "downstream"}
    controls.update({bdf: ACS_ROOT_PORT_DEFAULT for bdf, _, role in TREE if role == "root_port"})
    if variant == "gpudirect_bad":
        controls["0000:02:01.0"] = ACS_ROOT_PORT_DEFAULT  # above NIC mlx5_0
        controls["0000:82:00.0"] = ACS_REDIRECT  # above the second GPU
    return controls


def write(variant: str, root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    sys_root, proc = root / "sys", root / "proc"
    bad = variant == "gpudirect_bad"
    paths: dict[str, Path] = {}
    controls = acs_controls(variant)
    links = sys_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for group, (bdf, parent, role) in enumerate(TREE):
        base = sys_root / "devices" / parent if parent.startswith("pci") else paths[parent]
        folder = paths[bdf] = base / bdf
        folder.mkdir(parents=True)
        pci_class, vendor, device = IDS[role]
        for name, value in (("class", pci_class), ("vendor", vendor), ("device", device)):
            (folder / name).write_text(value + "\n")
        (folder / "numa_node").write_text("1\n" if bdf.startswith("0000:8") else "0\n")
        for prefix in ("max", "current"):
            (folder / f"{prefix}_link_speed").write_text("32.0 GT/s PCIe\n")
            (folder / f"{prefix}_link_width").write_text("16\n")
        bridge = pci_class.startswith("0x0604")
        (folder / "config").write_bytes(config_space(vendor, device, bridge, controls.get(bdf)))
        group_dir = sys_root / "kernel" / "iommu_groups" / str(group)
        group_dir.mkdir(parents=True)
        (group_dir / "type").write_text("DMA-FQ\n" if bad else "identity\n")
        os.symlink(os.path.relpath(group_dir, folder), folder / "iommu_group")
        os.symlink(os.path.relpath(folder, links), links / bdf)
        if bdf in RDMA:
            name = RDMA[bdf]
            (folder / "infiniband" / name).mkdir(parents=True)
            (folder / "infiniband" / name / "node_type").write_text("1: CA\n")
            port = sys_root / "class" / "infiniband" / name / "ports" / "1"
            port.mkdir(parents=True)
            (port / "state").write_text("4: ACTIVE\n")
            (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
            os.symlink(os.path.relpath(folder, port.parent.parent), port.parent.parent / "device")
    iommu = sys_root / "class" / "iommu" / "dmar0"
    iommu.mkdir(parents=True)
    (iommu / "version").write_text("1:0\n")
    proc.mkdir()
    modules = "mlx5_ib 491520 0 - Live 0x0000000000000000\nnvidia 54001664 2 - Live 0x0\n"
    if not bad:
        modules += "nvidia_peermem 16384 0 - Live 0x0000000000000000\n"
        (sys_root / "module" / "nvidia_peermem").mkdir(parents=True)
        (sys_root / "module" / "nvidia_peermem" / "refcnt").write_text("0\n")
    (proc / "modules").write_text(modules)
    cmdline = "BOOT_IMAGE=/vmlinuz-6.8.0 root=UUID=0b1c ro intel_iommu=on"
    (proc / "cmdline").write_text(cmdline + ("\n" if bad else " iommu=pt\n"))
    (proc / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n\n"
    )


if __name__ == "__main__":
    for name in VARIANTS:
        write(name, FIXTURES / name)
