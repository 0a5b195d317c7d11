"""The native matcher's prefilter plan never loses a match (pure Python, runs in both modes).

A line that `re.search` matches must hold one of the plan's literals at a site whose context
program accepts; the plan may only narrow, never decide. Random tests print their seed.
"""

from __future__ import annotations

import random
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from denpex._native.contexts import Program, prefilter_plan, run, site_contexts
from denpex._native.literals import compile_pattern, literal_plan
from denpex.catalog import load_signatures


@cache
def catalog():
    program = Program()
    plans = []
    for sig in load_signatures():
        ignorecase, sites = prefilter_plan(sig.pattern, 7) or prefilter_plan(sig.pattern, 1)
        contexts = {
            lit: site_contexts(frames, ignorecase, program) for lit, frames in sites.items()
        }
        plans.append((sig, compile_pattern(sig.pattern), ignorecase, contexts))
    return program, plans


def passes(program: Program, ignorecase: bool, contexts: dict, line: bytes) -> bool:
    haystack = line.lower() if ignorecase else line
    for literal, sites in contexts.items():
        at = haystack.find(literal)
        while at >= 0:
            for head, tail in sites:
                if run(program, head, line, at, True) and run(
                    program, tail, line, at + len(literal), False
                ):
                    return True
            at = haystack.find(literal, at + 1)
    return False


def test_every_catalog_pattern_has_a_plan_of_long_literals_mostly():
    _, plans = catalog()
    short = [sig.id for sig, _, _, contexts in plans if min(map(len, contexts)) < 7]
    assert len(short) <= len(plans) // 20, short


def test_no_catalog_example_is_lost():
    program, plans = catalog()
    for sig, compiled, ignorecase, contexts in plans:
        for text in sig.examples_match + sig.examples_no_match:
            raw = text.encode("utf-8")
            for line in (raw, raw.swapcase(), b"\x00\xff " + raw + b" \r tail"):
                if compiled.search(line):
                    assert passes(program, ignorecase, contexts, line), (sig.id, line)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_no_match_is_lost_on_spliced_examples(seed):
    print("seed", seed)
    program, plans = catalog()
    rng = random.Random(seed)
    texts = [t.encode("utf-8") for sig, *_ in plans for t in sig.examples_match]
    for _ in range(50):
        pieces = [rng.choice(texts) for _ in range(rng.randrange(1, 4))]
        cut = [p[rng.randrange(len(p) + 1) :] if rng.random() < 0.3 else p for p in pieces]
        line = b" ".join(cut)
        for sig, compiled, ignorecase, contexts in plans:
            if compiled.search(line):
                assert passes(program, ignorecase, contexts, line), (seed, sig.id, line)


def test_contexts_reject_healthy_lines_that_hold_the_literal():
    program, plans = catalog()
    healthy = (
        b" iteration      120/  250000 | lm loss: 2.1E+00 | grad norm: 0.871 |"
        b" number of skipped iterations:   0 | number of nan iterations:   0 |"
    )
    rejected = [
        sig.id
        for sig, compiled, ignorecase, contexts in plans
        if any(lit in (healthy.lower() if ignorecase else healthy) for lit in contexts)
        and not passes(program, ignorecase, contexts, healthy)
    ]
    assert any("nan_iterations" in r for r in rejected), rejected


def test_factor_literals_span_alternations():
    ignorecase, sites = prefilter_plan(r"(?:OutOfMemoryError|RuntimeError): CUDA out of memory", 7)
    assert not ignorecase
    assert set(sites) == {
        b"OutOfMemoryError: CUDA out of memory",
        b"RuntimeError: CUDA out of memory",
    }


def test_escaped_bytes_are_the_bytes_the_pattern_matches():
    plan = literal_plan(r"\xffabc", 1)
    assert plan is not None and plan.alternatives == (b"\xffabc",)
    assert compile_pattern(r"\xffabc").search(b"\xffabc")
