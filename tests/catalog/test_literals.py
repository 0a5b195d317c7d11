"""Required-literal extraction and the portable-regex rules (DESIGN §5)."""

from __future__ import annotations

import pytest

from denpex._native.literals import literal_plan, portability_errors


@pytest.mark.parametrize(
    "pattern,expected",
    [
        (r"NVRM: Xid \(PCI:(?P<pci>[0-9a-f:.]{1,16})\): 79\b", (b"NVRM: Xid (PCI:",)),
        (r"(?:CUDA out of memory|OutOfMemoryError)", (b"CUDA out of memory", b"OutOfMemoryError")),
        (r"(?i)Bus Error", (b"bus error",)),
        (r"[0-9]{1,3}abc(?:def)+", (b"abc",)),
        (r"x(?:defgh)+", (b"defgh",)),
    ],
)
def test_literal_plan_finds_the_required_literal(pattern, expected):
    plan = literal_plan(pattern, min_length=3)
    assert plan is not None and plan.alternatives == expected


@pytest.mark.parametrize("pattern", [r"(?:abc)?xy", r"a|b", r"[a-z]{1,5}"])
def test_patterns_without_a_required_literal(pattern):
    assert literal_plan(pattern, min_length=3) is None


def test_unbounded_repeat_before_literal_is_detected():
    assert literal_plan(r"(?P<x>\S+) NCCL WARN", 3).unbounded_before
    assert not literal_plan(r"NCCL WARN (?P<x>\S+)", 3).unbounded_before
    assert not literal_plan(r"(?P<x>[^ \n]{1,64}) NCCL WARN", 3).unbounded_before


@pytest.mark.parametrize(
    "pattern,problem",
    [
        (r"a\sb", r"\s"),
        (r"abc[^x]", "newline"),
        (r"abc[^ ]+", "newline"),
        (r"(abc)\1", "backreference"),
        (r"abc(?=d)", "lookahead"),
        (r"(?s)abc.", "(?s)"),
        (r"abc(?i:d)", "scoped flags"),
        (r"abc(", "does not compile"),
    ],
)
def test_portability_errors(pattern, problem):
    errors = portability_errors(pattern)
    assert any(problem in e for e in errors), errors


def test_portable_patterns_pass():
    assert portability_errors(r"abc[^ \n]{1,8}[ \t]+\d+\S+") == []


def test_a_pattern_is_compiled_once_however_large_the_catalog():
    """The loader and the matcher compile the same patterns; re's own cache keeps only 512, so
    a larger catalog would compile every pattern twice without compile_pattern's cache."""
    from denpex._native.literals import compile_pattern

    first = compile_pattern("denpex-test-once [0-9]{1,3}")
    for i in range(700):
        compile_pattern(f"denpex-test-filler-{i} [a-z]{{1,4}}")
    assert compile_pattern("denpex-test-once [0-9]{1,3}") is first
