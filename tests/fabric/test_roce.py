"""The RoCE PFC/congestion collector: recorded mlx5 `ethtool -S` outputs (through a stand-in
script), ECN/CNP hw_counters, a PFC storm scripted over several polls, and the dashboard."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from hypothesis import given, seed
from hypothesis import strategies as st

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.fabric.ib.collector import IbCollector
from denpex.fabric.roce.collector import RoceCollector, roce_ports
from denpex.fabric.roce.ethtool import (
    GLOBAL,
    PauseCounter,
    parse_ethtool_stats,
    pause_counters,
    priority_discards,
    storm_level,
)

FIXTURES = Path(__file__).parent / "fixtures"
DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "denpex-fabric.json"
S = 1_000_000_000
T0 = 1_790_000_000 * S
NETDEV = "ens1f0np0"


def tree(tmp_path: Path, name: str) -> tuple[Roots, Path]:
    copy = tmp_path / name
    shutil.copytree(FIXTURES / name, copy)
    return Roots(sysfs=str(copy / "sys")), copy


def collector(root: Path, roots: Roots, **options: object) -> RoceCollector:
    return RoceCollector(roots, {"ethtool_command": ["sh", str(root / "ethtool.sh")], **options})


def bump(root: Path, netdev: str, **steps: int) -> None:
    """Add to counters of the recorded `ethtool -S` output of `netdev`."""
    path = root / "ethtool" / f"{netdev}.txt"
    text = path.read_text()
    for name, step in steps.items():
        pattern = re.compile(rf"^(\s+{name}: )(\d+)$", re.M)
        assert pattern.search(text), name
        text = pattern.sub(lambda m, s=step: f"{m[1]}{int(m[2]) + s}", text)
    path.write_text(text)


def add_stat(root: Path, netdev: str, name: str, value: int) -> None:
    """Add a counter the recorded output lacks (newer drivers print more of them)."""
    path = root / "ethtool" / f"{netdev}.txt"
    path.write_text(path.read_text() + f"     {name}: {value}\n")


def to_global_pause(root: Path, netdev: str) -> None:
    """The port in link-level (global) pause mode: mlx5 prints rx/tx_global_pause* in place
    of the per-priority pause counters."""
    path = root / "ethtool" / f"{netdev}.txt"
    kept = [ln for ln in path.read_text().splitlines() if not re.search(r"_prio\d_pause", ln)]
    lines = [
        "     rx_global_pause: 1000",
        "     rx_global_pause_duration: 2000",
        "     tx_global_pause: 10",
        "     tx_global_pause_duration: 20",
        "     rx_global_pause_transition: 500",
    ]
    path.write_text("\n".join(kept + lines) + "\n")


class Poller:
    def __init__(self, collector: RoceCollector, roots: Roots, step_s: float = 10.0) -> None:
        self.collector, self.roots, self.step_ns = collector, roots, int(step_s * S)
        self.now = T0

    def poll(self) -> list:
        out = self.collector.collect(CollectContext(self.roots, "roce-node", now_ns=self.now))
        self.now += self.step_ns
        return out


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def metrics(out: list) -> dict[tuple[str, str, str, str], float]:
    return {
        (
            e.body,
            e.attrs.get("netdev", ""),
            e.attrs.get("direction", "") + e.attrs.get("priority", ""),
            e.attrs.get("counter", ""),
        ): e.attrs["value"]
        for e in out
        if isinstance(e, Event) and e.kind == "metric"
    }


def test_parse_recorded_mlx5_output() -> None:
    stats = parse_ethtool_stats((FIXTURES / "roce_node" / "ethtool" / f"{NETDEV}.txt").read_text())
    assert len(stats) > 200 and "NIC statistics" not in stats
    assert stats["rx_prio3_pause"] == 112840 and stats["tx_prio3_pause_duration"] == 7011920
    assert stats["rx_pause_ctrl_phy"] == 201051 and stats["tx_pause_storm_error_events"] == 0
    pauses = pause_counters(stats)
    assert len(pauses) == 32  # rx/tx × 8 priorities × (frames, duration)
    assert pauses[PauseCounter("rx", "3", "pause_duration")] == 9120331
    assert PauseCounter("rx", "3", "pause_transition") not in pauses
    assert parse_ethtool_stats("NIC statistics:\n     odd: n/a\n  rx_x: 5\n") == {"rx_x": 5}


@seed(20261130)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_]{0,30}", fullmatch=True),
        st.integers(min_value=0, max_value=2**64 - 1),
    )
)
def test_parser_round_trip(stats: dict[str, int]) -> None:
    text = "NIC statistics:\n" + "".join(f"     {k}: {v}\n" for k, v in stats.items())
    assert parse_ethtool_stats(text) == stats


def test_storm_level() -> None:
    limits = {"storm_pause_frames_per_second": 20000, "storm_pause_ratio": 0.5}
    assert storm_level(30000, None, limits) and storm_level(10, 0.9, limits)
    assert not storm_level(100, 0.1, limits) and not storm_level(None, None, limits)


def test_available_and_netdev_mapping(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    ports = {(d, n) for d, _, _, n in roce_ports(roots)}
    # mlx5_0 through gid_attrs/ndevs, mlx5_1 through device/net; the IB port is not RoCE
    assert ports == {("mlx5_0", NETDEV), ("mlx5_1", "ens1f1np1")}
    ok, reason = collector(root, roots).available()
    assert ok and "ens1f0np0, ens1f1np1" in reason
    missing = RoceCollector(roots, {"ethtool_command": str(tmp_path / "no-ethtool")})
    ok, reason = missing.available()
    assert ok and "not found" in reason and "ECN/CNP" in reason
    ib_roots, _ = tree(tmp_path, "ib_only")
    ok, reason = RoceCollector(ib_roots).available()
    assert not ok and "link_layer Ethernet" in reason


def test_metrics_and_congestion_rates(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    roce = collector(root, roots)
    poller = Poller(roce, roots)
    first = poller.poll()
    got = metrics(first)
    assert got[("roce_pause_frames_total", NETDEV, "rx3", "")] == 112840
    assert got[("roce_pause_duration_seconds_total", NETDEV, "tx3", "")] == 7.01192
    assert got[("roce_rx_pause_ctrl_frames_total", "ens1f1np1", "", "")] == 20110
    assert got[("roce_ecn_marked_packets_total", NETDEV, "", "")] == 1820
    assert got[("roce_fec_corrected_bits_total", NETDEV, "", "")] == 2231
    assert {k[0] for k in got} <= set(roce.metrics_help)
    assert all(e.host == "roce-node" and e.ts_ns == T0 for e in first if isinstance(e, Event))
    assert evidence(first) == [] and roce.degraded() is None

    hw = roots.sys("class", "infiniband", "mlx5_0", "ports", "1", "hw_counters", "np_cnp_sent")
    hw.write_text("2790\n")
    bump(root, NETDEV, rx_prio3_pause=5000, rx_prio3_pause_duration=1_000_000)
    second = poller.poll()
    got = metrics(second)
    assert got[("roce_congestion_per_second", NETDEV, "", "np_cnp_sent")] == 100
    assert got[("roce_pause_frames_per_second", NETDEV, "rx3", "")] == 500
    assert got[("roce_pause_duration_ratio", NETDEV, "rx3", "")] == 0.1
    assert got[("roce_pause_frames_per_second", NETDEV, "tx0", "")] == 0
    assert {k[0] for k in got} <= set(roce.metrics_help)
    assert evidence(second) == []  # routine PFC is not a storm


def test_pfc_storm_over_several_polls(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    poller = Poller(collector(root, roots), roots)
    poller.poll()
    found: list[tuple[int, Evidence]] = []
    for i in range(1, 7):
        if i <= 4:  # the switch pauses priority 3 for 80 % of every interval
            bump(root, NETDEV, rx_prio3_pause=300_000, rx_prio3_pause_duration=8_000_000)
        found += [(i, e) for e in evidence(poller.poll())]
    assert [(i, e.signature) for i, e in found] == [(3, "net.link_down.pfc_storm")]
    storm = found[0][1]
    assert (storm.category, storm.severity, storm.action) == (
        "net.link_down",
        "error",
        "check_fabric",
    )
    assert storm.event.host == "roce-node" and storm.event.source == "roce"
    assert storm.captures["netdev"] == NETDEV and storm.captures["priority"] == "3"
    assert storm.captures["direction"] == "rx" and storm.captures["paused_ratio"] == "0.800"
    assert "PFC storm" in storm.summary and "30000 pause frames/s" in storm.summary
    # calm for a poll (i = 5, 6) re-arms: a new storm is reported again
    for _ in range(3):
        bump(root, NETDEV, tx_prio3_pause=400_000)
        last = evidence(poller.poll())
    assert [(e.captures["direction"], e.captures["priority"]) for e in last] == [("tx", "3")]


def test_storm_prevention_and_resets(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    poller = Poller(collector(root, roots), roots)
    poller.poll()
    bump(root, "ens1f1np1", tx_pause_storm_error_events=1)
    (prevented,) = evidence(poller.poll())
    assert prevented.signature == "net.link_down.pfc_storm_prevention"
    assert prevented.captures["netdev"] == "ens1f1np1"
    # driver reload: counters restart low; no negative rate, no storm from the drop
    path = root / "ethtool" / f"{NETDEV}.txt"
    path.write_text(re.sub(r"(prio\d_pause(?:_duration)?: )\d+", r"\g<1>7", path.read_text()))
    out = poller.poll()
    assert evidence(out) == []
    assert all(e.attrs["value"] >= 0 for e in out if isinstance(e, Event) and e.kind == "metric")
    assert ("roce_pause_frames_per_second", NETDEV, "rx3", "") not in metrics(out)


def test_ethtool_failures_and_timeouts(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    (root / "ethtool" / "ens1f1np1.txt").unlink()
    roce = collector(root, roots)
    got = metrics(roce.collect(CollectContext(roots, "n", now_ns=T0)))
    assert got[("roce_ethtool_failures_total", "ens1f1np1", "", "")] == 1
    assert ("roce_pause_frames_total", NETDEV, "rx3", "") in got
    assert roce.degraded() is None  # one bad netdev is a metric, not blindness
    hung = RoceCollector(
        roots, {"ethtool_command": ["sh", "-c", "sleep 5"], "ethtool_timeout_s": 0.2}
    )
    out = hung.collect(CollectContext(roots, "n", now_ns=T0))
    assert metrics(out)[("roce_ecn_marked_packets_total", NETDEV, "", "")] == 1820
    blind = hung.degraded()
    assert blind is not None and "timed out" in blind and "ens1f1np1" in blind


def test_global_pause_mode_is_read_and_storms_are_seen(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    to_global_pause(root, NETDEV)
    stats = parse_ethtool_stats((root / "ethtool" / f"{NETDEV}.txt").read_text())
    pauses = pause_counters(stats)
    assert pauses == {
        PauseCounter("rx", GLOBAL, "pause"): 1000,
        PauseCounter("rx", GLOBAL, "pause_duration"): 2000,
        PauseCounter("tx", GLOBAL, "pause"): 10,
        PauseCounter("tx", GLOBAL, "pause_duration"): 20,
    }
    poller = Poller(collector(root, roots), roots)
    assert metrics(poller.poll())[("roce_pause_frames_total", NETDEV, "rxglobal", "")] == 1000
    found = []
    for _ in range(3):
        bump(root, NETDEV, rx_global_pause=300_000, rx_global_pause_duration=9_000_000)
        found += evidence(poller.poll())
    (storm,) = found
    assert storm.signature == "net.link_down.pfc_storm"
    assert (storm.captures["netdev"], storm.captures["priority"]) == (NETDEV, GLOBAL)


def test_post_fec_ber_from_symbol_errors_and_received_bits(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    add_stat(root, NETDEV, "rx_bits_phy", 10**15)
    poller = Poller(collector(root, roots), roots)
    first = metrics(poller.poll())
    assert first[("roce_rx_bits_total", NETDEV, "", "")] == 10**15
    assert ("roce_post_fec_bit_error_ratio", NETDEV, "", "") not in first  # no interval yet
    bump(root, NETDEV, rx_bits_phy=4 * 10**12, rx_pcs_symbol_err_phy=2)  # 5e-13: healthy
    healthy = poller.poll()
    assert metrics(healthy)[("roce_post_fec_bit_error_ratio", NETDEV, "", "")] == 5e-13
    assert evidence(healthy) == []
    bump(root, NETDEV, rx_bits_phy=4 * 10**12, rx_pcs_symbol_err_phy=400)  # 1e-10
    (bad,) = evidence(poller.poll())
    assert (bad.signature, bad.category, bad.severity) == (
        "net.ib_error.roce_post_fec_ber",
        "net.ib_error",
        "error",
    )
    assert bad.captures["errors"] == "400" and "1.00e-10" in bad.summary
    bump(root, NETDEV, rx_bits_phy=4 * 10**12, rx_pcs_symbol_err_phy=400)
    assert evidence(poller.poll()) == []  # still bad: reported once
    # the netdev without rx_bits_phy (an older driver) gets no ratio, only the counter
    other = metrics(poller.poll())
    assert ("roce_post_fec_bit_error_ratio", "ens1f1np1", "", "") not in other
    assert ("roce_rx_pcs_symbol_errors_total", "ens1f1np1", "", "") in other


def test_discards_on_a_lossless_priority(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    poller = Poller(collector(root, roots), roots)
    poller.poll()
    bump(root, NETDEV, rx_prio0_discards=50, rx_prio3_discards=7)
    out = poller.poll()
    # priority 3 is paused by PFC (lossless); priority 0 is lossy: a metric only
    assert [(e.signature, e.captures["priority"]) for e in evidence(out)] == [
        ("net.ib_error.roce_lossless_discards", "3")
    ]
    assert metrics(out)[("roce_rx_priority_discards_total", NETDEV, "0", "")] == 50
    stats = parse_ethtool_stats((root / "ethtool" / f"{NETDEV}.txt").read_text())
    assert priority_discards(stats)["3"] == 7
    configured = Poller(collector(root, roots, lossless_priorities=[0]), roots)
    configured.poll()
    bump(root, NETDEV, rx_prio0_discards=1)
    assert [e.captures["priority"] for e in evidence(configured.poll())] == ["0"]
    # in global-pause mode every priority is lossless
    to_global_pause(root, NETDEV)
    moded = Poller(collector(root, roots), roots)
    moded.poll()
    bump(root, NETDEV, rx_prio0_discards=2)
    (found,) = evidence(moded.poll())
    assert found.captures["priority"] == "0" and found.captures["mode"] == "global pause"


def test_pci_signal_integrity_errors(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    poller = Poller(collector(root, roots), roots)
    poller.poll()
    bump(root, "ens1f1np1", rx_pci_signal_integrity=3)
    (found,) = evidence(poller.poll())
    assert found.signature == "host.pcie_error.roce_pci_signal_integrity"
    assert found.category == "host.pcie_error" and found.captures["rx_increase"] == "3"
    assert evidence(poller.poll()) == []  # calm again: re-armed, nothing new


def test_congestion_hw_counters_wrap_at_32_bits(tmp_path: Path) -> None:
    roots, root = tree(tmp_path, "roce_node")
    hw = roots.sys("class", "infiniband", "mlx5_0", "ports", "1", "hw_counters", "np_cnp_sent")
    hw.write_text(f"{2**32 - 100}\n")
    poller = Poller(collector(root, roots), roots)
    poller.poll()
    hw.write_text("100\n")  # a 32-bit Q counter wrapped: 200 more, not a reset
    got = metrics(poller.poll())
    assert got[("roce_congestion_per_second", NETDEV, "", "np_cnp_sent")] == 20


def test_dashboard_uses_known_metrics_and_a_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    known = {
        f"denpex_{name}" for name in {**IbCollector.metrics_help, **RoceCollector.metrics_help}
    }
    used = set()
    for panel in board["panels"]:
        if panel.get("type") == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            used |= set(re.findall(r"denpex_[a-z0-9_]+", target["expr"]))
    assert used and used <= known, used - known
    assert {"denpex_ib_port_state", "denpex_roce_pause_duration_ratio"} <= used
