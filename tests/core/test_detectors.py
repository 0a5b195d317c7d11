"""The detector catalog: its validation (every problem with file:line), the one evidence
constructor, and a walk over the code that emits detector evidence: every id it can emit is
in the catalog, and every catalog entry is emitted by something."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from denpex.catalog import CatalogError, load_catalog, load_signatures
from denpex.core.detectors import (
    UnknownDetector,
    detector,
    detector_catalog,
    detector_evidence,
    parse_detectors,
)
from denpex.core.events import Event
from denpex.core.taxonomy import load_taxonomy
from denpex.gpu.nvml.xid import default_table

REPO = Path(__file__).resolve().parents[2]
# where detector evidence is built: the collectors, the agent, the wrapper, the SDK and the
# training-series detectors it shares with the log scanner
EMITTERS = (
    "denpex/host",
    "denpex/gpu",
    "denpex/fabric",
    "denpex/agent",
    "denpex/lite",
    "denpex/diagnosis",
    "denpex/series",
    "sdk",
)
# calls whose argument at this position (or keyword) is a detector id
CONSTRUCTORS = {"detector_evidence": 1, "poll_finding": 2, "finding": 1, "Finding": 0}

GOOD = """\
- id: host.oom_killed.example
  category: host.oom_killed
  severity: warning
  action: reduce_memory
  summary: "cgroup {cgroup} at {pct:.0%}"
  explain: "What it means, the usual cause, what to check."
  refs: ["https://example.org"]
"""


def parse(text: str):
    return parse_detectors(text, "detectors.yaml", load_taxonomy())


def test_a_valid_entry_loads_with_its_line() -> None:
    found, errors = parse(GOOD + GOOD.replace("example", "other").replace("warning", "error"))
    assert errors == []
    assert [(d.id, d.line) for d in found] == [
        ("host.oom_killed.example", 1),
        ("host.oom_killed.other", 8),
    ]
    assert found[0].render({"cgroup": "/job", "pct": 0.97}) == "cgroup /job at 97%"


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        (("category: host.oom_killed", "category: host.nope"), 2, "not a taxonomy id"),
        (("id: host.oom_killed.example", "id: gpu.thermal.example"), 1, "must start with"),
        (("severity: warning", "severity: loud"), 3, "severity must be one of"),
        (("action: reduce_memory", "action: panic"), 4, "is not one of"),
        (('refs: ["https://example.org"]', "refs: []"), 7, "refs must be"),
        (('summary: "cgroup {cgroup} at {pct:.0%}"', 'summary: "at {0}"'), 5, "must be names"),
        (("explain:", "explained:"), 6, "unknown key 'explained'"),
    ],
)
def test_each_problem_names_its_file_and_line(change, line, message) -> None:
    found, errors = parse(GOOD.replace(*change))
    assert found == []
    assert any(e.startswith(f"detectors.yaml:{line}: ") and message in e for e in errors), errors


def test_duplicate_ids_and_missing_keys_are_reported_together() -> None:
    text = GOOD + GOOD + "- id: host.oom_killed.bare\n  category: host.oom_killed\n"
    _, errors = parse(text)
    assert any("detectors.yaml:8: " in e and "duplicate id (first defined at" in e for e in errors)
    assert sum("missing required key" in e for e in errors) == 5  # severity … refs of `bare`


def test_the_shipped_catalog_is_valid_and_explains_every_entry() -> None:
    catalog = detector_catalog()
    assert len(catalog) > 100
    for entry in catalog.values():
        assert len(entry.explain) > 80, entry.id  # what it means, the cause, what to check
        assert entry.summary and entry.refs, entry.id


def test_no_signature_uses_a_detector_id(tmp_path: Path) -> None:
    signatures = {s.id for s in load_signatures()}
    assert not signatures & set(detector_catalog())
    clash = yaml.safe_load((REPO / "signatures/host/oom.yaml").read_text())[0]
    clash["id"] = "host.oom_killed.cgroup_oom_kill"
    (tmp_path / "clash.yaml").write_text(yaml.safe_dump([clash]))
    with pytest.raises(CatalogError) as raised:
        load_signatures([tmp_path])
    (problem,) = raised.value.errors
    assert "clash.yaml:1: host.oom_killed.cgroup_oom_kill: is a detector id" in problem
    assert "denpex/core/detectors.yaml:" in problem


def test_evidence_takes_category_severity_action_and_summary_from_the_catalog() -> None:
    event = Event(body="", source="cgroup", kind="state")
    found = detector_evidence(
        event, "host.oom_killed.cgroup_oom_kill", captures={"count": "2", "cgroup": "/j"}
    )
    assert (found.signature, found.category, found.severity, found.action) == (
        "host.oom_killed.cgroup_oom_kill",
        "host.oom_killed",
        "critical",
        "reduce_memory",
    )
    assert found.summary == "the OOM killer killed 2 process(es) in memory cgroup /j"
    assert found.captures == {"count": "2", "cgroup": "/j"} and found.id == ""


def test_evidence_refuses_what_the_catalog_does_not_allow() -> None:
    event = Event(body="")
    with pytest.raises(UnknownDetector, match=r"not in denpex/core/detectors\.yaml"):
        detector_evidence(event, "host.oom_killed.made_up")
    with pytest.raises(ValueError, match="fixed in the catalog"):
        detector_evidence(
            event,
            "host.oom_killed.cgroup_oom_kill",
            captures={"count": "1", "cgroup": "/"},
            severity="info",
        )
    with pytest.raises(ValueError, match="cannot render its summary"):
        detector_evidence(event, "host.oom_killed.cgroup_oom_kill", captures={"count": "1"})
    assert detector("host.disk_full.low_free_space").varies  # severity follows the fill level


def test_explain_texts_reach_the_diagnosis_through_the_catalog() -> None:
    explanations = load_catalog().explanations()
    assert (
        explanations["train.sdc.canary_mismatch"] == detector("train.sdc.canary_mismatch").explain
    )
    assert "gpu.fallen_off_bus.xid79" in explanations  # and the signatures' own


# --- the code against the catalog -------------------------------------------------------


def _modules():
    for folder in EMITTERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _id_shaped(text: str, categories: set[str]) -> bool:
    head, _, rest = text.rpartition(".")
    return head in categories and bool(rest) and rest.replace("_", "").isalnum()


def emitted_ids() -> dict[str, str]:
    """Every detector-shaped string literal of the emitting code (id → where), and the
    detectors of the Xid table."""
    categories = {c.id for c in load_taxonomy()}
    found: dict[str, str] = {}
    for path, tree in _modules():
        for node in ast.walk(tree):
            literal = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if literal and _id_shaped(node.value, categories):
                found.setdefault(node.value, f"{path.relative_to(REPO)}:{node.lineno}")
    table = default_table()
    for code, rule in [*table.codes.items(), (None, table.default)]:
        found.setdefault(rule.detector, f"denpex/gpu/nvml/xid.yaml (code {code or 'default'})")
    return found


def test_every_id_the_code_emits_is_in_the_catalog() -> None:
    signatures = {s.id for s in load_signatures()}
    catalog = detector_catalog()
    missing = {i: where for i, where in emitted_ids().items() if i not in catalog}
    missing = {i: where for i, where in missing.items() if i not in signatures}
    assert not missing, f"add these to denpex/core/detectors.yaml: {missing}"


def test_every_catalog_entry_is_emitted_by_something() -> None:
    unused = sorted(set(detector_catalog()) - set(emitted_ids()))
    assert not unused, f"no code emits these detectors: {unused}"


def test_detector_ids_are_written_whole_where_evidence_is_built() -> None:
    """An id built from pieces (f-string, +, format) at a constructor call would escape the
    walk above; tables of whole ids (DETECTORS[kind]) and names passed through are fine."""
    built = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name not in CONSTRUCTORS:
                continue
            position = CONSTRUCTORS[name]
            args = [a for a in node.args if not isinstance(a, ast.Starred)]
            candidates = [args[position]] if len(args) > position else []
            candidates += [k.value for k in node.keywords if k.arg in ("detector_id", "signature")]
            for arg in candidates:
                if isinstance(arg, ast.JoinedStr | ast.BinOp) or (
                    isinstance(arg, ast.Call) and getattr(arg.func, "attr", "") == "format"
                ):
                    built.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not built, f"detector ids built from pieces: {built}"
