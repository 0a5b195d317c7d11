"""Rails from the NCCL topology: each GPU paired with the NIC port under its PCI switch,
the rail NCCL's `rail` attribute or the port's index among the paired ports; and the
collector handing the newest dump's rails to the agent as `host_rail` rows."""

from __future__ import annotations

import os
import re
from pathlib import Path

from denpex.agent.host_state import host_links
from denpex.core.collector import CollectContext
from denpex.core.roots import Roots
from denpex.fabric.nccl_topo.collector import NcclTopoCollector
from denpex.fabric.nccl_topo.model import parse_topology
from denpex.fabric.nccl_topo.rails import gpu_rails

TOPO = Path(__file__).parent / "fixtures" / "nccl_topo"
H100 = (TOPO / "dgx_h100.xml").read_text()


def test_a_dgx_h100s_gpus_each_get_the_nic_beside_them_as_their_rail() -> None:
    rails = gpu_rails(parse_topology(H100))
    assert [(r.gpu, r.nic_port, r.rail) for r in rails] == [
        ("0000:18:00.0", "mlx5_0/1", 0),
        ("0000:2a:00.0", "mlx5_1/1", 1),
        ("0000:3a:00.0", "mlx5_2/1", 2),
        ("0000:5d:00.0", "mlx5_3/1", 3),
        ("0000:9a:00.0", "mlx5_4/1", 4),
        ("0000:ab:00.0", "mlx5_5/1", 5),
        ("0000:ba:00.0", "mlx5_6/1", 6),
        ("0000:db:00.0", "mlx5_7/1", 7),
    ]  # mlx5_8 (two ports on the CPU, no GPU near) is the front end: no rail


def test_nccls_rail_attribute_wins_over_the_index() -> None:
    # cabled the other way round: NCCL's dump says mlx5_0 is on rail 7
    railed = H100.replace('name="mlx5_0"', 'name="mlx5_0" rail="7"', 1)
    assert 'rail="7"' in railed
    first = gpu_rails(parse_topology(railed))[0]
    assert (first.gpu, first.nic, first.rail) == ("0000:18:00.0", "mlx5_0", 7)


def test_two_gpus_under_one_switch_with_two_ports_are_paired_in_order() -> None:
    # move GPU 1 (and its NIC) under GPU 0's PCI switch, as on a DGX A100
    topo = parse_topology(H100)
    gpu1 = re.search(r'\s*<pci busid="0000:2a:00\.0".*?</pci>', H100, re.S)
    nic1 = re.search(r'\s*<pci busid="0000:29:00\.0".*?</pci>', H100, re.S)
    assert gpu1 and nic1 and topo.gpus[1].key == "0000:2a:00.0"
    text = H100.replace(gpu1.group(0), "").replace(nic1.group(0), "")
    anchor = '<pci busid="0000:15:00.0"'
    head, tail = text.split(anchor, 1)
    first_line_end = tail.index(">") + 1
    text = (
        head
        + anchor
        + tail[:first_line_end]
        + gpu1.group(0)
        + nic1.group(0)
        + tail[first_line_end:]
    )
    rails = {r.gpu: (r.nic, r.rail) for r in gpu_rails(parse_topology(text))}
    assert rails["0000:18:00.0"] == ("mlx5_0", 0) and rails["0000:2a:00.0"] == ("mlx5_1", 1)


def test_the_collector_ships_the_newest_dumps_rails(tmp_path: Path) -> None:
    old, new = tmp_path / "job-a.xml", tmp_path / "job-b.xml"
    old.write_text(H100.replace('name="mlx5_0"', 'name="mlx5_0" rail="5"', 1))
    new.write_text(H100)
    os.utime(old, (1_000_000, 1_000_000))
    collector = NcclTopoCollector(Roots(), {"dump_files": str(tmp_path / "*.xml")})
    assert collector.host_links() == []  # nothing polled yet: nothing to say
    collector.collect(CollectContext(Roots(), "n"))
    rows = host_links([collector])
    assert len(rows) == 8
    assert rows[0] == ("host_rail", {"gpu": "0000:18:00.0", "nic": "mlx5_0/1", "rail": "0"})
    new.unlink()  # the newest dump gone: the older one is what the host knows now
    collector.collect(CollectContext(Roots(), "n"))
    assert host_links([collector])[0][1]["rail"] == "5"
