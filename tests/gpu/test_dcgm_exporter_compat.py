"""dcgm-exporter compatibility, against dcgm-exporter's own default counters list (vendored in
tests/gpu/data/dcgm-exporter, Apache-2.0): the DCGM_* metrics both GPU collectors export carry
its names, its Prometheus types and the labels its renderer writes on a GPU's metrics, and
its default fields are all exported (or the data file says why not)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.events import Evidence
from denpex.core.roots import Roots
from denpex.gpu.dcgm.collector import DcgmCollector
from denpex.gpu.dcgm_fields import dcgm_fields
from tests.gpu.nvml_harness import run_scenario

DATA = Path(__file__).parent / "data" / "dcgm-exporter"
GOLDEN_PAGE = Path(__file__).resolve().parents[1] / "agent" / "goldens" / "metrics.txt"
# render_metrics.go (4.5.3-4.8.2), GPU template: gpu, UUID, pci_bus_id, device, modelName,
# GPU_I_PROFILE and GPU_I_ID for a MIG device, Hostname, then the label fields
GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
MIG_LABELS = {"GPU_I_PROFILE", "GPU_I_ID"}
XID_ATTRIBUTES = {"err_code", "err_msg"}  # gpu_collector.go, on DCGM_FI_DEV_XID_ERRORS only
# the defaults that were missing (beside the DRIVER_VERSION label and the MIG labels)
ONCE_MISSING = (
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
)
# every default field the NVML collector can answer, and an Xid, on a GPU in MIG mode and one not
SCENARIO = {
    "description": "dcgm-exporter compatibility: every default field, MIG on GPU 0",
    "gpus": 2,
    "driver_version": "570.124.06",
    "defaults": {
        "memory_temperature_c": 45,
        "energy_mj": 123456789,
        "utilization_encoder": 3,
        "utilization_decoder": 4,
        "memory_reserved_mib": 512,
        "nvlink_links": 2,
        "nvlink_tx_kib": 1000,
        "nvlink_rx_kib": 2000,
        "pcie_replays": 7,
    },
    "gpu": {
        0: {
            "mig_mode": 1,
            "mig": [{"gi": 1, "ci": 0, "profile_id": 9, "slices": 3, "memory_mib": 40192}],
        }
    },
    "timeline": [{"t": 0, "gpu": 1, "xid": 79}],
}


@cache
def exporter_defaults() -> dict[str, tuple[str, bool]]:
    """dcgm-exporter's counters list: name → (Prometheus type, enabled by default); the
    commented-out lines are its optional fields."""
    found: dict[str, tuple[str, bool]] = {}
    for line in (DATA / "default-counters.csv").read_text().splitlines():
        enabled = not line.lstrip().startswith("#")
        fields = [f.strip() for f in line.lstrip("# ").split(",")]
        if len(fields) >= 3 and re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", fields[0]):
            found[fields[0]] = (fields[1], enabled)
    return found


def test_the_vendored_list_keeps_its_licence() -> None:
    licence = (DATA / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0" in licence
    assert "Apache License" in (DATA / "README.md").read_text()
    assert len(exporter_defaults()) > 40


def test_the_data_file_has_dcgm_exporters_types_and_every_default() -> None:
    ours, theirs = dcgm_fields(), exporter_defaults()
    for name, (kind, enabled) in theirs.items():
        if name in ours:
            wanted = {"label": ("label",), "gauge": ("gauge",), "counter": ("counter",)}[kind]
            assert ours[name].type in wanted, f"{name}: {ours[name].type}, dcgm-exporter {kind}"
        elif enabled:
            pytest.fail(f"{name}: a dcgm-exporter default denpex neither exports nor explains")
    for name in ONCE_MISSING:
        assert ours[name].type in ("gauge", "counter") and not ours[name].not_exported, name
    # a dcgm-exporter name is the DCGM field's name as it is: no Prometheus suffix (_total)
    exported = [f.name for f in ours.values() if f.type in ("gauge", "counter")]
    assert all(re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", name) for name in exported)


@pytest.fixture(scope="module")
def nvml_poll(fake_library: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("compat")
    report = run_scenario(fake_library, tmp, SCENARIO, [0.0, 0.3])
    return report["polls"][-1]


def _dcgm_metrics(poll: dict) -> list[dict]:
    return [m for m in poll["metrics"] if m["name"].startswith("DCGM_")]


def test_nvml_exports_dcgm_exporters_names_types_and_labels(nvml_poll: dict) -> None:
    theirs = exporter_defaults()
    found = _dcgm_metrics(nvml_poll)
    names = {m["name"] for m in found}
    for name in ONCE_MISSING:
        assert name in names, name
    for m in found:
        name, attrs = m["name"], m["attrs"]
        if name in theirs:
            assert attrs["type"] == theirs[name][0], name
        labels = set(attrs) - {"value", "type"}
        wanted = GPU_LABELS | {"DCGM_FI_DRIVER_VERSION"}
        if "GPU_I_ID" in attrs:
            wanted |= MIG_LABELS
        if name == "DCGM_FI_DEV_XID_ERRORS":
            wanted |= XID_ATTRIBUTES
        assert labels == wanted, (name, sorted(labels ^ wanted))
        assert attrs["device"] == f"nvidia{attrs['gpu']}", name
        assert attrs["DCGM_FI_DRIVER_VERSION"] == "570.124.06"
        assert attrs["Hostname"] == "node7"


def test_mig_devices_carry_the_mig_labels_and_the_xid_its_message(nvml_poll: dict) -> None:
    found = _dcgm_metrics(nvml_poll)
    mig = [m["attrs"] for m in found if "GPU_I_ID" in m["attrs"]]
    assert mig and all(a["gpu"] == "0" and a["GPU_I_ID"] == "1" for a in mig)
    assert {a["GPU_I_PROFILE"] for a in mig} == {"3g.40gb"}
    (xid,) = [m["attrs"] for m in found if m["name"] == "DCGM_FI_DEV_XID_ERRORS"]
    assert (xid["gpu"], xid["err_code"], xid["err_msg"]) == (
        "1",
        "79",
        "GPU has fallen off the bus",
    )


def test_the_exposition_page_declares_dcgm_exporters_types() -> None:
    """What /metrics serves (the agent's golden page): a counter is a counter, under its name."""
    theirs = exporter_defaults()
    page = GOLDEN_PAGE.read_text()
    declared = dict(re.findall(r"^# TYPE (DCGM_\w+) (\w+)$", page, re.M))
    assert declared, "no DCGM_* family on the golden page"
    for name, kind in declared.items():
        assert name in dcgm_fields(), f"{name}: not a DCGM field name"
        if name in theirs:
            assert kind == theirs[name][0], name
    assert declared["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total" not in page


def test_the_dcgm_collector_writes_the_same_labels(
    fake_dcgms: dict[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(
        "value 0 1 s 570.124.06\nvalue 0 50 s NVIDIA H100 80GB HBM3\n"
        "value 0 54 s GPU-0b7e1c4a-0000-0000-0000-000000000000\nvalue 0 57 s 00000000:3B:00.0\n"
        "value 0 1002 d 0.5\nvalue 0 202 i 3\nvalue 0 230 i 48\n"
    )
    monkeypatch.setenv("DENPEX_FAKE_DCGM_SCENARIO", str(scenario))
    collector = DcgmCollector(Roots(), {"library_path": str(fake_dcgms[4]), "gpus": [0]})
    try:
        out = collector.collect(CollectContext(roots=Roots(), host="node7"))
    finally:
        collector.close()
    found = {
        e.body: e.attrs
        for e in out
        if not isinstance(e, Evidence) and e.kind == "metric" and e.body.startswith("DCGM_FI")
    }
    theirs = exporter_defaults()
    assert {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"} <= set(found)
    for name, attrs in found.items():
        wanted = GPU_LABELS | {"DCGM_FI_DRIVER_VERSION"}
        wanted |= XID_ATTRIBUTES if name == "DCGM_FI_DEV_XID_ERRORS" else set()
        assert set(attrs) - {"value", "type"} == wanted, name
        assert attrs["device"] == "nvidia0" and attrs["DCGM_FI_DRIVER_VERSION"] == "570.124.06"
        if name in theirs:
            assert attrs["type"] == theirs[name][0], name
    assert found["DCGM_FI_DEV_XID_ERRORS"]["err_msg"] == "Double Bit ECC Error"
