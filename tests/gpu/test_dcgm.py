"""The DCGM collector against a fake libdcgm built from tests/fakes/dcgm once per DCGM major
version (real ctypes calls, real struct versions: a layout out of shape, or a struct version
that major refuses, makes the fake answer DCGM_ST_VER_MISMATCH as DCGM does)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.detectors import detector
from denpex.core.diagnosis import ACTIONS
from denpex.core.events import Evidence
from denpex.core.roots import Roots
from denpex.gpu.dcgm.api import DcgmError, DcgmSession, library_major, load_library
from denpex.gpu.dcgm.collector import HEALTH_DETECTORS, NOT_FOUND, DcgmCollector, run_diagnostics
from denpex.gpu.dcgm.layouts import (
    FIELD_VALUE_VERSION1,
    HEALTH_RESPONSE_VERSION4,
    HEALTH_RESPONSE_VERSION5,
    HEALTH_SYSTEMS,
    FieldValueV1,
    HealthResponseV4,
    HealthResponseV5,
)

REPO = Path(__file__).resolve().parents[2]
SCENARIO = """\
value 0 1 s 550.54.15
value 0 50 s NVIDIA H100 80GB HBM3
value 0 54 s GPU-0b7e1c4a-0000-0000-0000-000000000000
value 0 57 s 00000000:3B:00.0
value 0 55 i 4
value 0 1002 d 0.75
value 0 1004 d 0.25
value 0 1005 d 0.5
value 0 1009 d 123456
value 0 202 i 7
value 1 54 s GPU-0b7e1c4a-0000-0000-0000-000000000001
value 1 1002 d 0.5
value 1 1009 i 9223372036854775792
"""
PCIE_WARN = "incident 1 10 0 3 PCIe replay rate 12/s above 8/s\n"
NVLINK_FAIL = "incident 2 20 1 17 NVLink link 3 down\n"


@pytest.fixture(scope="module")
def fake_dcgm(fake_dcgms) -> Path:
    return fake_dcgms[4]


@pytest.fixture
def scenario(tmp_path, monkeypatch) -> Iterator[Path]:
    path = tmp_path / "scenario.txt"
    path.write_text(SCENARIO)
    monkeypatch.setenv("DENPEX_FAKE_DCGM_SCENARIO", str(path))
    yield path
    path.write_text("")  # releases any call still hanging in the fake


def make_collector(fake: Path, **options) -> DcgmCollector:
    return DcgmCollector(Roots(), {"library_path": str(fake), **options})


def poll(collector: DcgmCollector) -> list:
    return collector.collect(CollectContext(roots=Roots(), host="node7"))


def metrics(out: list) -> dict[tuple[str, str], dict]:
    return {
        (e.body, e.attrs["gpu"]): e.attrs
        for e in out
        if not isinstance(e, Evidence) and e.kind == "metric" and "gpu" in e.attrs
    }


def test_fields_become_dcgm_exporter_metrics(fake_dcgm, scenario) -> None:
    collector = make_collector(fake_dcgm)
    try:
        out = poll(collector)
    finally:
        collector.close()
    found = metrics(out)
    sm = found[("DCGM_FI_PROF_SM_ACTIVE", "0")]
    assert sm["value"] == 0.75 and sm["type"] == "gauge"
    assert sm["UUID"] == "GPU-0b7e1c4a-0000-0000-0000-000000000000"
    assert sm["pci_bus_id"] == "00000000:3B:00.0"
    assert sm["modelName"] == "NVIDIA H100 80GB HBM3"
    # device is nvidia<DCGM gpu id> (dcgm-exporter), not the minor number; the driver a label
    assert sm["device"] == "nvidia0" and sm["Hostname"] == "node7"
    assert sm["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
    assert found[("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0")]["value"] == 0.25
    assert found[("DCGM_FI_PROF_DRAM_ACTIVE", "0")]["value"] == 0.5
    assert found[("DCGM_FI_PROF_PCIE_TX_BYTES", "0")]["value"] == 123456
    assert found[("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0")]["type"] == "counter"
    assert found[("DCGM_FI_PROF_SM_ACTIVE", "1")]["value"] == 0.5
    # DCGM's blank sentinel (no data) is no sample, not a huge number
    assert ("DCGM_FI_PROF_PCIE_TX_BYTES", "1") not in found
    assert all(e.host == "node7" and e.ts_ns and e.source == "dcgm" for e in out)
    assert set(b for b, _ in found) <= set(DcgmCollector.metrics_help)


def test_health_incidents_become_evidence_once(fake_dcgm, scenario) -> None:
    collector = make_collector(fake_dcgm)
    try:
        assert not [e for e in poll(collector) if isinstance(e, Evidence)]
        scenario.write_text(SCENARIO + PCIE_WARN)
        first = [e for e in poll(collector) if isinstance(e, Evidence)]
        scenario.write_text(SCENARIO + PCIE_WARN + NVLINK_FAIL)
        second = [e for e in poll(collector) if isinstance(e, Evidence)]
    finally:
        collector.close()
    assert [(e.category, e.severity, e.action) for e in first] == [
        ("host.pcie_error", "warning", "run_diagnostics")
    ]
    assert first[0].captures["UUID"].endswith("0000") and "12/s" in first[0].summary
    # the PCIe warning persists: reported once; the NVLink failure is new
    assert [(e.category, e.severity, e.action) for e in second] == [
        ("gpu.nvlink", "error", "drain_node")
    ]
    assert second[0].signature == "gpu.nvlink.dcgm_health_nvlink"
    assert second[0].captures["gpu"] == "1" and second[0].event.host == "node7"


def test_every_watched_health_system_has_a_detector_and_known_actions() -> None:
    options = DcgmCollector(Roots()).options
    assert set(options["health"]) == set(HEALTH_DETECTORS) <= set(HEALTH_SYSTEMS)
    for system, actions in options["health"].items():
        assert detector(HEALTH_DETECTORS[system]).varies, system
        assert actions["warn"] in ACTIONS and actions["fail"] in ACTIONS


def test_level3_diagnostic_reports_the_failing_test(fake_dcgm, scenario) -> None:
    scenario.write_text(SCENARIO + "diag 1 4 3 41 Targeted stress: 0.6 TFLOPS below 7.0\n")
    result = run_diagnostics(3, deadline=5.0, options={"library_path": str(fake_dcgm)})
    assert result.level == 3 and result.verdict == "fail"
    assert [(t.name, t.gpu, t.code) for t in result.failed] == [("targeted_stress", 1, 41)]
    assert "below 7.0" in result.failed[0].message
    names = {(t.name, t.gpu) for t in result.tests}
    assert {("software.nvml_library", None), ("memory", 0), ("targeted_power", 1)} <= names
    # level 1 runs only the software tests: the stress failure cannot show
    short = run_diagnostics(1, deadline=5.0, options={"library_path": str(fake_dcgm)})
    assert short.verdict == "pass" and all(t.gpu is None for t in short.tests)


def test_diagnostic_past_its_deadline_is_a_timeout(fake_dcgm, scenario) -> None:
    scenario.write_text(SCENARIO + "hang dcgmActionValidate_v2\n")
    started = time.monotonic()
    result = run_diagnostics(3, deadline=0.3, options={"library_path": str(fake_dcgm)})
    assert time.monotonic() - started < 2.0
    assert result.verdict == "timeout" and "did not return" in result.error


def test_hung_health_check_is_evidence_and_degrades_while_fields_flow(fake_dcgm, scenario) -> None:
    collector = make_collector(fake_dcgm, call_timeout_s=0.3)
    try:
        poll(collector)
        scenario.write_text(SCENARIO + "hang dcgmHealthCheck\n")
        started = time.monotonic()
        first = poll(collector)
        first_s = time.monotonic() - started
        started = time.monotonic()
        second = poll(collector)
        second_s = time.monotonic() - started
        blind = collector.degraded()
        scenario.write_text(SCENARIO)  # the driver comes back
        deadline = time.monotonic() + 3
        while collector.degraded() and time.monotonic() < deadline:
            time.sleep(0.05)
        recovered = collector.degraded()
    finally:
        collector.close()
    budget = DcgmCollector.default_budget_s
    assert first_s < budget and second_s < 0.25  # the second poll does not wait on the hang
    hung = [e for e in first if isinstance(e, Evidence)]
    assert [(e.category, e.severity) for e in hung] == [("gpu.gsp_timeout", "warning")]
    assert hung[0].captures["call"] == "dcgmHealthCheck"
    assert not [e for e in second if isinstance(e, Evidence)]  # one hang, one evidence
    assert ("DCGM_FI_PROF_SM_ACTIVE", "0") in metrics(first)
    assert ("DCGM_FI_PROF_SM_ACTIVE", "0") in metrics(second)
    assert blind and "dcgm.health" in blind
    assert recovered is None


def test_engine_error_degrades_then_reconnects(fake_dcgm, scenario) -> None:
    collector = make_collector(fake_dcgm)
    try:
        scenario.write_text(SCENARIO + "fail dcgmStartEmbedded -21\n")
        assert poll(collector) == []
        reason = collector.degraded()
        scenario.write_text(SCENARIO)
        out = poll(collector)
    finally:
        collector.close()
    assert reason and "DCGM_ST_CONNECTION_NOT_VALID" in reason
    assert metrics(out) and collector.degraded() is None


def test_struct_version_out_of_shape_is_refused(fake_dcgm, scenario) -> None:
    session = DcgmSession(load_library(str(fake_dcgm)))
    try:
        ids = (ctypes.c_ushort * 1)(1002)
        values = (FieldValueV1 * 1)()
        values[0].version = FIELD_VALUE_VERSION1 + 8  # as if a member were missing
        rc = session.lib.dcgmGetLatestValuesForFields(session.handle, 0, ids, 1, values)
        with pytest.raises(DcgmError, match="DCGM_ST_VER_MISMATCH"):
            raise DcgmError("dcgmGetLatestValuesForFields", rc)
    finally:
        session.close()


def test_absent_library_is_reported_by_available(tmp_path) -> None:
    ok, reason = make_collector(tmp_path / "libdcgm.so.4").available()
    assert not ok and reason.startswith(NOT_FOUND)
    result = run_diagnostics(3, deadline=1.0, options={"library_path": str(tmp_path / "x.so")})
    assert result.verdict == "error" and NOT_FOUND in result.error
    try:
        load_library()
    except OSError:
        ok, reason = DcgmCollector(Roots()).available()
        assert not ok and reason.startswith("libdcgm.so not found (install datacenter-gpu-manager)")


def test_library_found_by_soname_on_the_loader_path(fake_dcgm, scenario) -> None:
    code = (
        "from denpex.core.collector import CollectContext\n"
        "from denpex.core.roots import Roots\n"
        "from denpex.gpu.dcgm.collector import DcgmCollector\n"
        "c = DcgmCollector(Roots())\n"
        "assert c.available()[0], c.available()\n"
        "out = c.collect(CollectContext(roots=Roots(), host='n'))\n"
        "print(sorted({e.body for e in out}))\n"
        "c.close()\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dcgm.parent)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "DCGM_FI_PROF_SM_ACTIVE" in done.stdout


@pytest.mark.parametrize("major", [3, 4])
def test_each_major_version_refuses_the_other_health_response(fake_dcgms, scenario, major) -> None:
    """The fake answers as DCGM does: 3.x accepts only dcgmHealthResponse_v4, 4.x only v5."""
    session = DcgmSession(load_library(str(fake_dcgms[major])))
    try:
        group = session.create_group("t", [0])
        v4 = HealthResponseV4(version=HEALTH_RESPONSE_VERSION4)
        v5 = HealthResponseV5(version=HEALTH_RESPONSE_VERSION5)
        rc4 = session.lib.dcgmHealthCheck(session.handle, group, ctypes.byref(v4))
        rc5 = session.lib.dcgmHealthCheck(session.handle, group, ctypes.byref(v5))
    finally:
        session.close()
    ok, mismatch = 0, -12  # DCGM_ST_OK, DCGM_ST_VER_MISMATCH
    assert (rc4, rc5) == ((ok, mismatch) if major == 3 else (mismatch, ok))


@pytest.mark.parametrize("major", [3, 4])
def test_health_checks_work_on_each_major_version(fake_dcgms, scenario, major) -> None:
    scenario.write_text(SCENARIO + PCIE_WARN)
    collector = make_collector(fake_dcgms[major])
    try:
        found = [e for e in poll(collector) if isinstance(e, Evidence)]
        blind = collector.degraded()
    finally:
        collector.close()
    assert blind is None
    assert [(e.category, e.captures["entity"]) for e in found] == [("host.pcie_error", "gpu:0")]


def test_library_major_version_from_version_info_else_soname(fake_dcgms) -> None:
    assert library_major(load_library(str(fake_dcgms[3]))) == 3
    assert library_major(load_library(str(fake_dcgms[4]))) == 4

    class NoVersionInfo:  # a DCGM without dcgmVersionInfo: the soname decides
        pass

    assert library_major(NoVersionInfo(), "libdcgm.so.4") == 4  # type: ignore[arg-type]
    assert library_major(NoVersionInfo(), "/opt/dcgm/libdcgm.so") is None  # type: ignore[arg-type]


SWITCHES = "switches 2\nconnectx 1\n"
SWITCH_FATAL = "incident 2048 20 switch:1 12 NvSwitch 1 fatal error on port 7\n"
SWITCH_ON_A_GPU = "incident 1024 10 0 12 not evaluated for a GPU entity\n"
CONNECTX_FAIL = "incident 4096 20 cx:0 101 ConnectX entity Id:0 uncorrectable fatal errors: 0x10\n"


def test_nvswitch_and_connectx_incidents_come_from_their_own_entities(fake_dcgm, scenario) -> None:
    scenario.write_text(SCENARIO + SWITCHES + SWITCH_FATAL + SWITCH_ON_A_GPU + CONNECTX_FAIL)
    collector = make_collector(fake_dcgm)
    try:
        found = [e for e in poll(collector) if isinstance(e, Evidence)]
    finally:
        collector.close()
    by_id = {e.signature: e for e in found}
    assert set(by_id) == {
        "gpu.nvlink.dcgm_health_nvswitch_fatal",
        "net.link_down.dcgm_health_connectx",
    }
    switch = by_id["gpu.nvlink.dcgm_health_nvswitch_fatal"]
    assert switch.captures["entity"] == "switch:1" and switch.captures["gpu"] == ""
    assert switch.action == "drain_node" and "switch:1" in switch.summary
    connectx = by_id["net.link_down.dcgm_health_connectx"]
    assert connectx.captures["entity"] == "connectx:0" and connectx.severity == "error"


def test_dcgm3_has_no_connectx_entities_and_still_watches_switches(fake_dcgms, scenario) -> None:
    scenario.write_text(SCENARIO + SWITCHES + SWITCH_FATAL + CONNECTX_FAIL)
    collector = make_collector(fake_dcgms[3])
    try:
        found = [e for e in poll(collector) if isinstance(e, Evidence)]
        blind = collector.degraded()
    finally:
        collector.close()
    assert blind is None
    assert [e.signature for e in found] == ["gpu.nvlink.dcgm_health_nvswitch_fatal"]


@pytest.mark.parametrize(
    "code, health, action",
    # DcgmHealthWatch.cpp (4.5): reset and reboot fail, the two drains warn
    [
        (125, 20, "reset_gpu"),
        (126, 20, "drain_node"),
        (127, 10, "drain_node"),
        (128, 10, "reset_gpu"),
    ],
)
def test_driver_watch_reports_the_gpu_recovery_action(
    fake_dcgm, scenario, code, health, action
) -> None:
    """Since DCGM 4.5 the driver watch carries the recovery action, not a driver mismatch."""
    line = f"incident 512 {health} 1 {code} GPU 1 requires a reset to recover from a fault.\n"
    scenario.write_text(SCENARIO + line)
    collector = make_collector(fake_dcgm)
    try:
        (found,) = [e for e in poll(collector) if isinstance(e, Evidence)]
    finally:
        collector.close()
    assert found.signature == "gpu.reset_required.dcgm_recovery_action"
    assert found.category == "gpu.reset_required" and found.action == action


def test_other_driver_incidents_stay_driver_trouble(fake_dcgm, scenario) -> None:
    scenario.write_text(SCENARIO + "incident 512 10 0 3 Driver version mismatch\n")
    collector = make_collector(fake_dcgm)
    try:
        (found,) = [e for e in poll(collector) if isinstance(e, Evidence)]
    finally:
        collector.close()
    assert found.signature == "gpu.driver_mismatch.dcgm_health_driver"


def test_xid_field_carries_dcgm_exporters_err_code_and_err_msg(fake_dcgm, scenario) -> None:
    scenario.write_text(SCENARIO + "value 0 230 i 79\n")
    collector = make_collector(fake_dcgm)
    try:
        found = metrics(poll(collector))
    finally:
        collector.close()
    xid = found[("DCGM_FI_DEV_XID_ERRORS", "0")]
    assert xid["value"] == 79 and xid["err_code"] == "79"
    assert xid["err_msg"] == "GPU has fallen off the bus"
