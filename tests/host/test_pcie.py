"""The PCIe collector on a fixture tree whose AER counters change between polls, and on
this host's sysfs."""

from __future__ import annotations

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.host.pcie import Link, PcieCollector, device_kind, parse_aer, parse_link_speed

GPU = "0000:3b:00.0"
NIC = "0000:5e:00.0"
IDLE_GPU = "0000:86:00.0"


def metrics(out: list) -> dict[tuple[str, str, str], float]:
    return {
        (e.body, e.attrs["device"], e.attrs.get("error", "")): e.attrs["value"]
        for e in out
        if isinstance(e, Event) and e.kind == "metric"
    }


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def test_parsers() -> None:
    assert parse_link_speed("16.0 GT/s PCIe\n") == 16.0
    assert parse_link_speed("8 GT/s") == 8.0
    assert parse_link_speed("Unknown") is None and parse_link_speed(None) is None
    assert parse_aer("RxErr 3\nBadTLP 2\nTOTAL_ERR_COR 5\n") == {
        "RxErr": 3,
        "BadTLP": 2,
        "TOTAL_ERR_COR": 5,
    }
    assert device_kind("0x030200", "0x10de") == "gpu"
    assert device_kind("0x030000", "0x10de\n") == "gpu"
    assert device_kind("0x030000", "0x1002") is None  # not an NVIDIA display device
    assert device_kind("0x020700", "0x15b3") == "ib"
    assert device_kind("0x020000", "0x8086") == "nic"
    assert device_kind("0x010601", "0x8086") is None
    assert Link(2.5, 16.0, 16, 16).speed_degraded() and not Link(2.5, 16.0, 16, 16).width_degraded()
    assert not Link(None, 16.0, None, 16).width_degraded()


def test_link_and_aer_from_fixture(fixture_roots) -> None:
    roots = fixture_roots("pcie")
    collector = PcieCollector(roots)
    assert collector.available()[0]
    ctx = CollectContext(roots=roots, host="gpu-node", now_ns=7)
    first = collector.collect(ctx)
    got = metrics(first)
    assert got[("pcie_link_width_lanes", GPU, "")] == 8
    assert got[("pcie_link_max_width_lanes", GPU, "")] == 16
    assert got[("pcie_link_speed_transfers_per_second", NIC, "")] == 32e9
    assert got[("pcie_aer_errors_total", GPU, "RxErr")] == 3
    assert got[("pcie_aer_errors_total", GPU, "TOTAL_ERR_COR")] == 5
    assert ("pcie_aer_errors_total", GPU, "BadDLLP") not in got  # zero: no series yet
    assert ("pcie_aer_errors_total", NIC, "TOTAL_ERR_FATAL") in got
    assert not any(dev == "0000:00:1f.2" for _, dev, _ in got)  # SATA: no AER, no link
    assert {name for name, *_ in got} <= set(collector.metrics_help)
    assert all(e.host == "gpu-node" and e.ts_ns == 7 for e in first if isinstance(e, Event))
    # first poll: AER baseline; the x8-of-x16 GPU warns; the idle GPU at 2.5 GT/s does not
    found = evidence(first)
    assert [(e.signature, e.severity, e.action, e.captures["device"]) for e in found] == [
        ("host.pcie_error.link_width_degraded", "warning", "run_diagnostics", GPU)
    ]
    assert found[0].captures["width"] == "8" and found[0].captures["max_width"] == "16"
    assert "x8 of x16" in found[0].summary

    fatal = roots.sys("bus", "pci", "devices", NIC, "aer_dev_fatal")
    fatal.write_text(
        fatal.read_text()
        .replace("CmpltTO 0", "CmpltTO 1")
        .replace("TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 1")
    )
    nonfatal = roots.sys("bus", "pci", "devices", GPU, "aer_dev_nonfatal")
    nonfatal.write_text(
        nonfatal.read_text()
        .replace("UnsupReq 0", "UnsupReq 2")
        .replace("TOTAL_ERR_NONFATAL 0", "TOTAL_ERR_NONFATAL 2")
    )
    second = evidence(collector.collect(ctx))
    by_sig = {e.signature: e for e in second}
    assert set(by_sig) == {
        "host.pcie_error.aer_counter_fatal",
        "host.pcie_error.aer_counter_nonfatal",
    }
    f = by_sig["host.pcie_error.aer_counter_fatal"]
    assert (f.category, f.severity, f.action) == ("host.pcie_error", "critical", "drain_node")
    assert f.captures == {"device": NIC, "kind": "fatal", "count": "1", "errors": "CmpltTO 1"}
    assert NIC in f.summary and "CmpltTO 1" in f.summary
    nf = by_sig["host.pcie_error.aer_counter_nonfatal"]
    assert (nf.severity, nf.action, nf.captures["count"]) == ("error", "run_diagnostics", "2")
    assert evidence(collector.collect(ctx)) == []  # no new errors, link still x8: quiet


def test_speed_degradation_only_when_asked(fixture_roots) -> None:
    roots = fixture_roots("pcie")
    collector = PcieCollector(roots, {"warn_speed_degraded": True})
    found = evidence(collector.collect(CollectContext(roots=roots, host="n")))
    assert sorted((e.signature, e.captures["device"]) for e in found) == [
        ("host.pcie_error.link_speed_degraded", IDLE_GPU),
        ("host.pcie_error.link_width_degraded", GPU),
    ]


def test_this_host_does_not_fail() -> None:
    collector = PcieCollector(Roots())
    if collector.available()[0]:
        out = collector.collect(CollectContext(roots=Roots(), host="h"))
        assert all(isinstance(e, Event | Evidence) for e in out)
