"""The InfiniBand/RoCE port collector on fixture trees whose port state and counters are
scripted between polls: flaps, a slow symbol-error rise, resets, a 32-bit wrap, a slow port."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.fabric.ib.collector import IbCollector
from denpex.fabric.ib.ports import (
    PortReading,
    expected_rates,
    parse_counter,
    parse_rate_gbps,
    parse_state,
)

FIXTURES = Path(__file__).parent / "fixtures"
S = 1_000_000_000
T0 = 1_790_000_000 * S


def tree(tmp_path: Path, name: str) -> Roots:
    copy = tmp_path / name
    shutil.copytree(FIXTURES / name, copy)
    return Roots(procfs=str(copy / "proc"), sysfs=str(copy / "sys"), devfs=str(copy / "dev"))


def port_file(roots: Roots, device: str, *parts: str) -> Path:
    return roots.sys("class", "infiniband", device, "ports", "1", *parts)


def set_counter(roots: Roots, device: str, name: str, value: int, hw: bool = False) -> None:
    port_file(roots, device, "hw_counters" if hw else "counters", name).write_text(f"{value}\n")


def add_counter(roots: Roots, device: str, name: str, step: int) -> None:
    path = port_file(roots, device, "counters", name)
    path.write_text(f"{int(path.read_text()) + step}\n")


def set_state(roots: Roots, device: str, state: str, phys: str) -> None:
    port_file(roots, device, "state").write_text(state + "\n")
    port_file(roots, device, "phys_state").write_text(phys + "\n")


class Poller:
    """Polls one collector with the clock advancing `step_s` each time."""

    def __init__(self, collector: IbCollector, roots: Roots, step_s: float = 5.0) -> None:
        self.collector, self.roots, self.step_ns = collector, roots, int(step_s * S)
        self.now = T0

    def poll(self) -> list:
        out = self.collector.collect(CollectContext(self.roots, "ib-node", now_ns=self.now))
        self.now += self.step_ns
        return out


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def metrics(out: list) -> dict[tuple[str, str, str], float]:
    return {
        (e.body, e.attrs["device"], e.attrs.get("counter", "")): e.attrs["value"]
        for e in out
        if isinstance(e, Event) and e.kind == "metric"
    }


def test_parsers() -> None:
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("5: LinkUp") == (5, "LinkUp")
    assert parse_state("") == (None, "") and parse_state(None) == (None, "")
    assert parse_rate_gbps("200 Gb/sec (4X HDR)\n") == 200.0
    assert parse_rate_gbps("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate_gbps("Unknown") is None
    assert parse_counter("18446744073709551615\n") == 2**64 - 1 and parse_counter("x") is None


def reading(device: str, rate: float, layer: str = "InfiniBand", state: int = 4) -> PortReading:
    return PortReading(device, "1", state, "", 5, "", rate, "", layer)


def test_expected_rate_is_the_majority_of_enough_peers() -> None:
    four = [reading(f"d{i}", 200.0) for i in range(3)] + [reading("d3", 100.0)]
    assert expected_rates(four, None, 3) == {"InfiniBand": 200.0}
    assert expected_rates(four[2:], None, 3) == {}  # two ports never outvote each other
    assert expected_rates(four, 400, 3) == {"InfiniBand": 400.0}
    mixed = [*four, reading("e0", 100.0, "Ethernet"), reading("e1", 50.0, "Ethernet", state=1)]
    assert expected_rates(mixed, None, 1)["Ethernet"] == 100.0  # down ports do not vote


def test_metrics_and_a_slow_port(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    collector = IbCollector(roots, {"full_counters_every": 1})
    ok, reason = collector.available()
    assert ok and "4 RDMA port(s)" in reason
    poller = Poller(collector, roots)
    first = poller.poll()
    got = metrics(first)
    assert got[("ib_port_state", "mlx5_0", "")] == 1
    assert got[("ib_port_rate_gigabits_per_second", "mlx5_3", "")] == 100
    assert got[("ib_port_transmit_bytes_total", "mlx5_0", "")] == 95113247301 * 4
    assert got[("ib_hw_counter_total", "mlx5_0", "out_of_sequence")] == 0
    rates = {n for n, *_ in got if n.endswith("_per_second") and "gigabits" not in n}
    assert rates == set()  # no rate on a first look
    assert all(e.host == "ib-node" and e.ts_ns == T0 for e in first if isinstance(e, Event))
    assert {name for name, *_ in got} <= set(collector.metrics_help)
    # the port that trained at 2X HDR warns; the others are fine
    (slow,) = evidence(first)
    assert (slow.signature, slow.category, slow.severity, slow.action) == (
        "net.link_down.ib_port_rate_degraded",
        "net.link_down",
        "warning",
        "check_fabric",
    )
    assert slow.captures["device"] == "mlx5_3" and slow.captures["port"] == "1"
    assert slow.captures["expected_gbps"] == "200" and slow.event.host == "ib-node"

    add_counter(roots, "mlx5_0", "port_xmit_data", 1_000_000)  # words: 4 MB in 5 s
    add_counter(roots, "mlx5_0", "port_rcv_packets", 500)
    second = poller.poll()
    rates = metrics(second)
    assert rates[("ib_port_transmit_bytes_per_second", "mlx5_0", "")] == 800_000
    assert rates[("ib_port_receive_packets_per_second", "mlx5_0", "")] == 100
    assert rates[("ib_port_transmit_bytes_per_second", "mlx5_1", "")] == 0
    assert {name for name, *_ in rates} <= set(collector.metrics_help)
    assert evidence(second) == []  # the slow port was reported once

    port_file(roots, "mlx5_3", "rate").write_text("200 Gb/sec (4X HDR)\n")
    assert evidence(poller.poll()) == []
    port_file(roots, "mlx5_3", "rate").write_text("100 Gb/sec (2X HDR)\n")
    assert [e.captures["device"] for e in evidence(poller.poll())] == ["mlx5_3"]  # re-armed


def test_configured_rate_and_cheap_polls(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(IbCollector(roots, {"expected_rate_gbps": 400}), roots)
    found = evidence(poller.poll())
    assert sorted(e.captures["device"] for e in found) == [f"mlx5_{i}" for i in range(4)]
    # default: the data counters only every third poll; flap counters every poll
    second = metrics(poller.poll())
    assert ("ib_link_downed_total", "mlx5_0", "") in second
    assert ("ib_port_transmit_bytes_total", "mlx5_0", "") not in second
    assert ("ib_hw_counter_total", "mlx5_0", "out_of_sequence") not in second


def test_flap_between_polls_and_repeated_flaps(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(IbCollector(roots, {"expected_rate_gbps": 100}), roots)
    assert evidence(poller.poll()) == []
    # ACTIVE → DOWN → ACTIVE between two polls: only link_downed shows it
    add_counter(roots, "mlx5_1", "link_downed", 1)
    (flap,) = evidence(poller.poll())
    assert (flap.signature, flap.category, flap.severity, flap.action) == (
        "net.link_down.ib_port_flap",
        "net.link_down",
        "error",
        "check_fabric",
    )
    assert flap.event.host == "ib-node" and flap.event.source == "ib"
    assert flap.captures["device"] == "mlx5_1" and flap.captures["port"] == "1"
    assert flap.captures["link_downed_increase"] == "1" and "flapped" in flap.summary
    assert evidence(poller.poll()) == []
    add_counter(roots, "mlx5_1", "link_downed", 1)
    assert evidence(poller.poll())[0].severity == "error"
    add_counter(roots, "mlx5_1", "link_downed", 1)
    third = evidence(poller.poll())[0]
    assert (third.severity, third.action, third.captures["flaps_in_window"]) == (
        "critical",
        "drain_node",
        "3",
    )


def test_port_seen_going_down_and_back(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(IbCollector(roots, {"expected_rate_gbps": 100}), roots)
    poller.poll()
    set_state(roots, "mlx5_2", "1: DOWN", "2: Polling")
    add_counter(roots, "mlx5_2", "link_downed", 1)
    down = poller.poll()
    (found,) = evidence(down)
    assert (found.signature, found.severity) == ("net.link_down.ib_port_down", "error")
    assert found.captures["state"] == "DOWN" and found.captures["phys_state"] == "Polling"
    assert "went down" in found.summary
    assert metrics(down)[("ib_port_state", "mlx5_2", "")] == 0
    assert evidence(poller.poll()) == []  # still down: reported once
    set_state(roots, "mlx5_2", "4: ACTIVE", "5: LinkUp")
    assert evidence(poller.poll()) == []  # back up, and the drop was already reported


def test_slow_symbol_error_rise_warns_before_the_link_drops(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(IbCollector(roots, {"expected_rate_gbps": 100}), roots)
    poller.poll()
    timeline: list[tuple[int, str, str]] = []
    for i in range(1, 12):
        add_counter(roots, "mlx5_0", "symbol_error", 1)  # one every 5 s: a dying cable
        if i == 10:
            set_state(roots, "mlx5_0", "1: DOWN", "2: Polling")
            add_counter(roots, "mlx5_0", "link_downed", 1)
        timeline += [(i, e.signature, e.severity) for e in evidence(poller.poll())]
    assert timeline == [
        (5, "net.ib_error.ib_symbol_error", "warning"),
        (10, "net.link_down.ib_port_down", "error"),
    ]


def test_error_counter_thresholds(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(
        IbCollector(roots, {"expected_rate_gbps": 100, "full_counters_every": 1}), roots
    )
    poller.poll()
    add_counter(roots, "mlx5_0", "excessive_buffer_overrun_errors", 1)
    add_counter(roots, "mlx5_1", "port_xmit_discards", 20_000)
    found = {e.captures["counter"]: e for e in evidence(poller.poll())}
    assert found["excessive_buffer_overrun_errors"].severity == "warning"
    assert found["port_xmit_discards"].severity == "error"
    assert found["port_xmit_discards"].category == "net.ib_error"
    assert found["port_xmit_discards"].signature == "net.ib_error.ib_port_xmit_discards"
    assert evidence(poller.poll()) == []  # same level: not repeated


def test_reset_gives_no_negative_rate_and_no_false_flap(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(
        IbCollector(roots, {"expected_rate_gbps": 100, "full_counters_every": 1}), roots
    )
    set_counter(roots, "mlx5_0", "link_downed", 2)
    poller.poll()
    # driver reload: every counter restarts near zero
    set_counter(roots, "mlx5_0", "port_xmit_data", 1000)
    set_counter(roots, "mlx5_0", "link_downed", 0)
    set_counter(roots, "mlx5_0", "symbol_error", 0)
    out = poller.poll()
    assert evidence(out) == []
    assert ("ib_port_transmit_bytes_per_second", "mlx5_0", "") not in metrics(out)
    assert all(e.attrs["value"] >= 0 for e in out if isinstance(e, Event) and e.kind == "metric")
    set_counter(roots, "mlx5_0", "port_xmit_data", 1000 + 5000)
    after = metrics(poller.poll())
    assert after[("ib_port_transmit_bytes_per_second", "mlx5_0", "")] == 4000  # 20 kB / 5 s


def test_narrow_port_counters_saturate_and_hw_counters_wrap(tmp_path: Path) -> None:
    """IBA PortCounters stop at their maximum, so one that goes down was reset even when it is
    32 bits wide; the driver's 32-bit hw_counters wrap (a wrap is not a reset)."""
    roots = tree(tmp_path, "ib_node")
    options = {"full_counters_every": 1, "counter_bits": {"port_xmit_data": 32}}
    collector = IbCollector(roots, options)
    assert collector.options["counter_bits"]["symbol_error"] == 16  # the known widths stay
    poller = Poller(collector, roots)
    set_counter(roots, "mlx5_0", "port_xmit_data", 2**32 - 1000)
    set_counter(roots, "mlx5_0", "out_of_buffer", 2**32 - 1000, hw=True)
    poller.poll()
    set_counter(roots, "mlx5_0", "port_xmit_data", 3000)  # a PortCounter going down: reset
    set_counter(roots, "mlx5_0", "out_of_buffer", 3000, hw=True)  # Q counter: wrapped by 4000
    got = metrics(poller.poll())
    assert ("ib_port_transmit_bytes_per_second", "mlx5_0", "") not in got
    assert got[("ib_hw_counter_per_second", "mlx5_0", "out_of_buffer")] == 4000 / 5


@pytest.mark.parametrize(
    ("counter", "maximum"),
    [
        ("link_downed", 255),
        ("link_error_recovery", 255),
        ("symbol_error", 65535),
        ("port_rcv_errors", 65535),
        ("port_xmit_discards", 65535),
        ("local_link_integrity_errors", 15),
        ("excessive_buffer_overrun_errors", 15),
    ],
)
def test_a_counter_at_its_maximum_is_saturated_not_quiet(
    tmp_path: Path, counter: str, maximum: int
) -> None:
    roots = tree(tmp_path, "ib_node")
    poller = Poller(
        IbCollector(roots, {"expected_rate_gbps": 100, "full_counters_every": 1}), roots
    )
    poller.poll()
    set_counter(roots, "mlx5_0", counter, maximum)
    out = poller.poll()
    found = [e for e in evidence(out) if e.signature == "net.ib_error.ib_counter_saturated"]
    assert [(e.captures["counter"], e.captures["key"]) for e in found] == [(counter, "mlx5_0/1")]
    assert found[0].severity == "warning"
    assert f"saturated at {maximum}" in found[0].summary and "reset it" in found[0].summary
    assert metrics(out)[("ib_port_counter_saturated_state", "mlx5_0", counter)] == 1
    # stuck at the maximum: no new increase, but never reported again as if all were well
    again = poller.poll()
    assert not [e for e in evidence(again) if e.signature == "net.ib_error.ib_counter_saturated"]
    assert metrics(again)[("ib_port_counter_saturated_state", "mlx5_0", counter)] == 1
    set_counter(roots, "mlx5_0", counter, 0)  # reset by the operator: re-armed, no flap
    after_reset = poller.poll()
    assert not [e for e in evidence(after_reset) if "saturated" in e.signature]
    assert metrics(after_reset)[("ib_port_counter_saturated_state", "mlx5_0", counter)] == 0
    set_counter(roots, "mlx5_0", counter, maximum)
    refilled = evidence(poller.poll())
    assert [e.captures["counter"] for e in refilled if "saturated" in e.signature] == [counter]


def test_transport_and_rnr_retries_exceeded(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    for name in ("req_transport_retries_exceeded", "req_rnr_retries_exceeded"):
        set_counter(roots, "mlx5_1", name, 0, hw=True)
    poller = Poller(
        IbCollector(roots, {"expected_rate_gbps": 100, "full_counters_every": 1}), roots
    )
    poller.poll()
    set_counter(roots, "mlx5_1", "req_transport_retries_exceeded", 2, hw=True)
    set_counter(roots, "mlx5_1", "req_rnr_retries_exceeded", 1, hw=True)
    found = {e.signature: e for e in evidence(poller.poll())}
    transport = found["net.ib_error.ib_req_transport_retries_exceeded"]
    assert transport.severity == "error" and transport.captures["increase"] == "2"
    assert "net.ib_error.ib_req_rnr_retries_exceeded" in found


def test_first_look_at_a_down_port_and_old_link_drops(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_flap")
    set_counter(roots, "mlx5_0", "link_downed", 2)
    poller = Poller(IbCollector(roots), roots)
    found = {e.signature: e for e in evidence(poller.poll())}
    down = found["net.link_down.ib_port_down"]
    assert (down.severity, down.captures["device"], down.captures["port"]) == (
        "warning",
        "mlx5_1",
        "1",
    )
    assert down.captures["link_downed"] == "3" and "is down" in down.summary
    before = found["net.link_down.ib_link_downed_before_start"]
    assert before.captures["device"] == "mlx5_0" and before.severity == "warning"
    assert evidence(poller.poll()) == []
    ignoring = Poller(IbCollector(roots, {"ignore_ports": ["mlx5_1/1", "mlx5_0"]}), roots)
    assert evidence(ignoring.poll()) == []


def test_state_dir_carries_the_baseline_across_restarts(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    options = {"state_dir": str(tmp_path / "state"), "expected_rate_gbps": 100}
    first = Poller(IbCollector(roots, options), roots)
    assert evidence(first.poll()) == []
    saved = json.loads((tmp_path / "state" / "ib_ports.json").read_text())
    assert saved["ports"]["mlx5_0/1"]["state"] == 4
    add_counter(roots, "mlx5_0", "link_downed", 1)
    restarted = Poller(IbCollector(roots, options), roots)
    restarted.now = first.now + 60 * S
    (flap,) = evidence(restarted.poll())
    assert flap.signature == "net.link_down.ib_port_flap" and flap.captures["device"] == "mlx5_0"
    # a baseline older than state_max_age_s is not compared
    add_counter(roots, "mlx5_0", "link_downed", 1)
    stale = Poller(IbCollector(roots, {**options, "state_max_age_s": 10}), roots)
    stale.now = restarted.now + 3600 * S
    assert [e.signature for e in evidence(stale.poll())] == [
        "net.link_down.ib_link_downed_before_start"
    ]


def test_a_damaged_state_file_costs_only_the_baseline(tmp_path: Path) -> None:
    roots = tree(tmp_path, "ib_node")
    state = tmp_path / "state"
    state.mkdir()
    options = {"state_dir": str(state), "expected_rate_gbps": 100}
    recent = T0 - S
    for damaged in ("{not json", f'{{"ts_ns": {recent}, "counters": [], "ports": 3}}', "[]"):
        (state / "ib_ports.json").write_text(damaged)
        assert evidence(Poller(IbCollector(roots, options), roots).poll()) == []


def test_unavailable_without_rdma_devices(tmp_path: Path) -> None:
    ok, reason = IbCollector(Roots(sysfs=str(tmp_path))).available()
    assert not ok and "no RDMA ports" in reason and str(tmp_path) in reason
    assert (
        IbCollector(Roots(sysfs=str(tmp_path))).collect(
            CollectContext(Roots(sysfs=str(tmp_path)), "h")
        )
        == []
    )


@pytest.mark.parametrize("name", ["ib_node", "ib_flap", "roce_node"])
def test_every_metric_has_help(tmp_path: Path, name: str) -> None:
    roots = tree(tmp_path, name)
    poller = Poller(IbCollector(roots, {"full_counters_every": 1}), roots)
    out = poller.poll() + poller.poll()
    names = {e.body for e in out if isinstance(e, Event) and e.kind == "metric"}
    assert names and names <= set(IbCollector.metrics_help)
    assert all(n.endswith(("_total", "_per_second", "_state", "_code")) for n in names)
