"""The nccl_topo collector on dumps in a temporary folder: counts, evidence for each
difference from the golden profile (once while it lasts), bad dumps, and its settings."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.detectors import detector
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.fabric.nccl_topo.collector import DETECTORS, NcclTopoCollector
from denpex.fabric.nccl_topo.diff import DIFFERENCE_KINDS

TOPO = Path(__file__).parent / "fixtures" / "nccl_topo"
ROOTS = Roots()


def poll(collector: NcclTopoCollector, now: int = 5) -> list:
    return collector.collect(CollectContext(roots=ROOTS, host="gpu-node-7", now_ns=now))


def metrics(out: list) -> dict[tuple[str, str], float]:
    return {
        (e.body, Path(e.attrs["file"]).name): e.attrs["value"]
        for e in out
        if isinstance(e, Event) and e.kind == "metric"
    }


def evidence(out: list) -> list[tuple[str, str, str, str, str]]:
    return [
        (e.signature, e.category, e.severity, e.action, e.captures["device"])
        for e in out
        if isinstance(e, Evidence)
    ]


@pytest.fixture
def dumps(tmp_path: Path) -> Path:
    for name in ("dgx_h100_gpu_moved.xml", "dgx_h100_nvlink_missing.xml", "dgx_h100_nic_200g.xml"):
        shutil.copy(TOPO / name, tmp_path / f"topo-{name.removeprefix('dgx_h100_')}")
    return tmp_path


def test_every_difference_kind_has_its_detector() -> None:
    assert set(DETECTORS) == set(DIFFERENCE_KINDS)
    for kind, detector_id in DETECTORS.items():
        assert detector_id.endswith(f".nccl_topo_{kind}"), kind
    assert detector(DETECTORS["pair_split"]).category == "gpu.p2p_topology"
    assert detector(DETECTORS["nvlink_missing"]).category == "gpu.nvlink"
    found = detector(DETECTORS["nic_speed_lower"])
    assert (found.category, found.severity, found.action) == (
        "net.link_down",
        "warning",
        "check_fabric",
    )


def test_available_says_why_not(tmp_path: Path) -> None:
    ok, why = NcclTopoCollector(ROOTS).available()
    assert not ok and "NCCL_TOPO_DUMP_FILE" in why
    bad = tmp_path / "golden.xml"
    bad.write_text("<nope/>")
    ok, why = NcclTopoCollector(ROOTS, {"dump_files": "x", "golden": str(bad)}).available()
    assert not ok and "golden profile unusable" in why and "golden.xml" in why
    ok, why = NcclTopoCollector(
        ROOTS,
        {"dump_files": [str(tmp_path / "*.xml")], "golden": str(TOPO / "golden_dgx_h100.xml")},
    ).available()
    assert ok and "golden_dgx_h100.xml" in why


def test_differences_become_evidence_once(dumps: Path) -> None:
    collector = NcclTopoCollector(
        ROOTS,
        {"dump_files": [str(dumps / "topo-*.xml")], "golden": str(TOPO / "golden_dgx_h100.xml")},
    )
    first = poll(collector)
    got = metrics(first)
    assert got[("nccl_topo_gpus", "topo-gpu_moved.xml")] == 8
    assert got[("nccl_topo_nics", "topo-nic_200g.xml")] == 10
    assert got[("nccl_topo_nvlinks", "topo-nvlink_missing.xml")] == 144 - 4 - 1
    assert got[("nccl_topo_differences", "topo-gpu_moved.xml")] == 2
    assert got[("nccl_topo_valid", "topo-nic_200g.xml")] == 1
    assert {name for name, _ in got} <= set(collector.metrics_help)
    assert evidence(first) == [
        (
            "gpu.p2p_topology.nccl_topo_gpu_moved",
            "gpu.p2p_topology",
            "warning",
            "run_diagnostics",
            "0000:2a:00.0",
        ),
        (
            "gpu.p2p_topology.nccl_topo_pair_split",
            "gpu.p2p_topology",
            "warning",
            "run_diagnostics",
            "gpu 0000:2a:00.0 + net mlx5_1:1",
        ),
        (
            "net.link_down.nccl_topo_nic_speed_lower",
            "net.link_down",
            "warning",
            "check_fabric",
            "mlx5_3:1",
        ),
        (
            "gpu.nvlink.nccl_topo_nvlink_missing",
            "gpu.nvlink",
            "error",
            "run_diagnostics",
            "0000:3a:00.0",
        ),
        (
            "gpu.nvlink.nccl_topo_nvlink_fewer",
            "gpu.nvlink",
            "warning",
            "run_diagnostics",
            "0000:5d:00.0",
        ),
    ]
    assert all(e.host == "gpu-node-7" and e.ts_ns == 5 for e in first if isinstance(e, Event))
    moved = next(e for e in first if isinstance(e, Evidence))
    assert moved.captures["path"] == "cpu 0 / pci 0000:15:00.0 / gpu 0000:2a:00.0"
    assert moved.event.source == "nccl_topo" and "cpu 0 / pci 0000:15:00.0" in moved.summary
    # the same dumps next poll: counted again, no new evidence
    assert evidence(poll(collector)) == []
    # the job rewrites its dump with a healthy topology, then the fault comes back: re-armed
    target = dumps / "topo-nic_200g.xml"
    shutil.copy(TOPO / "dgx_h100.xml", target)
    os.utime(target, (1, 1))
    assert evidence(poll(collector)) == []
    shutil.copy(TOPO / "dgx_h100_nic_200g.xml", target)
    os.utime(target, (2, 2))
    assert [e[0] for e in evidence(poll(collector))] == ["net.link_down.nccl_topo_nic_speed_lower"]


def test_counts_without_golden_and_bad_dumps_do_not_raise(tmp_path: Path) -> None:
    (tmp_path / "a.xml").write_bytes((TOPO / "dgx_h100.xml").read_bytes())
    (tmp_path / "b.xml").write_text("<system><cpu><pci busid='broken'")
    collector = NcclTopoCollector(ROOTS, {"dump_files": str(tmp_path / "*.xml")})
    out = poll(collector)
    assert evidence(out) == []
    got = metrics(out)
    assert got[("nccl_topo_valid", "a.xml")] == 1 and got[("nccl_topo_valid", "b.xml")] == 0
    assert ("nccl_topo_differences", "a.xml") not in got
    assert poll(NcclTopoCollector(ROOTS, {"dump_files": str(tmp_path / "none-*.xml")})) == []


def test_gpu_subset_setting(tmp_path: Path) -> None:
    text = (TOPO / "dgx_h100.xml").read_text()
    start = text.index('<pci busid="0000:db:00.0"')
    end = text.index("</pci>", start) + len("</pci>")
    (tmp_path / "part.xml").write_text(text[:start] + text[end:])
    options = {
        "dump_files": str(tmp_path / "part.xml"),
        "golden": str(TOPO / "golden_dgx_h100.xml"),
    }
    assert evidence(poll(NcclTopoCollector(ROOTS, options))) == []
    strict = NcclTopoCollector(ROOTS, {**options, "allow_gpu_subset": False})
    assert evidence(poll(strict)) == [
        (
            "gpu.fallen_off_bus.nccl_topo_gpu_missing",
            "gpu.fallen_off_bus",
            "warning",
            "run_diagnostics",
            "0000:db:00.0",
        )
    ]
