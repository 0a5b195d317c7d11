"""The `neighbours` collector on a fixture sysfs (the four HCAs of the DGX in the
ibnetdiscover fixture, and one RoCE port) with the tools replaced by scripts that print the
real output of SOURCES.md, refuse arguments the real tool would refuse, or fail."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

import pytest

from denpex.agent.host_state import host_links
from denpex.core.collector import CollectContext
from denpex.core.roots import Roots
from denpex.fabric.neighbours.collector import NeighboursCollector

HERE = Path(__file__).parent
T0 = 1_796_014_569_000_000_000
# the fixture host's HCAs as its sysfs names them: device → node GUID (= port 1 GUID)
HCAS = {
    "mlx5_0": "e09d:7303:0085:94bc",  # HCA-1 → leaf 01-02
    "mlx5_1": "e09d:7303:0085:94c0",  # HCA-2 → leaf 02-02
    "mlx5_2": "e09d:7303:0085:7d74",  # HCA-5 → leaf 03-02
    "mlx5_3": "e09d:7303:0085:7d78",  # HCA-6 → leaf 04-02
}


def _sysfs(root: Path, roce: bool = True) -> Roots:
    base = root / "sys" / "class" / "infiniband"
    for device, guid in HCAS.items():
        port = base / device / "ports" / "1"
        (port / "gids").mkdir(parents=True)
        (base / device / "node_guid").write_text(guid + "\n")
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "gids" / "0").write_text(f"fe80:0000:0000:0000:{guid}\n")
    if roce:
        port = base / "mlx5_4" / "ports" / "1"
        (port / "gids").mkdir(parents=True)
        (port / "gid_attrs" / "ndevs").mkdir(parents=True)
        (base / "mlx5_4" / "node_guid").write_text("0c42:a103:0022:1f44\n")
        (port / "link_layer").write_text("Ethernet\n")
        (port / "gid_attrs" / "ndevs" / "0").write_text("eth0\n")
    return Roots(sysfs=str(root / "sys"))


def _tool(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _gone(pid: int) -> bool:
    """Whether a process is dead: absent, or a zombie its new parent has not reaped yet."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _collector(tmp_path: Path, **options: object) -> tuple[NeighboursCollector, Roots]:
    roots = _sysfs(tmp_path)
    ibnd = _tool(
        tmp_path, "ibnetdiscover", f'[ "$#" -eq 0 ] || exit 2\ncat "{HERE}/ibnetdiscover.out"\n'
    )
    # lldpcli refuses what it does not know, as `lldpcli unknown command` exits 1
    lldp = _tool(
        tmp_path,
        "lldpcli",
        '[ "$*" = "-f json0 show neighbors" ] || { echo "unknown command" >&2; exit 1; }\n'
        f'cat "{HERE}/lldp_json0.json"\n',
    )
    merged = {"ibnetdiscover_command": ibnd, "lldpcli_command": lldp, **options}
    return NeighboursCollector(roots, merged), roots


def test_each_port_gets_its_peer_switch_from_ibnetdiscover_and_lldp(tmp_path: Path) -> None:
    collector, roots = _collector(tmp_path, ib_tool="ibnetdiscover")
    ok, said = collector.available()
    assert (
        ok and said == "peers of 4 InfiniBand port(s) by ibnetdiscover, 1 RoCE port(s) by lldpcli"
    )
    out = collector.collect(CollectContext(roots, "a06-p1-dgx-02-c01", now_ns=T0))
    assert collector.degraded() is None
    peers = {p.port: (p.switch, p.switch_port, p.switch_id, p.via) for p in collector.peers}
    assert peers == {
        "mlx5_0/1": ("A09-P1-IBLEAF-01-02", "1", "2c5eab0300b87a80", "ibnetdiscover"),
        "mlx5_1/1": ("A09-P1-IBLEAF-02-02", "1", "2c5eab0300b87c80", "ibnetdiscover"),
        "mlx5_2/1": ("A09-P1-IBLEAF-03-02", "1", "2c5eab0300b87b80", "ibnetdiscover"),
        "mlx5_3/1": ("A09-P1-IBLEAF-04-02", "1", "2c5eab0300b87bc0", "ibnetdiscover"),
        "mlx5_4/1": ("ns-2.example.com", "eth1", "00:00:00:00:00:02", "lldp"),
    }
    counts = {e.attrs["via"]: e.attrs["value"] for e in out if e.body == "fabric_neighbours"}
    assert counts == {"ibnetdiscover": 4, "lldp": 1}
    rows = host_links([collector])
    assert rows[0] == (
        "host_port_peer",
        {"port": "mlx5_0/1", "switch": "A09-P1-IBLEAF-01-02", "via": "ibnetdiscover",
         "switch_port": "1", "switch_id": "2c5eab0300b87a80"},
    )  # fmt: skip


# iblinkinfo's partial scan of one node: the fixture's block of the CA whose port GUID -G
# names (iblinkinfo prints only the node it was asked for), after checking the arguments
# the collector must pass, as iblinkinfo refuses an unknown CA ("can't open ...")
FAKE_IBLINKINFO = """#!{python}
import sys
args = sys.argv[1:]
if len(args) != 6 or args[0::2] != ["-C", "-P", "-G"]:
    sys.exit("iblinkinfo: unexpected arguments %r" % args)
lines = open("{fixture}").read().splitlines()
for head, link in zip(lines[0::2], lines[1::2]):
    if link.split()[0] == args[5]:
        print(head)
        print(link)
        sys.exit(0)
sys.exit("ibwarn: [1] main: discover failed")
"""


def test_iblinkinfo_scans_each_ports_own_node(tmp_path: Path) -> None:
    collector, roots = _collector(tmp_path)
    assert collector.options["ib_tool"] == "iblinkinfo"  # the default: cheap on any fabric
    # the fixture's HCA at port GUID 0002c90300002779 is this host's mlx5_0
    (tmp_path / "sys/class/infiniband/mlx5_0/ports/1/gids/0").write_text(
        "fe80:0000:0000:0000:0002:c903:0000:2779\n"
    )
    fake = FAKE_IBLINKINFO.format(python=sys.executable, fixture=HERE / "iblinkinfo.out")
    collector.options["iblinkinfo_command"] = _tool(tmp_path, "iblinkinfo", "")
    Path(collector.options["iblinkinfo_command"]).write_text(fake)
    collector.collect(CollectContext(roots, "n", now_ns=T0))
    ib = [p for p in collector.peers if p.via == "iblinkinfo"]
    assert [(p.port, p.switch, p.switch_port, p.switch_id) for p in ib] == [
        ("mlx5_0/1", "kvm mlx4_0", "1", None)
    ]
    # the other three ports' GUIDs are not in the fixture: each scan failed, each counted
    assert collector.failures == {"iblinkinfo": 3}
    assert "discover failed" in (collector.degraded() or "")


def test_without_the_tools_it_says_what_to_install(tmp_path: Path) -> None:
    collector, _ = _collector(
        tmp_path,
        ib_tool="ibnetdiscover",
        ibnetdiscover_command="denpex-no-such-ibnetdiscover",
        lldpcli_command="",
    )
    ok, said = collector.available()
    assert not ok
    assert (
        "4 InfiniBand port(s): `denpex-no-such-ibnetdiscover` not found (install infiniband-diags"
        in said
    )
    assert "1 RoCE port(s): `lldpcli` not found (install and run lldpd" in said
    empty = NeighboursCollector(Roots(sysfs=str(tmp_path / "nothing")), {})
    assert empty.available() == (
        False,
        f"no RDMA ports under {tmp_path / 'nothing' / 'class' / 'infiniband'} "
        "(no InfiniBand/RoCE device or driver)",
    )
    assert NeighboursCollector(_sysfs(tmp_path / "b"), {"ib_tool": "ibdiagnet"}).available() == (
        False,
        "ib_tool is 'ibdiagnet': one of ibnetdiscover, iblinkinfo, none",
    )


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ('echo "ibwarn: [1234] mad_rpc_open_port: can\'t open UMAD port ((null):0)" >&2\nexit 1\n',
         "neighbours: ibnetdiscover exit 1: ibwarn: [1234] mad_rpc_open_port"),
        ("echo 'ibstat output'\n", "neighbours: ibnetdiscover: not ibnetdiscover output"),
        # a wrapper whose child hangs: the child goes with it
        ('sleep 30 >/dev/null 2>&1 &\necho $! > "{tmp}/child.pid"\nwait\n',
         "neighbours: ibnetdiscover timed out after 0.5 s"),
    ],
)  # fmt: skip
def test_a_failing_tool_is_said_and_counted_and_the_rest_still_seen(
    tmp_path: Path, script: str, says: str
) -> None:
    collector, roots = _collector(tmp_path, timeout_s=0.5, ib_tool="ibnetdiscover")
    collector.options["ibnetdiscover_command"] = _tool(
        tmp_path, "broken", script.replace("{tmp}", str(tmp_path))
    )
    out = collector.collect(CollectContext(roots, "n", now_ns=T0))
    if (tmp_path / "child.pid").exists():
        pid = int((tmp_path / "child.pid").read_text())
        assert _gone(pid)
    assert (collector.degraded() or "").startswith(says)
    assert [p.via for p in collector.peers] == ["lldp"]  # LLDP still answered
    failures = [e for e in out if e.body == "fabric_neighbour_tool_failures_total"]
    assert [e.attrs["value"] for e in failures] == (
        [1] if "exit" in says or "timed" in says else []
    )
