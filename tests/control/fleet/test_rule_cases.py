"""The fleet rules, one case at a time (cases are data: rule_cases.yaml): each case names
every candidate that must come out, and nothing else may."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from denpex.control.fleet import correlate
from denpex.control.fleet.rules import RULES
from tests.control.fleet.fleet_cases import build_view

CASES = yaml.safe_load((Path(__file__).parent / "rule_cases.yaml").read_text())


def found(case: dict) -> list:
    view, now_ns = build_view(case)
    return correlate(view, now_ns)


def as_rows(candidates) -> list[list[str]]:
    rows = []
    for c in candidates:
        row = [c.rule, c.kind, c.component]
        if c.verdict != "suspect":
            row.append(c.verdict)
        rows.append(row)
    return sorted(rows)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_rule_case(case):
    candidates = found(case)
    assert as_rows(candidates) == sorted(case["expect"] or []), [c.explanation for c in candidates]
    for c in candidates:
        assert 0.0 < c.confidence <= 1.0
        assert c.first_ns <= c.last_ns
        assert c.explanation
        if c.verdict == "suspect":
            assert c.evidence and c.hosts


def test_every_rule_is_exercised_by_a_case():
    fired = {c.rule for case in CASES for c in found(case)}
    assert {rule.__name__ for rule in RULES} <= fired


def test_same_view_same_candidates():
    for case in CASES:
        assert found(case) == found(case)
