"""The reference matcher agrees with a plain per-line `re.search` loop (its definition)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from denpex._native.literals import compile_pattern
from denpex._native.matcher_ref import Matcher

PATTERNS = [
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]{1,16})\): 79\b",
    r"(?:CUDA out of memory|OutOfMemoryError)",
    r"(?i)bus error",
    r"abc[0-9]{0,3}def",
    r"[0-9]{2}zz",  # literal 'zz' is shorter than the catalog minimum: still handled
    r"(?:ab)?c",  # no usable literal at all: confirmed on every line
]
ALPHABET = [
    b"NVRM: Xid (PCI:0000:3b:00): 79",
    b"CUDA out of memory",
    b"BuS ErRoR",
    b"abc12def",
    b"42zz",
    b"c",
    b"\n",
    b"\r",
    b"\x00",
    b"\xff",
    b" ",
    b"x",
    b"OutOfMemoryError",
]


def naive(patterns: list[str], buf: bytes) -> list[tuple[int, int]]:
    compiled = [compile_pattern(p) for p in patterns]
    return [
        (li, pi)
        for li, line in enumerate(buf.split(b"\n"))
        for pi, c in enumerate(compiled)
        if c.search(line)
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=40))
def test_scan_equals_per_line_search(pieces):
    buf = b"".join(pieces)
    assert Matcher(PATTERNS).scan(buf) == naive(PATTERNS, buf)


def test_scan_lines_equals_scan():
    seed = 20261130
    print("seed", seed)
    rng = random.Random(seed)
    lines = [
        b"".join(rng.choice(ALPHABET).replace(b"\n", b"") for _ in range(5)) for _ in range(300)
    ]
    m = Matcher(PATTERNS)
    assert m.scan_lines(lines) == m.scan(b"\n".join(lines))
    assert m.scan_lines([]) == []


def test_every_match_is_reported_not_just_the_first():
    pairs = Matcher(PATTERNS).scan(b"CUDA out of memory and bus error\nnothing here")
    assert pairs == [(0, 1), (0, 2)]
