"""NCCL topology links beyond NVLink-to-switch: the SM86 NVLink rate, NVLink-C2C (a real GB10
dump), NVSwitches hidden from a VM (fffffff:ffff:ff), direct PCI switch links and the rail
and plane of each net port; what each must read and the difference each must produce."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from denpex.fabric.nccl_topo.diff import compare_topologies
from denpex.fabric.nccl_topo.model import (
    HIDDEN_NVSWITCH,
    C2c,
    NvLink,
    Topology,
    parse_topology,
    snapshot_xml,
)

TOPO = Path(__file__).parent / "fixtures" / "nccl_topo"


def load(name: str) -> Topology:
    return parse_topology((TOPO / name).read_bytes())


def kinds(golden: Topology, actual: Topology) -> list[tuple[str, str]]:
    return [(d.kind, d.device) for d in compare_topologies(golden, actual)]


@pytest.mark.parametrize(
    ("sm", "per_link"),
    [
        (60, 18.0),
        (70, 20.0),
        (80, 20.0),
        (86, 12.0),
        (87, 20.0),
        (89, 20.0),
        (90, 20.6),
        (100, 40.1),
    ],
)
def test_nvlink_rate_per_sm_as_nccl_rates_it(sm: int, per_link: float) -> None:
    # ncclTopoNVLinkBw: SM86 (A40, A10) is its own entry, the others by minimum SM
    assert NvLink("0000:3b:00.0", 4, "0x030200").bandwidth_gb_s(sm) == round(4 * per_link, 1)
    assert NvLink("0000:3b:00.0", 4, "0x030200").bandwidth_gb_s(50) is None


def test_c2c_of_a_real_gb10_dump() -> None:
    topo = load("gb10_c2c.xml")
    (gpu,) = topo.gpus
    assert gpu.gpu is not None and gpu.gpu.sm == 121
    assert gpu.gpu.c2c == C2c(count=8, bw_mb_s=43125)
    assert gpu.gpu.c2c.bandwidth_gb_s == 345.0  # what NCCL logs: C2C[345.0]
    snapshot = snapshot_xml(topo)
    assert '<c2c count="8" bw="43125"' in snapshot
    again = parse_topology(snapshot)  # the golden keeps C2C (it drops rank and guid)
    assert again.gpus[0].gpu is not None and again.gpus[0].gpu.c2c == gpu.gpu.c2c
    assert snapshot_xml(again) == snapshot and compare_topologies(topo, again) == []
    text = (TOPO / "gb10_c2c.xml").read_text()
    fewer = parse_topology(text.replace('count="8"', 'count="4"'))
    found = compare_topologies(topo, fewer)
    assert [(d.kind, d.device) for d in found] == [("c2c_lower", "000f:01:00.0")]
    assert "C2C at 172.5 GB/s" in found[0].message and "345.0 GB/s" in found[0].message
    gone = parse_topology(re.sub(r"\s*<c2c [^>]*/>", "", text))
    (missing,) = compare_topologies(topo, gone)
    assert missing.kind == "c2c_lower" and "no C2C link" in missing.message
    assert compare_topologies(gone, topo) == []  # a C2C link the golden lacks is no loss


def _vm_dump(count: int = 18, tclass: bool = True) -> Topology:
    """dgx_h100.xml as a VM sees it: NVML cannot name the NVSwitches, so NCCL writes each
    GPU's 18 links as one <nvlink> to fffffff:ffff:ff."""
    text = (TOPO / "dgx_h100.xml").read_text()
    attrs = ' tclass="0x068000"' if tclass else ""
    hidden = f'<nvlink target="{HIDDEN_NVSWITCH}" count="{count}"{attrs}/>'
    text = re.sub(r"(<gpu [^>]*>)(\s*<nvlink [^>]*/>)+", lambda m: m[1] + hidden, text)
    return parse_topology(text)


def test_hidden_nvswitches_are_nvswitches() -> None:
    vm = _vm_dump(tclass=False)
    links = [link for placed in vm.gpus if placed.gpu for link in placed.gpu.nvlinks]
    assert len(links) == 8 and all(link.hidden and link.to_nvswitch for link in links)
    assert {link.tclass for link in links} == {"0x068000"}  # assumed, as NCCL does
    assert vm.nvlink_count() == 8 * 18
    # a bare-metal golden of the SKU and a VM's dump agree: NVSwitch links compare as a total
    golden = load("golden_dgx_h100.xml")
    assert compare_topologies(golden, _vm_dump()) == []
    assert compare_topologies(_vm_dump(), golden) == []
    found = compare_topologies(golden, _vm_dump(count=17))
    assert {d.kind for d in found} == {"nvlink_fewer"} and len(found) == 8
    assert (found[0].expected, found[0].actual) == ("18 to NVSwitch", "17 to NVSwitch")


def test_pcilinks_and_rails_are_read_kept_and_compared() -> None:
    text = (TOPO / "dgx_h100.xml").read_text()
    # the first switch linked directly to the second (Broadcom Gen5 P2P pairs)
    linked = re.sub(
        r'(<pci busid="0000:15:00\.0"[^>]*>)',
        r'\1<pcilink target="0000:27:00.0"/>',
        text,
        count=1,
    )
    railed = linked.replace('port="1" latency', 'port="1" rail="0" plane="1" latency', 1)
    golden = parse_topology(railed)
    assert golden.pcilinks() == [("0000:15:00.0", "0000:27:00.0")]
    net = golden.nets[0].net
    assert net is not None and (net.name, net.rail, net.plane) == ("mlx5_0", 0, 1)
    snapshot = snapshot_xml(golden)
    assert '<pcilink target="0000:27:00.0"' in snapshot and 'rail="0" plane="1"' in snapshot
    assert snapshot_xml(parse_topology(snapshot)) == snapshot
    assert compare_topologies(parse_topology(snapshot), golden) == []
    assert compare_topologies(golden, parse_topology(railed)) == []
    # the link gone, the port cabled to another rail and plane
    moved = railed.replace('<pcilink target="0000:27:00.0"/>', "").replace(
        'rail="0" plane="1"', 'rail="3" plane="0"'
    )
    found = compare_topologies(golden, parse_topology(moved))
    assert [(d.kind, d.device, d.expected, d.actual) for d in found] == [
        ("nic_rail_changed", "mlx5_0:1", "rail 0", "rail 3"),
        ("nic_rail_changed", "mlx5_0:1", "plane 1", "plane 0"),
        ("pcilink_missing", "0000:15:00.0", "linked to 0000:27:00.0", "no link"),
    ]
    # a dump without rail attributes (an older NCCL) is not a rail change
    assert kinds(golden, parse_topology(linked)) == []
