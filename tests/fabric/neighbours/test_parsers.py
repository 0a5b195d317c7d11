"""The neighbour tools' parsers on their real output (SOURCES.md says where each fixture
comes from): ibnetdiscover's topology file, iblinkinfo's link list, lldpcli's JSON in both
its forms; and on junk, where each says it is not that tool's output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.fabric.neighbours.ibdiags import parse_iblinkinfo, parse_ibnetdiscover, switch_name
from denpex.fabric.neighbours.lldp import parse_lldp_neighbors, switch_port

HERE = Path(__file__).parent


def test_ibnetdiscover_links_each_hca_of_a_dgx_to_its_rail_leaf() -> None:
    links = parse_ibnetdiscover((HERE / "ibnetdiscover.out").read_text())
    hcas = {
        link.node_desc: (link.port, link.port_guid, link.peer_guid, link.peer_port, link.peer_desc)
        for link in links
        if link.node_type == "Ca"
    }
    assert hcas == {
        "a06-p1-dgx-02-c01 HCA-1": (1, "e09d7303008594bc", "2c5eab0300b87a80", 1,
                                    "MF0;A09-P1-IBLEAF-01-02:MQM9701/U1"),
        "a06-p1-dgx-02-c01 HCA-2": (1, "e09d7303008594c0", "2c5eab0300b87c80", 1,
                                    "MF0;A09-P1-IBLEAF-02-02:MQM9701/U1"),
        "a06-p1-dgx-02-c01 HCA-5": (1, "e09d730300857d74", "2c5eab0300b87b80", 1,
                                    "MF0;A09-P1-IBLEAF-03-02:MQM9701/U1"),
        "a06-p1-dgx-02-c01 HCA-6": (1, "e09d730300857d78", "2c5eab0300b87bc0", 1,
                                    "MF0;A09-P1-IBLEAF-04-02:MQM9701/U1"),
    }  # fmt: skip
    # the switches' own sides: leaf 04-02 port 2 reaches the next host's HCA-6, port 35 a spine
    leaf = {
        link.port: link
        for link in links
        if link.node_type == "Switch" and link.node_guid == "2c5eab0300b87bc0"
    }
    assert (leaf[2].peer_type, leaf[2].peer_desc) == ("Ca", "a06-p1-dgx-02-c02 HCA-6")
    assert (leaf[35].peer_type, leaf[35].peer_port) == ("Switch", 15)
    assert leaf[35].peer_desc == "MF0;A10-P1-IBSPINE-02:MQM9701/U1"
    assert all(link.port_guid is None for link in leaf.values())  # a switch port has none


def test_iblinkinfo_reads_active_ca_links_and_their_port_guids() -> None:
    links = parse_iblinkinfo((HERE / "iblinkinfo.out").read_text())
    assert [(lk.node_desc, lk.port, lk.port_guid, lk.peer_port, lk.peer_desc) for lk in links] == [
        ("MT25408 ConnectX Mellanox Technologies", 1, "0002c90300002779", 1, "kvm mlx4_0"),
        ("hostname mlx4_0", 1, "0002c90300002f79", 1, "MT25408 ConnectX Mellanox Technologies"),
    ]


def test_iblinkinfo_leaves_down_ports_out_and_reads_switch_sections() -> None:
    # a switch's section as iblinkinfo prints it: no GUID per line, a down port without peer
    switch_line = (
        "           2    1[  ] ==( 4X          10.0 Gbps Active/  LinkUp)==>       3    1[  ] "
        '"centos-data-202 HCA-1" ( )'
    )
    down = '           2    5[  ] ==(                Down/ Polling)==>             [  ] "" ( )'
    text = (
        f"Switch: 0x0002c9020046c588 Infiniscale-IV Mellanox Technologies:\n{switch_line}\n{down}\n"
    )
    (link,) = parse_iblinkinfo(text)
    assert (link.node_type, link.node_guid, link.port, link.port_guid) == (
        "Switch", "0002c9020046c588", 1, None,
    )  # fmt: skip


def test_lldpcli_json0_and_json_name_the_same_neighbour() -> None:
    (json0,) = parse_lldp_neighbors((HERE / "lldp_json0.json").read_text())
    (plain,) = parse_lldp_neighbors((HERE / "lldp_json.json").read_text())
    assert json0 == plain
    assert (json0.interface, json0.chassis_name, json0.chassis_id) == (
        "eth0", "ns-2.example.com", "00:00:00:00:00:02",
    )  # fmt: skip
    assert switch_port(json0) == "eth1"  # a MAC PortID names no port: the description does


def test_lldpcli_json_with_several_interfaces_and_an_unnamed_chassis() -> None:
    # -f json turns "interface" into a list of one-key objects once there are two, and keys
    # a chassis without SysName by its fields: both shapes from the fixture's own values
    entry = json.loads((HERE / "lldp_json.json").read_text())["lldp"]["interface"]["eth0"]
    unnamed = {**entry, "chassis": entry["chassis"]["ns-2.example.com"]}
    ifname = {**entry, "port": {**entry["port"], "id": {"type": "ifname", "value": "swp12"}}}
    text = json.dumps({"lldp": {"interface": [{"eth0": unnamed}, {"eth2": ifname}]}})
    first, second = parse_lldp_neighbors(text)
    assert (first.interface, first.chassis_name, first.chassis_id) == (
        "eth0", None, "00:00:00:00:00:02",
    )  # fmt: skip
    assert (second.interface, second.chassis_name, switch_port(second)) == (
        "eth2", "ns-2.example.com", "swp12",
    )  # fmt: skip
    assert parse_lldp_neighbors('{"lldp": {}}') == []  # no neighbours heard


def test_switch_names() -> None:
    assert switch_name("MF0;A09-P1-IBLEAF-04-02:MQM9701/U1", "2c5e") == "A09-P1-IBLEAF-04-02"
    # every unnamed switch of a model says the same: the GUID tells them apart
    assert switch_name("Infiniscale-IV Mellanox Technologies", "0002c9") == "0002c9"
    assert switch_name("l-2-3 IS5030", "0002c9") == "l-2-3 IS5030"
    # a default description and no GUID (iblinkinfo without --line) names no one switch
    assert switch_name("Infiniscale-IV Mellanox Technologies", None) == ""


@pytest.mark.parametrize(
    ("parse", "text", "says"),
    [
        (parse_ibnetdiscover, "ibstat: no such device\n", "not ibnetdiscover output"),
        (parse_iblinkinfo, "CA: nothing here\n", "not iblinkinfo output"),
        (parse_lldp_neighbors, "Interface: eth0", "not JSON"),
        (parse_lldp_neighbors, '{"lldp-deleted": {}}', "'lldp'"),
    ],
)
def test_other_text_is_refused_with_the_reason(parse, text, says) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=says):
        parse(text)


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list('[]()"#SHCa0123456789abcdef=:x \t\n-LinkUp>')), max_size=300
    )
)
def test_parsers_only_ever_raise_value_error(text: str) -> None:
    for parse in (parse_ibnetdiscover, parse_iblinkinfo, parse_lldp_neighbors):
        try:
            parse(text)
        except ValueError:
            pass
