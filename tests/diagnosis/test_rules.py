"""The causal rules, one case at a time (cases are data: rule_cases.yaml), plus confidence,
contributing roles, timeline selection and determinism."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from denpex.core.events import Event, Evidence
from denpex.diagnosis import DiagnosisInput, diagnose
from denpex.diagnosis.config import load_rules
from denpex.diagnosis.rules import RULES, RuleContext, integrity_on_success

CASES = yaml.safe_load((Path(__file__).parent / "rule_cases.yaml").read_text())
BASE_NS = 1_796_014_569_000_000_000


def make_evidence(items: list[list]) -> list[Evidence]:
    """Evidence from case rows: [category, severity, host, rank, t, source], then optionally a
    body (str) and/or {attrs: …, captures: …, signature: …}."""
    evidence = []
    for index, item in enumerate(items, 1):
        category, severity, host, rank, t, source, *rest = item
        body = next((r for r in rest if isinstance(r, str)), f"{category} line {index}")
        extra = next((r for r in rest if isinstance(r, dict)), {})
        same_line = evidence and body == evidence[-1].event.body and rest  # one line, two matches
        event = Event(
            body=body,
            ts_ns=None if t is None else BASE_NS + int(t * 1e9),
            host=host,
            rank=rank,
            source=source,
            seq=evidence[-1].event.seq if same_line else index,
            attrs=dict(extra.get("attrs", {})),
        )
        evidence.append(
            Evidence(
                id=f"e{index}",
                event=event,
                signature=extra.get("signature", f"{category}.test"),
                category=category,
                severity=severity,
                captures={k: str(v) for k, v in extra.get("captures", {}).items()},
                summary=f"{category} happened",
            )
        )
    return evidence


def run_case(case: dict):
    exit_ = case.get("exit") or {}
    return diagnose(
        DiagnosisInput(
            make_evidence(case["evidence"]),
            exit_code=exit_.get("code"),
            exit_signal=exit_.get("signal"),
        )
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_rule_case(case):
    diagnosis = run_case(case)
    expect = case["expect"]
    assert diagnosis.root_cause.category == expect["category"]
    for key in ("rule", "host", "rank", "attribution"):
        if key in expect:
            assert getattr(diagnosis.root_cause, key) == expect[key]
    if "status" in expect:
        assert diagnosis.status == expect["status"]
    if "findings" in expect:
        assert [f.category for f in diagnosis.findings] == expect["findings"]
    if "max_confidence" in expect:
        assert diagnosis.root_cause.confidence <= expect["max_confidence"]
    if "min_confidence" in expect:
        assert diagnosis.root_cause.confidence >= expect["min_confidence"]
    if "exit" in case:  # the exit status is reported as it was, whatever the verdict
        assert diagnosis.exit_code == case["exit"].get("code")


def test_every_rule_is_exercised_by_a_case():
    fired = {run_case(c).root_cause.rule for c in CASES}
    assert {rule.__name__ for rule in (*RULES, integrity_on_success)} <= fired


def test_symptoms_are_marked_and_confidence_is_bounded():
    case = CASES[0]
    diagnosis = run_case(case)
    roles = {c.category: c.role for c in diagnosis.contributing}
    assert roles == {"nccl.timeout": "symptom"}
    assert [c.count for c in diagnosis.contributing] == [3]
    assert 0.5 < diagnosis.root_cause.confidence <= 0.99
    timeline_roles = [t.role for t in diagnosis.timeline]
    assert timeline_roles[0] == "cause" and "symptom" in timeline_roles
    assert 2 <= len(diagnosis.timeline) <= 8


def test_competing_cause_lowers_confidence():
    alone = run_case({"evidence": [["cuda.oom", "error", "n1", 3, 5, "log"]]})
    rival = run_case(
        {
            "evidence": [
                ["cuda.oom", "error", "n1", 3, 5, "log"],
                ["cuda.illegal_address", "error", "n2", 7, 6, "log"],
            ]
        }
    )
    assert rival.root_cause.confidence < alone.root_cause.confidence


def test_userspace_kernel_line_is_trusted_less():
    items = [["gpu.fallen_off_bus", "critical", "n1", None, 1, "kmsg"]]
    trusted = run_case({"evidence": items})
    evidence = make_evidence(items)
    evidence[0].event.attrs["userspace"] = True
    forged = diagnose(DiagnosisInput(evidence))
    assert forged.root_cause.confidence < trusted.root_cause.confidence


def test_same_evidence_same_diagnosis():
    for case in CASES:
        assert run_case(case).to_dict() == run_case(case).to_dict()


def test_actions_follow_the_root_signature():
    evidence = make_evidence([["gpu.fallen_off_bus", "critical", "node2", None, 1, "kmsg"]])
    evidence[0].action = "drain_node"
    diagnosis = diagnose(DiagnosisInput(evidence, exit_code=1))
    assert [(a.action, a.target) for a in diagnosis.actions] == [
        ("drain_node", "node2"),
        ("run_diagnostics", "node2"),
    ]


def test_thresholds_come_from_data():
    config = load_rules()
    assert config["overflow_repeat"] >= 2
    many = [
        ["train.grad_overflow", "warning", "n", 0, t, "log"]
        for t in range(config["overflow_repeat"])
    ]
    ctx = RuleContext(
        make_evidence([*many, ["app.exception", "error", "n", 0, 99, "log"]]), 1, None, config
    )
    assert RULES[2](ctx).rule == "numerics"


def test_one_line_is_one_timeline_row():
    evidence = make_evidence(
        [
            ["cuda.launch_failure", "error", "n1", 0, 5, "log", "RuntimeError: CUDA error: x"],
            ["app.exception", "error", "n1", 0, 5, "log", "RuntimeError: CUDA error: x"],
            ["nccl.timeout", "error", "n1", 1, 600, "log"],
        ]
    )
    evidence[1].event.seq = evidence[0].event.seq  # both matched on one line
    diagnosis = diagnose(DiagnosisInput(evidence, exit_code=1))
    assert [t.id for t in diagnosis.timeline] == ["e1", "e3"]
    assert "1 later error line(s)" in diagnosis.summary


def test_host_context_as_the_only_lead_says_it_is_not_tied_to_the_job():
    evidence = make_evidence(
        [
            [
                "host.oom_killed",
                "critical",
                "n1",
                None,
                30,
                "kmsg",
                {"attrs": {"attribution": "host"}},
            ]
        ]
    )
    diagnosis = diagnose(DiagnosisInput(evidence, exit_code=1))
    assert diagnosis.root_cause.attribution == "host"
    assert "not tied to this job" in diagnosis.summary


def test_an_independent_finding_is_reported_beside_the_root_cause():
    alone = run_case({"evidence": [["host.disk_full", "error", "n1", 0, 5, "log"]]})
    near = [
        ["host.disk_full", "error", "n1", 0, 5, "log"],
        ["env.import_error", "error", "n1", 1, 9, "log"],
    ]
    far = [near[0], ["env.import_error", "error", "n1", 1, 900, "log"]]
    both, later = run_case({"evidence": near}), run_case({"evidence": far})
    assert (
        [f.category for f in both.findings]
        == [f.category for f in later.findings]
        == ["env.import_error"]
    )
    # a rival failure close in time is a reason for doubt (rule competing_cause), a later one not
    assert both.root_cause.confidence < alone.root_cause.confidence == later.root_cause.confidence
    roles = {t.category: t.role for t in both.timeline}
    assert roles == {"host.disk_full": "cause", "env.import_error": "finding"}


def test_host_context_of_the_causes_category_is_shown_as_context_not_as_the_cause():
    evidence = make_evidence(
        [
            [
                "host.oom_killed",
                "critical",
                "n1",
                None,
                10,
                "kmsg",
                {"attrs": {"attribution": "host"}},
            ],
            ["host.oom_killed", "critical", "n1", 1, 20, "kmsg", {"attrs": {"attribution": "job"}}],
        ]
    )
    diagnosis = diagnose(DiagnosisInput(evidence, exit_signal=9))
    assert diagnosis.root_cause.evidence == ["e2"] and diagnosis.root_cause.rank == 1
    assert {t.id: t.role for t in diagnosis.timeline} == {"e1": "context", "e2": "cause"}
