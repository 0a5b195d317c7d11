"""The NCCL topology model on hand-written DGX-H100-like dumps: parsing, the golden
snapshot, and the differences each variant must produce (and only those)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.fabric.nccl_topo.diff import DIFFERENCE_KINDS, compare_topologies
from denpex.fabric.nccl_topo.model import (
    Cpu,
    Gpu,
    Net,
    NvLink,
    Pci,
    Topology,
    TopologyError,
    parse_topology,
    snapshot_xml,
)

TOPO = Path(__file__).parent / "fixtures" / "nccl_topo"


def load(name: str) -> Topology:
    return parse_topology((TOPO / name).read_bytes())


def summary(differences) -> list[tuple[str, str, str]]:
    return [(d.kind, d.device, d.path) for d in differences]


def test_parse_dgx_h100() -> None:
    topo = load("dgx_h100.xml")
    assert [cpu.numaid for cpu in topo.cpus] == ["0", "1"]
    assert len(topo.gpus) == 8 and len(topo.nets) == 10
    assert topo.nvlink_count() == 8 * 18
    assert topo.switches()[:2] == ["0000:15:00.0", "0000:27:00.0"] and len(topo.switches()) == 8
    gpu0 = topo.gpus[0]
    assert gpu0.path == "cpu 0 / pci 0000:15:00.0 / gpu 0000:18:00.0"
    assert gpu0.gpu == Gpu(
        dev=0,
        rank=0,
        sm=90,
        gdr=True,
        nvlinks=(
            NvLink("0000:05:00.0", 5, "0x068000"),
            NvLink("0000:06:00.0", 4, "0x068000"),
            NvLink("0000:07:00.0", 4, "0x068000"),
            NvLink("0000:08:00.0", 5, "0x068000"),
        ),
    )
    assert gpu0.gpu.nvlinks[0].bandwidth_gb_s(90) == 103.0
    assert gpu0.pci is not None and gpu0.pci.attr("link_speed") == "32.0 GT/s PCIe"
    nic0 = topo.nets[0]
    assert nic0.path == "cpu 0 / pci 0000:15:00.0 / nic 0000:17:00.0 / net mlx5_0:1"
    assert nic0.net == Net("mlx5_0", 0, 400000, 1, "0xa088c20300f1e200", True)
    # a dual-port NIC straight on a root port: two ports, one PCI function, under the CPU
    dual = [p for p in topo.nets if p.net and p.net.name == "mlx5_8"]
    assert [p.key for p in dual] == ["0000:c0:00.0 port 1", "0000:c0:00.0 port 2"]
    assert dual[1].path == "cpu 1 / nic 0000:c0:00.0 / net mlx5_8:2"


def test_snapshot_is_the_committed_golden_and_stable() -> None:
    dump = load("dgx_h100.xml")
    text = snapshot_xml(dump)
    assert text == (TOPO / "golden_dgx_h100.xml").read_text()
    again = parse_topology(text)
    assert snapshot_xml(again) == text
    assert compare_topologies(dump, again) == []
    assert 'rank="' not in text and "guid" not in text and "host_hash" not in text


def test_identical_topologies_have_no_differences() -> None:
    assert compare_topologies(load("golden_dgx_h100.xml"), load("dgx_h100.xml")) == []


def test_gpu_behind_another_switch() -> None:
    found = compare_topologies(load("golden_dgx_h100.xml"), load("dgx_h100_gpu_moved.xml"))
    path = "cpu 0 / pci 0000:15:00.0 / gpu 0000:2a:00.0"
    assert summary(found) == [
        ("gpu_moved", "0000:2a:00.0", path),
        ("pair_split", "gpu 0000:2a:00.0 + net mlx5_1:1", path),
    ]
    assert found[1].expected == "pci 0000:27:00.0" and found[1].actual == "cpu 0"
    assert found[0].describe() == (
        f"{path}: GPU 0000:2a:00.0 sits behind cpu 0 / pci 0000:15:00.0; the golden has it "
        "behind cpu 0 / pci 0000:27:00.0"
    )


def test_missing_and_fewer_nvlinks() -> None:
    found = compare_topologies(load("golden_dgx_h100.xml"), load("dgx_h100_nvlink_missing.xml"))
    assert summary(found) == [
        ("nvlink_missing", "0000:3a:00.0", "cpu 0 / pci 0000:37:00.0 / gpu 0000:3a:00.0"),
        ("nvlink_fewer", "0000:5d:00.0", "cpu 0 / pci 0000:5a:00.0 / gpu 0000:5d:00.0"),
    ]
    assert "no NVLink to 0000:07:00.0" in found[0].message and "82.4 GB/s" in found[0].message
    assert (found[1].expected, found[1].actual) == ("5 to 0000:05:00.0", "4 to 0000:05:00.0")


def test_nic_at_lower_speed() -> None:
    found = compare_topologies(load("golden_dgx_h100.xml"), load("dgx_h100_nic_200g.xml"))
    assert summary(found) == [
        (
            "nic_speed_lower",
            "mlx5_3:1",
            "cpu 0 / pci 0000:5a:00.0 / nic 0000:5c:00.0 / net mlx5_3:1",
        )
    ]
    assert (found[0].expected, found[0].actual) == ("400000", "200000")


def _without_gpu(topo: Topology, busid: str) -> Topology:
    def prune(pcis: tuple[Pci, ...]) -> tuple[Pci, ...]:
        return tuple(
            dataclasses.replace(p, children=prune(p.children)) for p in pcis if p.busid != busid
        )

    return Topology.of(tuple(dataclasses.replace(c, children=prune(c.children)) for c in topo.cpus))


def test_subset_of_gpus_and_missing_ports() -> None:
    golden = load("golden_dgx_h100.xml")
    part = _without_gpu(golden, "0000:db:00.0")
    assert summary(compare_topologies(golden, part)) == [
        ("gpu_missing", "0000:db:00.0", "cpu 1 / pci 0000:d8:00.0 / gpu 0000:db:00.0")
    ]
    assert compare_topologies(golden, part, allow_subset=True) == []
    # the other way round the GPU is one the golden does not know
    assert [d.kind for d in compare_topologies(part, golden, allow_subset=True)] == ["gpu_extra"]


def test_gdr_off_and_sm_change() -> None:
    text = (TOPO / "dgx_h100.xml").read_text()
    changed = text.replace('sm="90" rank="0" gdr="1"', 'sm="80" rank="0" gdr="0"', 1)
    changed = changed.replace(
        'guid="0xa088c20300f1e208" maxconn="131072" gdr="1"', 'guid="0x1" maxconn="1" gdr="0"'
    )
    found = compare_topologies(load("golden_dgx_h100.xml"), parse_topology(changed))
    assert [(d.kind, d.device) for d in found] == [
        ("gpu_sm", "0000:18:00.0"),
        ("gdr_off", "0000:18:00.0"),
        ("gdr_off", "mlx5_1:1"),
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("not xml", "not well-formed"),
        ("<topology/>", "expected NCCL's <system>"),
        ('<system><cpu numaid="0"><pci busid="zz"/></cpu></system>', "is not a PCI address"),
        (
            '<system><cpu><pci busid="0000:01:00.0"><gpu dev="x"/></pci></cpu></system>',
            "not a number",
        ),
        ('<!DOCTYPE s [<!ENTITY a "b">]><system/>', "refused"),
        ('<system><cpu><nic><net dev="0"/></nic></cpu></system>', "without a name"),
    ],
)
def test_bad_input_says_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(TopologyError, match=error):
        parse_topology(text)


# -- property: any topology survives snapshot → parse, and one mutation is one difference
hexbyte = st.integers(0, 255).map(lambda n: f"{n:02x}")


@st.composite
def topologies(draw) -> Topology:
    buses = draw(st.lists(hexbyte, min_size=2, max_size=12, unique=True))
    cpus: list[Cpu] = []
    for numa in range(draw(st.integers(1, 2))):
        switches = []
        while buses and draw(st.booleans()):
            sw = buses.pop()
            kids: list[Pci] = []
            for bus in [buses.pop() for _ in range(min(len(buses), draw(st.integers(0, 2))))]:
                if draw(st.booleans()):
                    links = tuple(
                        NvLink(f"0000:{t}:00.0", c, "0x068000")
                        for t, c in sorted(
                            draw(st.dictionaries(hexbyte, st.integers(1, 9), max_size=3)).items()
                        )
                    )
                    gpu = Gpu(
                        dev=len(kids), sm=draw(st.sampled_from([80, 90])), gdr=True, nvlinks=links
                    )
                    kids.append(Pci(f"0000:{bus}:00.0", (("class", "0x030200"),), gpu=gpu))
                else:
                    net = Net(
                        f"mlx5_{bus}",
                        0,
                        draw(st.sampled_from([100000, 200000, 400000])),
                        1,
                        None,
                        True,
                    )
                    kids.append(Pci(f"0000:{bus}:00.0", (("class", "0x020700"),), nets=(net,)))
            switches.append(
                Pci(
                    f"0000:{sw}:00.0",
                    (("class", "0x060400"),),
                    children=tuple(sorted(kids, key=lambda p: p.busid)),
                )
            )
        cpus.append(Cpu(str(numa), (), tuple(sorted(switches, key=lambda p: p.busid))))
    return Topology.of(tuple(cpus))


@settings(max_examples=60, deadline=None, print_blob=True)
@given(topologies())
def test_snapshot_round_trip(topo: Topology) -> None:
    text = snapshot_xml(topo)
    back = parse_topology(text)
    assert back == topo
    assert snapshot_xml(back) == text
    assert compare_topologies(topo, back) == []
    assert {d.kind for d in compare_topologies(topo, Topology.of(()))} <= set(DIFFERENCE_KINDS)


@settings(max_examples=60, deadline=None, print_blob=True)
@given(topologies())
def test_a_slower_port_is_exactly_one_difference(topo: Topology) -> None:
    slow = snapshot_xml(topo).replace('speed="400000"', 'speed="200000"', 1)
    if slow == snapshot_xml(topo):
        return
    found = compare_topologies(topo, parse_topology(slow))
    assert [d.kind for d in found] == ["nic_speed_lower"]
