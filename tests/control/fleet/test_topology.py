"""The site topology file `denpex server --topology` reads: defaults, per-host placement,
and a clear error for anything else."""

from __future__ import annotations

import pytest

from denpex.control.fleet.topology import parse_topology

TEXT = """
defaults: {rails: {"0000:18:00.0": rail-0, "0000:2a:00.0": rail-1}}
hosts:
  node-000: {rack: rack-00, switch: leaf-00, pdu: pdu-00, pool: a}
  node-001: {rack: rack-00, switch: leaf-01, rails: {"0000:18:00.0": rail-7}}
  node-002:
"""


def test_hosts_take_the_defaults_unless_they_say_otherwise():
    found = parse_topology(TEXT)
    assert sorted(found) == ["node-000", "node-001", "node-002"]
    first = found["node-000"]
    assert (first.rack, first.switch, first.pdu, first.pool) == (
        "rack-00",
        "leaf-00",
        "pdu-00",
        "a",
    )
    assert first.components() == [
        ("rack", "rack-00"),
        ("switch", "leaf-00"),
        ("pdu", "pdu-00"),
        ("pool", "a"),
        ("rail", "rail-0"),
        ("rail", "rail-1"),
    ]
    assert found["node-001"].rails == {"0000:18:00.0": "rail-7"}
    assert found["node-002"].switch is None and found["node-002"].rails["0000:2a:00.0"] == "rail-1"
    assert parse_topology('{"hosts": {"n": {"switch": "s"}}}')["n"].switch == "s"  # JSON too


@pytest.mark.parametrize(
    "text,words",
    [
        ("[1, 2]", "a mapping"),
        ("hosts: {n: {leaf: s}}", "hosts.n takes only"),
        ("hosts: [n]", "'hosts' maps"),
        ("hosts: {n: {rails: [x]}}", "rails maps"),
        ("hosts: {n: {", "not YAML"),
    ],
)
def test_a_malformed_topology_says_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        parse_topology(text)
