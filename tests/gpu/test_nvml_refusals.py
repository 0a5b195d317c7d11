"""NVML saying no, through the fake library's scenarios: an unknown error is not a lost GPU,
a GPU needing a reset is one, a refused handle or query is a note, no GPU at all is a
reason, and an event mask the GPU refuses falls back to what it supports."""

from __future__ import annotations

from pathlib import Path

from tests.gpu.nvml_harness import evidence, example, metric_value, run_scenario


def test_unknown_error_is_not_a_lost_gpu(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(fake_library, tmp_path, example("nvml_unknown_error.yaml"), [0.0, 0.2])
    first, second = report["polls"]
    found = evidence(report)
    assert not [e for e in found if e["category"] == "gpu.fallen_off_bus"], found
    assert not [e for e in found if e["action"] == "drain_node"], found
    for poll in (first, second):
        assert metric_value(poll, "gpu_nvml_up", "1") == 1
        assert metric_value(poll, "DCGM_FI_DEV_GPU_UTIL", "1") == 88  # the rest still reads
        assert metric_value(poll, "DCGM_FI_DEV_POWER_USAGE", "1") is None
        assert metric_value(poll, "DCGM_FI_DEV_POWER_USAGE", "0") is not None
    notes = [n for n in first["events"] if "Unknown Error" in n]
    assert any("nvmlDeviceGetPowerUsage" in n for n in notes)
    assert any("nvmlDeviceGetTemperature" in n for n in notes)
    assert not [n for n in second["events"] if "Unknown Error" in n]  # said once
    # an unknown error is retried every poll, not remembered as unsupported
    assert "power_mw" not in report["unsupported"]["1"]


def test_reset_required_is_gpu_reset_required(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(fake_library, tmp_path, example("reset_required.yaml"), [0.0, 0.7, 0.1])
    first, second, third = report["polls"]
    assert first["evidence"] == []
    (needs_reset,) = second["evidence"]
    assert needs_reset["signature"] == "gpu.reset_required.nvml_reset_required"
    assert needs_reset["action"] == "reset_gpu" and needs_reset["captures"]["gpu"] == "2"
    assert "requires restart" in needs_reset["summary"]  # pynvml's words for code 16
    assert metric_value(second, "gpu_nvml_up", "2") == 0
    assert metric_value(second, "gpu_nvml_up", "1") == 1
    assert third["evidence"] == []


def test_no_permission_is_a_note_not_evidence(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(fake_library, tmp_path, example("no_permission.yaml"), [0.0, 0.1])
    first, second = report["polls"]
    assert evidence(report) == []
    assert metric_value(first, "gpu_nvml_up", "1") == 0
    assert metric_value(first, "gpu_nvml_up", "0") == 1
    assert any(
        "GPU 1 cannot be read" in n and "Insufficient Permissions" in n for n in first["events"]
    )
    assert any("retired_dbe" in n and "no permission" in n for n in first["events"])
    assert not [n for n in second["events"] if "permission" in n.lower()]  # once
    assert metric_value(second, "DCGM_FI_DEV_RETIRED_DBE", "0") is None


def test_no_gpus_found_is_unavailable_with_the_reason(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(fake_library, tmp_path, example("no_gpus_found.yaml"), [0.0])
    ok, reason = report["available"]
    assert ok is False and "found no GPU" in reason
    assert report["polls"][0]["metrics"] == [] and report["polls"][0]["evidence"] == []


def test_refused_event_mask_falls_back_to_what_the_gpu_supports(
    fake_library: Path, tmp_path: Path
) -> None:
    report = run_scenario(fake_library, tmp_path, example("event_mask_refused.yaml"), [0.0, 0.5])
    (xid,) = evidence(report)
    assert xid["signature"] == "gpu.fallen_off_bus.nvml_xid79" and xid["captures"]["gpu"] == "0"
    notes = [n for p in report["polls"] for n in p["events"] if "no NVML events" in n]
    assert len(notes) == 1 and "GPU 1" in notes[0] and "Not Supported" in notes[0]


def test_recovery_action_event_and_field(fake_library: Path, tmp_path: Path) -> None:
    report = run_scenario(fake_library, tmp_path, example("recovery_action.yaml"), [0.0, 0.6, 0.1])
    found = {e["signature"]: e for e in evidence(report)}
    action = found["gpu.reset_required.nvml_recovery_action"]
    assert action["severity"] == "critical" and action["action"] == "reset_gpu"
    assert action["captures"]["recovery_action"] == "1" and "GPU reset" in action["summary"]
    assert metric_value(report["polls"][1], "gpu_recovery_action", "1") == 1
    assert metric_value(report["polls"][1], "gpu_recovery_action", "0") == 0
    assert len([e for e in evidence(report) if e["signature"].endswith("recovery_action")]) == 1
