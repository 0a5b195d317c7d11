"""The NVML collector end to end: the real pynvml loads the fake libnvidia-ml.so.1 (compiled
from the shipped C source) in a fresh subprocess per scenario, and the real collector polls it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from denpex.gpu.nvml.scenario import SCENARIO_ENV
from tests.gpu.nvml_harness import DRIVER, REPO, metric_value, run_scenario


def test_values_labels_and_processes(fake_library: Path, tmp_path: Path) -> None:
    scenario = {
        "gpus": 2,
        "defaults": {
            "utilization_gpu": 97,
            "utilization_memory": 41,
            "memory_used_mib": 1000,
            "memory_total_mib": 81559,
            "power_mw": 612500,
            "temperature_c": 63,
            "margin_temperature_c": 22,
            "nvlink_links": 2,
            "ecc_sbe_volatile": 4,
            "remap_corrected": 2,
            "pcie_replays": 9,
            "fabric_state": 3,
        },
        "gpu": {1: {"processes": "4242:2048,4343:10", "nvlink1_crc_flit": 5}},
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0])
    assert report["available"][0] is True and "2 GPU(s)" in report["available"][1]
    poll = report["polls"][0]
    assert metric_value(poll, "DCGM_FI_DEV_GPU_UTIL", "1") == 97
    assert metric_value(poll, "DCGM_FI_DEV_MEM_COPY_UTIL", "1") == 41
    assert metric_value(poll, "DCGM_FI_DEV_FB_USED", "0") == 1000
    assert metric_value(poll, "DCGM_FI_DEV_FB_FREE", "0") == 80559
    assert metric_value(poll, "DCGM_FI_DEV_POWER_USAGE", "0") == pytest.approx(612.5)
    assert metric_value(poll, "DCGM_FI_DEV_GPU_TEMP", "0") == 63
    assert metric_value(poll, "gpu_temperature_margin_celsius", "0") == 22
    assert metric_value(poll, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0") == 4
    assert metric_value(poll, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "0") == 2
    assert metric_value(poll, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0") == 9
    assert metric_value(poll, "gpu_fabric_state", "0") == 3
    assert metric_value(poll, "gpu_nvlink_errors_total", "1", link="1", counter="crc_flit") == 5
    assert metric_value(poll, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "1") == 5
    util = next(
        m
        for m in poll["metrics"]
        if m["name"] == "DCGM_FI_DEV_GPU_UTIL" and m["attrs"]["gpu"] == "1"
    )
    assert util["attrs"]["device"] == "nvidia1" and util["attrs"]["Hostname"] == "node7"
    assert (
        util["attrs"]["UUID"].startswith("GPU-")
        and util["attrs"]["pci_bus_id"] == "00000000:28:00.0"
    )
    assert (
        util["attrs"]["modelName"] == "NVIDIA H100 80GB HBM3"
        and util["host"] == "node7"
        and util["ts_ns"]
    )
    assert metric_value(poll, "gpu_processes", "1", pids="4242,4343") == 2
    per_pid = {
        m["pid"]: m["attrs"]["value"]
        for m in poll["metrics"]
        if m["name"] == "gpu_process_memory_used_bytes"
    }
    assert per_pid == {4242: 2048 * 2**20, 4343: 10 * 2**20}
    assert poll["evidence"] == [] and poll["degraded"] is None


def test_xid79_becomes_fallen_off_bus_with_the_bus_id(fake_library: Path, tmp_path: Path) -> None:
    scenario = {
        "gpus": 4,
        "timeline": [{"t": 1.0, "gpu": 2, "xid": 79}, {"t": 1.0, "gpu": 2, "set": {"lost": 1}}],
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0, 1.3, 0.3])
    first, second, third = report["polls"]
    assert first["evidence"] == []
    signatures = {e["signature"]: e for e in second["evidence"]}
    assert set(signatures) == {"gpu.fallen_off_bus.nvml_xid79", "gpu.fallen_off_bus.nvml_gpu_lost"}
    for evidence in signatures.values():
        assert evidence["category"] == "gpu.fallen_off_bus" and evidence["severity"] == "critical"
        assert (
            evidence["captures"]["gpu"] == "2"
            and evidence["captures"]["pci_bus_id"] == "00000000:38:00.0"
        )
        assert evidence["host"] == "node7" and evidence["action"] == "drain_node"
    assert (
        metric_value(second, "gpu_nvml_up", "2") == 0
        and metric_value(second, "gpu_nvml_up", "1") == 1
    )
    assert metric_value(second, "DCGM_FI_DEV_XID_ERRORS", "2") == 79
    assert metric_value(second, "gpu_xid_errors_total", "2", xid="79") == 1
    assert third["evidence"] == []  # reported once, not every poll
    assert metric_value(third, "gpu_xid_errors_total", "2", xid="79") == 1


def test_xid13_flood_is_one_evidence_with_a_count(fake_library: Path, tmp_path: Path) -> None:
    scenario = {
        "gpus": 2,
        "timeline": [{"t": 0.2, "gpu": 1, "xid": 13, "repeat": 50, "every_s": 0.002}],
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0, 0.8])
    evidence = [e for p in report["polls"] for e in p["evidence"]]
    assert len(evidence) == 1
    assert evidence[0]["signature"] == "gpu.mmu_fault.nvml_xid13"
    assert evidence[0]["captures"]["count"] == "50" and "x50" in evidence[0]["summary"]
    assert evidence[0]["captures"]["first"] <= evidence[0]["captures"]["last"]
    last = report["polls"][-1]
    assert metric_value(last, "gpu_xid_errors_total", "1", xid="13") == 50
    assert metric_value(last, "DCGM_FI_DEV_XID_ERRORS", "1") == 13


def test_xid_threshold_override_from_options(fake_library: Path, tmp_path: Path) -> None:
    scenario = {
        "gpus": 1,
        "timeline": [{"t": 0.1, "gpu": 0, "xid": 13, "repeat": 5, "every_s": 0.01}],
    }
    report = run_scenario(
        fake_library, tmp_path, scenario, [0.0, 0.5], {"xid_overrides": {"13": {"count": 10}}}
    )
    assert [e for p in report["polls"] for e in p["evidence"]] == []
    assert metric_value(report["polls"][-1], "gpu_xid_errors_total", "0", xid="13") == 5


def test_hung_call_degrades_and_the_other_gpus_still_report(
    fake_library: Path, tmp_path: Path
) -> None:
    scenario = {
        "gpus": 4,
        "timeline": [{"t": 0, "gpu": 3, "hang": "nvmlDeviceGetPowerUsage", "for_s": 30}],
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0, 0.2])
    first, second = report["polls"]
    assert first["duration_s"] < 0.5 + 1.0 + 1.0  # one deadline, one first drain, slack
    assert second["duration_s"] < 0.5  # later polls fail fast, never queue behind the hang
    (hang,) = first["evidence"]
    assert hang["signature"] == "gpu.gsp_timeout.nvml_call_hung"
    assert "NVML call nvmlDeviceGetPowerUsage on GPU 3 has not returned for" in hang["summary"]
    assert hang["captures"]["call"] == "nvmlDeviceGetPowerUsage" and hang["captures"]["gpu"] == "3"
    for poll in (first, second):
        assert "nvmlDeviceGetPowerUsage on GPU 3" in poll["degraded"]
        assert [metric_value(poll, "gpu_nvml_up", str(i)) for i in range(4)] == [1, 1, 1, 0]
        assert metric_value(poll, "DCGM_FI_DEV_POWER_USAGE", "0") is not None
        assert metric_value(poll, "gpu_nvml_call_stuck_seconds", "3") >= 0.5
    assert second["evidence"] == []


def test_hang_that_ends_recovers(fake_library: Path, tmp_path: Path) -> None:
    scenario = {
        "gpus": 1,
        "timeline": [
            {"t": 0, "gpu": 0, "hang": "nvmlDeviceGetPowerUsage", "for_s": 0.8},
            {
                "t": 0.5,
                "gpu": 0,
                "hang": "nvmlDeviceGetPowerUsage",
                "for_s": 0,
            },  # calls after 0.5 s answer
        ],
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0, 1.0])
    first, second = report["polls"]
    assert first["degraded"] and second["degraded"] is None
    assert metric_value(second, "gpu_nvml_up", "0") == 1
    assert any("answers NVML again" in e for e in second["events"])


def test_gpu_lost_from_the_start(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(fake_library, tmp_path, {"gpus": 2, "gpu": {0: {"lost": 1}}}, [0.0])
    (lost,) = report["polls"][0]["evidence"]
    assert (
        lost["signature"] == "gpu.fallen_off_bus.nvml_gpu_lost" and lost["captures"]["gpu"] == "0"
    )
    assert "GPU is lost" in lost["summary"]
    assert metric_value(report["polls"][0], "gpu_nvml_up", "1") == 1


def test_unsupported_queries_are_skipped_and_remembered(fake_library: Path, tmp_path: Path) -> None:
    scenario = {
        "gpus": 1,
        "defaults": {
            "unsupported:nvmlDeviceGetPowerUsage": 1,
            "unsupported:nvmlDeviceGetRemappedRows": 1,
        },
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0, 0.0])
    poll = report["polls"][-1]
    assert metric_value(poll, "DCGM_FI_DEV_POWER_USAGE", "0") is None
    assert metric_value(poll, "DCGM_FI_DEV_ROW_REMAP_PENDING", "0") is None
    assert metric_value(poll, "DCGM_FI_DEV_GPU_TEMP", "0") == 40
    unsupported = report["unsupported"]["0"]
    assert {"power_mw", "remap", "thermal_margin", "nvlink", "fabric"} <= set(unsupported)


@pytest.mark.parametrize(
    "name, signatures",
    [
        (
            "ecc_dbe.yaml",
            {"gpu.ecc_uncorrectable.nvml_dbe_volatile", "gpu.ecc_uncorrectable.nvml_xid48"},
        ),
        (
            "row_remap_pending.yaml",
            {"gpu.row_remap.nvml_remap_pending", "gpu.row_remap.nvml_xid63"},
        ),
        (
            "thermal_slowdown.yaml",
            {"gpu.thermal.nvml_clocks_event", "gpu.thermal.nvml_thermal_margin"},
        ),
    ],
)
def test_example_scenarios_produce_their_evidence(
    fake_library: Path, tmp_path: Path, name: str, signatures: set
) -> None:
    scenario = yaml.safe_load((REPO / "examples" / "scenarios" / name).read_text())
    report = run_scenario(fake_library, tmp_path, scenario, [0.0, 1.2])
    assert {e["signature"] for p in report["polls"] for e in p["evidence"]} == signatures


def test_shim_xid79_at_t0_through_the_collector_api(tmp_path: Path) -> None:
    """The deliverable: DENPEX_NVML_SHIM on a scenario with an Xid 79 at t=0, one poll."""
    scenario = tmp_path / "xid79_t0.yaml"
    scenario.write_text(
        yaml.safe_dump({"description": "x", "gpus": 2, "timeline": [{"t": 0, "gpu": 1, "xid": 79}]})
    )
    env = {
        **os.environ,
        "DENPEX_NVML_SHIM": "1",
        "DENPEX_NVML_SCENARIO": str(scenario),
        "DENPEX_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(REPO),
    }
    env.pop(SCENARIO_ENV, None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps({"deadline_s": 2.0}), "[0]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "fake NVML" in report["available"][1]
    (evidence,) = report["polls"][0]["evidence"]
    assert evidence["signature"] == "gpu.fallen_off_bus.nvml_xid79"
    assert evidence["host"] == "node7" and evidence["captures"]["gpu"] == "1"
    assert evidence["captures"]["pci_bus_id"] == "00000000:28:00.0"
    assert time.monotonic() - started < 60


def test_shim_without_scenario_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "DENPEX_NVML_SHIM": "1", "PYTHONPATH": str(REPO)}
    env.pop("DENPEX_NVML_SCENARIO", None)
    code = "from denpex.gpu.nvml.collector import NvmlCollector; from denpex.core.roots import Roots; print(NvmlCollector(Roots()).available())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert "DENPEX_NVML_SCENARIO" in result.stdout and "False" in result.stdout


def test_no_library_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("DENPEX_NVML_SHIM", None)
    code = "from denpex.gpu.nvml.collector import NvmlCollector; from denpex.core.roots import Roots; print(NvmlCollector(Roots()).available())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert "(False, 'libnvidia-ml.so.1 not found" in result.stdout


def test_host_facts_name_the_driver_and_each_distinct_vbios(
    fake_library: Path, tmp_path: Path
) -> None:
    scenario = {
        "gpus": 3,
        "driver_version": "570.86.15",
        "gpu": {2: {"vbios_version": "96.00.99.00.07"}},
    }
    report = run_scenario(fake_library, tmp_path, scenario, [0.0])
    assert report["facts"] == {
        "driver": "570.86.15",
        "firmware": "96.00.89.00.01,96.00.99.00.07",
    }
