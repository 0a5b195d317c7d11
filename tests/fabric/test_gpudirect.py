"""GPUDirect prerequisites on sysfs/procfs fixture trees with binary PCI config space: ACS
parsing, the bridges between peers, IOMMU mode, peer-memory module, the collector's
evidence, and the sysfs topology built from the same trees."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.fabric.gpudirect import GpuDirectCollector, bridges_between, iommu_mode, parse_cmdline
from denpex.fabric.nccl_topo.diff import compare_topologies
from denpex.fabric.nccl_topo.sysfs import nccl_ancestors, parse_rate_mbps, sysfs_topology
from denpex.fabric.pci_sysfs import (
    PciDevice,
    config_readable,
    find_ext_capability,
    list_devices,
    parse_acs,
    pci_chain,
)
from tests.fabric import gpudirect_fixtures

FIXTURES = Path(__file__).parent / "fixtures"


def tree_of(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = path.read_bytes()
    return out


@pytest.mark.parametrize("variant", gpudirect_fixtures.VARIANTS)
def test_committed_trees_are_the_generators_output(variant: str, tmp_path: Path) -> None:
    gpudirect_fixtures.write(variant, tmp_path / variant)
    assert tree_of(FIXTURES / variant) == tree_of(tmp_path / variant)


@pytest.fixture
def roots(tmp_path: Path):
    def make(variant: str) -> Roots:
        tree = tmp_path / variant
        shutil.copytree(FIXTURES / variant, tree, symlinks=True)
        return Roots(procfs=str(tree / "proc"), sysfs=str(tree / "sys"), devfs=str(tree / "dev"))

    return make


def test_acs_parse() -> None:
    on = gpudirect_fixtures.config_space("0x1000", "0xc030", True, 0x001D)
    acs = parse_acs(on)
    assert acs is not None and acs.offset == 0x170 and acs.capability == 0x5F
    assert acs.enabled() == [
        "source_validation",
        "p2p_request_redirect",
        "p2p_completion_redirect",
        "upstream_forwarding",
    ]
    assert acs.redirects() == ["p2p_request_redirect", "p2p_completion_redirect"]
    off = parse_acs(gpudirect_fixtures.config_space("0x1000", "0xc030", True, 0))
    assert off is not None and off.redirects() == []
    assert parse_acs(gpudirect_fixtures.config_space("0x1000", "0xc030", True, None)) is None
    assert not config_readable(on[:64]) and parse_acs(on[:64]) is None
    looped = bytearray(4096)
    struct.pack_into("<I", looped, 0x100, 0x0001 | 1 << 16 | 0x100 << 20)  # points at itself
    assert find_ext_capability(bytes(looped), 0x000D) is None


@settings(max_examples=200, deadline=None, print_blob=True)
@given(st.binary(min_size=0, max_size=4096))
def test_acs_walk_never_raises(data: bytes) -> None:
    offset = find_ext_capability(data, 0x000D)
    assert offset is None or 0x100 <= offset <= len(data) - 4
    parse_acs(data)


def test_paths_and_ancestors() -> None:
    path = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0"
    chain = pci_chain(path)
    assert chain == ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0")
    assert PciDevice("0000:03:00.0", "gpu", chain).bridges == chain[1:-1]
    # NCCL folds switch downstream ports and stops at the root complex
    assert nccl_ancestors(chain) == ["0000:01:00.0"]
    assert nccl_ancestors(("pci0000:00", "0000:00:01.0", "0000:01:00.0")) == []
    assert nccl_ancestors(("pci0000:00", *[f"0000:0{i}:00.0" for i in range(7)])) == [
        "0000:00:00.0",
        "0000:02:00.0",
        "0000:04:00.0",
    ]
    assert parse_rate_mbps("400 Gb/sec (4X NDR)\n") == 400000 and parse_rate_mbps("") is None


def test_iommu_mode_and_cmdline() -> None:
    cmd = parse_cmdline("BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt quiet\n")
    assert cmd["iommu"] == "pt" and cmd["quiet"] == ""
    assert iommu_mode(True, ["identity", "identity"], {}) == "passthrough"
    assert iommu_mode(True, ["identity", "DMA-FQ"], cmd) == "translated"
    assert iommu_mode(False, [None], {}) == "off"
    assert iommu_mode(True, [], cmd) == "passthrough"
    assert iommu_mode(True, [], {"amd_iommu": "off"}) == "off"
    assert iommu_mode(True, [], {"iommu.passthrough": "0"}) == "translated"
    assert iommu_mode(True, [], {"intel_iommu": "on"}) == "unknown"


def test_bridges_between_peers(roots) -> None:
    devices = list_devices(roots("gpudirect_good"))
    kinds = {d.bdf: d.kind for d in devices}
    assert kinds["0000:03:00.0"] == "gpu" and kinds["0000:04:00.0"] == "rdma_nic"
    assert kinds["0000:00:1f.2"] is None and kinds["0000:02:00.0"] == "bridge"
    between = bridges_between(devices, include_root_ports=False)
    # downstream ports of each switch; not the upstream (common) port, not root ports, and
    # nothing for pairs across the two root complexes
    assert between == {
        "0000:02:00.0": {"0000:03:00.0", "0000:04:00.0"},
        "0000:02:01.0": {"0000:03:00.0", "0000:04:00.0"},
        "0000:82:00.0": {"0000:83:00.0", "0000:84:00.0"},
        "0000:82:01.0": {"0000:83:00.0", "0000:84:00.0"},
    }
    assert "0000:00:01.0" not in bridges_between(devices, include_root_ports=True)  # common


def poll(collector: GpuDirectCollector, roots: Roots) -> list:
    return collector.collect(CollectContext(roots=roots, host="gpu-node-7", now_ns=11))


def metrics(out: list) -> dict[str, float]:
    return {e.body: e.attrs["value"] for e in out if isinstance(e, Event) and e.kind == "metric"}


def test_good_node_is_silent(roots) -> None:
    r = roots("gpudirect_good")
    collector = GpuDirectCollector(r)
    assert collector.available()[0]
    out = poll(collector, r)
    assert [e for e in out if isinstance(e, Evidence)] == []
    assert metrics(out) == {
        "gpudirect_peermem_loaded": 1,
        "gpudirect_gpus": 2,
        "gpudirect_rdma_nics": 2,
        "gpudirect_acs_redirect_bridges": 0,
        "gpudirect_acs_unreadable_bridges": 0,
        "gpudirect_iommu_translated": 0,
    }
    assert set(metrics(out)) <= set(collector.metrics_help)
    assert all(e.host == "gpu-node-7" and e.ts_ns == 11 for e in out)


def test_bad_node_reports_each_cause_once(roots) -> None:
    r = roots("gpudirect_bad")
    collector = GpuDirectCollector(r)
    out = poll(collector, r)
    found = [e for e in out if isinstance(e, Evidence)]
    assert [
        (e.signature, e.category, e.severity, e.action, e.captures["device"]) for e in found
    ] == [
        (
            "gpu.p2p_topology.peermem_missing",
            "gpu.p2p_topology",
            "warning",
            "fix_config",
            "nvidia_peermem",
        ),
        (
            "gpu.p2p_topology.acs_redirect",
            "gpu.p2p_topology",
            "warning",
            "fix_config",
            "0000:02:01.0",
        ),
        (
            "gpu.p2p_topology.acs_redirect",
            "gpu.p2p_topology",
            "warning",
            "fix_config",
            "0000:82:00.0",
        ),
        ("gpu.p2p_topology.iommu_translated", "gpu.p2p_topology", "warning", "fix_config", "iommu"),
    ]
    assert found[1].captures["bits"] == "p2p_request_redirect,p2p_completion_redirect"
    assert "0000:02:01.0" in found[1].summary and "0000:04:00.0" in found[1].summary
    assert "mlx5_0, mlx5_1" in found[0].summary
    assert metrics(out)["gpudirect_acs_redirect_bridges"] == 2
    assert [e for e in poll(collector, r) if isinstance(e, Evidence)] == []
    # the module gets loaded: that cause clears; unloaded again: reported again
    modules = Path(r.procfs, "modules")
    text = modules.read_text()
    modules.write_text(text + "nvidia_peermem 16384 0 - Live 0x0\n")
    assert metrics(poll(collector, r))["gpudirect_peermem_loaded"] == 1
    modules.write_text(text)
    again = [e.signature for e in poll(collector, r) if isinstance(e, Evidence)]
    assert again == ["gpu.p2p_topology.peermem_missing"]


def test_unprivileged_config_read_is_counted_not_guessed(roots) -> None:
    r = roots("gpudirect_bad")
    for bdf in ("0000:02:01.0", "0000:82:00.0"):
        config = r.sys("bus", "pci", "devices", bdf, "config")
        config.write_bytes(config.read_bytes()[:64])
    out = poll(GpuDirectCollector(r), r)
    assert metrics(out)["gpudirect_acs_unreadable_bridges"] == 2
    assert "gpu.p2p_topology.acs_redirect" not in {getattr(e, "signature", "") for e in out}


def test_available_without_pci_bus(tmp_path: Path) -> None:
    ok, why = GpuDirectCollector(Roots(sysfs=str(tmp_path))).available()
    assert not ok and "bus/pci/devices" in why


def test_sysfs_topology_places_devices_like_nccl(roots) -> None:
    r = roots("gpudirect_good")
    topo = sysfs_topology(r)
    assert topo.source == "sysfs"
    assert [g.path for g in topo.gpus] == [
        "cpu 0 / pci 0000:01:00.0 / gpu 0000:03:00.0",
        "cpu 1 / pci 0000:81:00.0 / gpu 0000:83:00.0",
    ]
    assert [(n.path, n.net.speed_mbps if n.net else None) for n in topo.nets] == [
        ("cpu 0 / pci 0000:01:00.0 / nic 0000:04:00.0 / net mlx5_0:1", 400000),
        ("cpu 1 / pci 0000:81:00.0 / nic 0000:84:00.0 / net mlx5_1:1", 400000),
    ]
    assert compare_topologies(topo, sysfs_topology(r)) == []
    # a port that went down is absent, as in an NCCL dump
    r.sys("class", "infiniband", "mlx5_1", "ports", "1", "state").write_text("1: DOWN\n")
    assert [d.kind for d in compare_topologies(topo, sysfs_topology(r))] == ["nic_missing"]
