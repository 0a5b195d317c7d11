"""MIG devices as their own entities, queries MIG mode turns off that come back when it is
turned off, and the NVSwitch fabric: a registration stuck long after boot and the health
mask of nvmlGpuFabricInfo_v2/v3 — all through the fake library's scenarios."""

from __future__ import annotations

from pathlib import Path

from tests.gpu.nvml_harness import evidence, example, metric_value, run_scenario


def test_mig_devices_are_entities_with_dcgm_exporter_labels(
    fake_library: Path, tmp_path: Path
) -> None:
    report = run_scenario(fake_library, tmp_path, example("mig.yaml"), [0.0])
    (poll,) = report["polls"]
    big = metric_value(poll, "DCGM_FI_DEV_FB_USED", "0", GPU_I_ID="1", GPU_I_PROFILE="3g.40gb")
    small = metric_value(poll, "DCGM_FI_DEV_FB_USED", "0", GPU_I_ID="9", GPU_I_PROFILE="1g.10gb")
    assert (big, small) == (1200, 300)
    assert metric_value(poll, "DCGM_FI_DEV_FB_TOTAL", "0", GPU_I_ID="9") == 9856
    mig_process = [
        m for m in poll["metrics"] if m["name"] == "gpu_process_memory_used_bytes" and m["pid"]
    ]
    (proc,) = [m for m in mig_process if m["attrs"].get("GPU_I_ID") == "1"]
    assert proc["pid"] == 4242 and proc["attrs"]["mig_uuid"].startswith("MIG-")
    # the parent GPU's identity labels every MIG metric, as dcgm-exporter does
    fb = next(m for m in poll["metrics"] if m["attrs"].get("GPU_I_ID") == "9")
    assert fb["attrs"]["device"] == "nvidia0" and fb["attrs"]["UUID"].startswith("GPU-")
    assert metric_value(poll, "gpu_mig_mode", "0") == 1
    assert metric_value(poll, "gpu_mig_mode", "1") is None  # no MIG on GPU 1


def test_what_mig_mode_refuses_comes_back_when_it_is_off(
    fake_library: Path, tmp_path: Path
) -> None:
    report = run_scenario(fake_library, tmp_path, example("mig.yaml"), [0.0, 1.3])
    during, after = report["polls"]
    assert metric_value(during, "DCGM_FI_DEV_GPU_UTIL", "0") is None
    assert metric_value(during, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "0") is None
    assert metric_value(during, "DCGM_FI_DEV_GPU_UTIL", "1") == 70
    assert metric_value(after, "DCGM_FI_DEV_GPU_UTIL", "0") == 70
    assert metric_value(after, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "0") == 1
    assert metric_value(after, "gpu_mig_mode", "0") == 0
    assert not [m for m in after["metrics"] if "GPU_I_ID" in m["attrs"]]
    assert {"util", "remap"}.isdisjoint(report["unsupported"]["0"])


def _uptime(tmp_path: Path, seconds: float) -> Path:
    procfs = tmp_path / "proc"
    procfs.mkdir()
    (procfs / "uptime").write_text(f"{seconds:.2f} 1234.00\n")
    return procfs


def test_fabric_registration_stuck_long_after_boot(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(
        fake_library,
        tmp_path,
        example("fabric_stuck.yaml"),
        [0.0, 0.1],
        procfs=_uptime(tmp_path, 3600),
    )
    first, second = report["polls"]
    stuck = [e for e in first["evidence"] if e["signature"] == "gpu.nvlink.nvml_fabric_stuck"]
    assert sorted(e["captures"]["gpu"] for e in stuck) == ["0", "1", "2", "3"]
    assert all(e["action"] == "check_fabric" for e in stuck)
    assert "in progress 60 min after boot" in stuck[0]["summary"]
    (unhealthy,) = [e for e in first["evidence"] if e["signature"].endswith("fabric_unhealthy")]
    assert unhealthy["captures"]["gpu"] == "3"
    assert unhealthy["captures"]["problems"] == "NVLink bandwidth degraded; route unhealthy"
    assert metric_value(first, "gpu_fabric_health_mask", "3") == 0x11
    assert second["evidence"] == []  # a lasting condition is reported once


def test_fabric_still_starting_soon_after_boot_is_not_stuck(
    fake_library: Path, tmp_path: Path
) -> None:
    report = run_scenario(
        fake_library, tmp_path, example("fabric_stuck.yaml"), [0.0], procfs=_uptime(tmp_path, 40)
    )
    signatures = {e["signature"] for e in evidence(report)}
    assert signatures == {"gpu.nvlink.nvml_fabric_unhealthy"}


def test_fabric_health_from_a_driver_with_only_the_v2_struct(
    fake_library: Path, tmp_path: Path
) -> None:
    scenario = example("fabric_stuck.yaml")
    scenario["defaults"] = {**scenario["defaults"], "fabric_info_max_version": 2}
    scenario["gpu"][3]["fabric_health_summary"] = 2  # v3 only: a v2 reader never sees it
    report = run_scenario(fake_library, tmp_path, scenario, [0.0], procfs=_uptime(tmp_path, 40))
    (unhealthy,) = evidence(report)
    assert unhealthy["captures"]["problems"] == "NVLink bandwidth degraded; route unhealthy"
    assert metric_value(report["polls"][0], "gpu_fabric_health_summary", "3") is None
