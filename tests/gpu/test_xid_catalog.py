"""One Xid table: denpex/gpu/xid_catalog.yaml generates the agent's table, its detectors and
the log catalog's Xid signatures (scripts/xid_tables.py); the committed files must be what it
generates, and the NVML event path and `denpex scan` must read every code alike."""

from __future__ import annotations

import copy
import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from denpex.catalog import load_catalog
from denpex.core.detectors import detector
from denpex.gpu.nvml.xid import default_table

REPO = Path(__file__).resolve().parents[2]
# the codes of the H100 era the catalog lists (and the ones the two tables disagreed on)
H100_ERA = (8, 11, 25, 38, 39, 40, 41, 44, 46, 54, 60, 66, 67, *range(70, 78), 80, 110, 136)
H100_ERA += (137, 141, 151, 156, 157, 158, *range(167, 173))


@cache
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("xid_tables", REPO / "scripts" / "xid_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("xid_tables", module)
    spec.loader.exec_module(module)
    return module


@cache
def source() -> dict:
    return yaml.safe_load((REPO / "denpex" / "gpu" / "xid_catalog.yaml").read_text())


def test_the_committed_tables_are_what_the_catalog_generates() -> None:
    gen = generator()
    assert gen.problems(source()) == []
    drift = gen.drift(gen.outputs(source(), gen.DETECTORS.read_text()))
    assert drift == [], "regenerate: python scripts/xid_tables.py --write\n" + "".join(drift)


def test_an_edit_of_the_source_alone_shows_as_drift() -> None:
    gen = generator()
    edited = copy.deepcopy(source())
    edited["codes"][79]["title"] = "GPU went away"  # the agent's table and its detector
    edited["codes"][79]["explain"] = "Gone: drain the node."  # the detector and the signature
    drifted = gen.drift(gen.outputs(edited, gen.DETECTORS.read_text()))
    assert [d.splitlines()[0] for d in drifted] == [
        "--- denpex/gpu/nvml/xid.yaml",
        "--- denpex/core/detectors.yaml",
        "--- signatures/gpu/xid.yaml",
    ]


def test_check_mode_exits_1_on_drift_and_2_on_an_action_its_bucket_forbids(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gen = generator()
    assert gen.main(["--check"]) == 0
    edited = copy.deepcopy(source())
    edited["codes"][79]["title"] = "GPU went away"
    monkeypatch.setattr(gen, "SOURCE", tmp_path / "xid_catalog.yaml")
    gen.SOURCE.write_text(yaml.safe_dump(edited))
    assert gen.main(["--check"]) == 1
    broken = copy.deepcopy(source())
    broken["codes"][63]["action"] = "reset_gpu"  # 63 is IGNORE in the catalog
    gen.SOURCE.write_text(yaml.safe_dump(broken))
    assert gen.main(["--check"]) == 2
    assert any("codes.63" in p and "IGNORE" in p for p in gen.problems(broken))


def _scan_line(code: int) -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python, details"


def test_the_agent_and_the_log_catalog_read_every_code_alike() -> None:
    """The NVML event path (xid.yaml → detectors.yaml) and `denpex scan` (signatures) give
    every code of the catalog the same category; 46, 110, 136, 156 and 158 used to fall to
    the agent's default while scan classified them."""
    table = default_table()
    catalog = load_catalog()
    codes = source()["codes"]
    for code, entry in codes.items():
        rule = table.codes.get(code)
        assert rule is not None, f"Xid {code} missing from the agent's table"
        assert rule.category == entry["category"], code
        assert (rule.severity, rule.action) == (entry["severity"], entry["action"]), code
        ids = [s.id for s in catalog.signatures]
        own = [s for s in catalog.signatures if s.id in _signature_ids(code, entry)]
        assert own and all(s.category == entry["category"] for s in own), code
        assert len(set(ids)) == len(ids)
    for code in (46, 110, 136, 156, 158):
        assert table.rule(code) is not table.default, code
        hits = [m.signature for m in catalog.match_lines([_scan_line(code).encode()])]
        assert [s.category for s in hits if s.id.startswith(("gpu.", "host."))] == [
            codes[code]["category"]
        ], code


def _signature_ids(code: int, entry: dict) -> set[str]:
    given = entry.get("signatures")
    if given:
        return {s["id"] for s in given}
    return {generator()._default_signature(code, entry)["id"]}


def test_the_h100_era_codes_are_in_both_tables() -> None:
    table = default_table()
    catalog = load_catalog()
    for code in H100_ERA:
        assert code in table.codes, code
        assert table.titles.get(code), code
        entry = source()["codes"][code]
        assert _signature_ids(code, entry) <= set(catalog.by_id), code


@pytest.mark.parametrize(
    "code, category, action",
    [
        (61, "gpu.gsp_timeout", "run_diagnostics"),  # unused on A100+: unexpected, diagnose
        (63, "gpu.row_remap", "none"),  # a remap event is not reset-worthy by itself
        (92, "gpu.reset_required", "none"),  # a high SBE rate neither
        (64, "gpu.row_remap", "reset_gpu"),  # reset, then support: not an RMA at once
        (69, "gpu.mmu_fault", "retry_job"),  # restart the application
        (143, "gpu.reset_required", "reset_gpu"),  # reset, not a driver mismatch
        (79, "gpu.fallen_off_bus", "drain_node"),
    ],
)
def test_actions_follow_nvidias_catalog(code: int, category: str, action: str) -> None:
    rule = default_table().rule(code)
    assert (rule.category, rule.action) == (category, action)
    assert detector(rule.detector).action == action


@pytest.mark.parametrize(
    "text, signature, action",
    [
        ("0x0 (None) to 0x1 (GPU Reset Required)", "xid154_reset", "reset_gpu"),
        ("0x0 (None) to 0x2 (Node Reboot Required)", "xid154_reboot", "drain_node"),
        ("0x0 (None) to 0x3 (Drain P2P)", "xid154_drain_p2p", "drain_node"),
        ("0x0 (None) to 0x4 (Drain and Reset)", "xid154_drain_reset", "reset_gpu"),
        ("0x1 (GPU Reset Required) to 0x0 (None)", "xid154_none", "none"),
    ],
)
def test_xid154_takes_its_action_from_its_text(text: str, signature: str, action: str) -> None:
    line = f"NVRM: Xid (PCI:0000:3b:00): 154, pid=1, name=python, GPU recovery action changed from {text}"
    (hit,) = [m.signature for m in load_catalog().match_lines([line.encode()])]
    assert hit.id == f"gpu.reset_required.{signature}" and hit.action == action
