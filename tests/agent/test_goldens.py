"""The agent's whole outputs against their golden files (tests/agent/goldens/): the /metrics
page and the OTLP metrics and logs payloads built from the fixture trees and the fake NVML
scenario. After an intended change regenerate them with `python -m tests.agent.goldens
--update` and review the diff; see tests/agent/goldens.py for what they are built from."""

from __future__ import annotations

import pytest

from tests.agent import goldens


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return goldens.build(tmp_path_factory.mktemp("goldens"))


def test_outputs_match_their_golden_files(built: dict[str, str]) -> None:
    assert set(built) == {p.name for p in goldens.GOLDEN_DIR.iterdir()}
    problems = goldens.differences(built)
    assert not problems, f"regenerate with `{goldens.UPDATE_COMMAND}` if intended:\n" + "\n".join(
        problems
    )


def test_goldens_cover_every_family_of_source_and_carry_no_machine_path(
    built: dict[str, str],
) -> None:
    page = built["metrics.txt"]
    for family in ("cgroup_", "psi_", "proc_", "numa_", "pcie_", "ib_", "roce_", "nccl_topo_"):
        assert f"# HELP denpex_{family}" in page, family
    assert "# HELP DCGM_FI_DEV_GPU_TEMP" in page and "# HELP denpex_gpu_" in page
    assert "as reported by the" not in page  # every exported metric has its own HELP text
    assert goldens.leaked_paths(built) == []


def test_a_renamed_metric_shows_as_a_difference(built: dict[str, str]) -> None:
    changed = {**built, "metrics.txt": built["metrics.txt"].replace("psi_some", "psi_any")}
    (problem,) = goldens.differences(changed)
    assert "-# HELP denpex_psi_some_avg10_ratio" in problem


def test_one_naming_rule_for_metrics_and_otlp(built: dict[str, str]) -> None:
    """Every series of the page is named the same in the OTLP payload (the agent's own
    self-metrics exist only on the page)."""
    page_names = {
        line.split("{")[0].split(" ")[0]
        for line in built["metrics.txt"].splitlines()
        if line and not line.startswith("#")
    }
    otlp = built["otlp_metrics.json"]
    collected = {n for n in page_names if not n.startswith(SELF_METRICS)}
    missing = sorted(n for n in collected if f'"name": "{n}"' not in otlp)
    assert not missing


SELF_METRICS = (
    "denpex_agent",
    "denpex_collector_",
    "denpex_evidence_",
    "denpex_lines_scanned",
)
