"""Scenario files: validation, the line file the fake library reads, building the library."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from denpex.gpu.nvml.scenario import (
    FakeLibraryError,
    ScenarioError,
    build_fake_library,
    compile_scenario,
    load_scenario,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def test_lines_are_sorted_by_time_with_identity_and_defaults() -> None:
    lines = compile_scenario(
        {
            "gpus": 2,
            "defaults": {"temperature_c": 50},
            "gpu": {1: {"name": "A100"}},
            "timeline": [
                {"t": 3, "gpu": 1, "xid": 79},
                {"t": 1, "gpu": 0, "xid": 13, "repeat": 3, "every_s": 0.5},
                {"t": 2, "gpu": 1, "set": {"lost": True}},
                {"t": 0, "gpu": 0, "hang": "nvmlDeviceGetPowerUsage", "for_s": 2},
            ],
        }
    )
    assert [line.t for line in lines] == sorted(line.t for line in lines)
    by_key = {(line.gpu, line.key): line.value for line in lines if line.t == 0}
    assert by_key[(-1, "gpu_count")] == "2"
    assert by_key[(0, "temperature_c")] == "50"
    assert by_key[(1, "name")] == "A100"
    assert by_key[(0, "pci_bus_id")] != by_key[(1, "pci_bus_id")]
    assert by_key[(0, "hang:nvmlDeviceGetPowerUsage")] == "2.0"
    events = [(line.t, line.value) for line in lines if line.key == "event"]
    assert events == [(1.0, "8 13"), (1.5, "8 13"), (2.0, "8 13"), (3.0, "8 79")]
    assert any(line.key == "lost" and line.value == "1" and line.t == 2 for line in lines)
    rendered = lines[0].render()
    assert rendered.count("\t") == 3 and rendered.endswith("\n")


@pytest.mark.parametrize(
    "scenario, problem",
    [
        ({"gpus": "eight"}, "gpus: a number"),
        ({"gpus": 2, "gpu": {5: {}}}, "gpu.5: no such GPU"),
        ({"gpus": 2, "defaults": {"colour": 1}}, "colour: unknown property"),
        ({"gpus": 2, "defaults": {"temperature_c": -3}}, "non-negative integer"),
        ({"gpus": 2, "timeline": [{"t": 1, "gpu": 9, "xid": 79}]}, "timeline\\[0\\].gpu"),
        ({"gpus": 2, "timeline": [{"t": 1, "gpu": 0}]}, "exactly one of"),
        ({"gpus": 2, "timeline": [{"t": 1, "gpu": 0, "hang": "sleep"}]}, "the NVML function"),
        ({"gpus": 2, "timeline": [{"t": 1, "gpu": 0, "event": "fire"}]}, "event: one of"),
        ({"gpus": 1, "wat": 1}, "unknown key"),
    ],
)
def test_invalid_scenarios_name_the_problem(scenario, problem) -> None:
    with pytest.raises(ScenarioError, match=problem):
        compile_scenario(scenario)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_scenario_loads(path: Path) -> None:
    assert load_scenario(path)
    assert yaml.safe_load(path.read_text())["description"]


def test_required_examples_exist() -> None:
    names = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert {
        "xid79.yaml",
        "ecc_dbe.yaml",
        "row_remap_pending.yaml",
        "thermal_slowdown.yaml",
        "hung_nvml_call.yaml",
    } <= names
    xid79 = yaml.safe_load((EXAMPLES / "xid79.yaml").read_text())
    assert xid79["gpus"] == 8


def test_unreadable_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(bad)


def test_library_builds_once_and_exports_the_nvml_symbols(tmp_path: Path) -> None:
    import ctypes

    first = build_fake_library(tmp_path)
    assert first.name == "libnvidia-ml.so.1"
    assert build_fake_library(tmp_path) == first  # cached by source hash
    lib = ctypes.CDLL(str(first))
    for symbol in (
        "nvmlInitWithFlags",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlEventSetWait_v2",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetRemappedRows",
    ):
        assert hasattr(lib, symbol), symbol


def test_no_compiler_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(FakeLibraryError, match="no C compiler"):
        build_fake_library(tmp_path / "cache")
