"""The compiled matcher agrees exactly with the reference and with a per-line `re` loop.

Random buffers mix catalog examples, healthy output, `\\r`, 64 KB lines, invalid UTF-8 and NUL
bytes; every random test prints its seed so that a failure can be replayed.
"""

from __future__ import annotations

import random
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex._native import matcher_ref
from denpex._native.literals import compile_pattern
from denpex.catalog import load_signatures
from tests.native.native_support import native_module

HEALTHY = [
    b"[rank3]: step 1200/100000 | loss 2.3456 | lr 3.0e-04 | grad_norm 0.871 | tok/s 123456",
    b"node12:3456:3456 [3] NCCL INFO Channel 02/24 : 0[3] -> 1[7] via P2P/IPC/read",
    b"Epoch 3:  45%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8c     | 4500/10000 [12:34<15:21, 5.97it/s]\r",
    b'{"step": 1200, "loss": 2.3456, "lr": 0.0003, "throughput": 12345.6}',
    b"/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:460: UserWarning: "
    b"torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly",
    b"[ 1234.567890] eth0: renamed from veth1a2b3c",
    b"2026-11-30 05:12:01,123 - INFO - Saving checkpoint to /ckpt/step_1200",
    b"\x00\x00\xff\xfe\xc3(invalid utf-8 \x80\x81",
    b"",
    b"\r",
]


@cache
def catalog_patterns() -> tuple[list[str], list[bytes]]:
    sigs = load_signatures()
    examples = [
        text.encode("utf-8") for s in sigs for text in s.examples_match + s.examples_no_match
    ]
    return [s.pattern for s in sigs], examples


@cache
def matchers():
    patterns, _ = catalog_patterns()
    return native_module("matcher").Matcher(patterns), matcher_ref.Matcher(patterns)


def naive(patterns: list[str], lines: list[bytes]) -> list[tuple[int, int]]:
    compiled = [compile_pattern(p) for p in patterns]
    return [
        (li, pi) for li, line in enumerate(lines) for pi, c in enumerate(compiled) if c.search(line)
    ]


def mutate(rng: random.Random, line: bytes) -> bytes:
    roll = rng.random()
    if roll < 0.1:
        return line.swapcase()
    if roll < 0.2:
        return line.upper()
    if roll < 0.3:  # cut the line somewhere (truncated evidence)
        return line[: rng.randrange(len(line) + 1)]
    if roll < 0.4:
        return bytes([rng.randrange(256)]) + line + b"\x00"
    if roll < 0.45:  # a 64 KB line: healthy text with the example at its end
        return (rng.choice(HEALTHY) * 2000)[: 64 * 1024 - len(line)] + line
    if roll < 0.5:
        return b"\r".join(rng.choice([line, *HEALTHY]) for _ in range(rng.randrange(1, 6)))
    return line


def random_lines(seed: int, count: int) -> list[bytes]:
    _, examples = catalog_patterns()
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        source = examples if rng.random() < 0.4 else HEALTHY
        lines.append(mutate(rng, rng.choice(source)).replace(b"\n", b""))
    if rng.random() < 0.3:
        lines.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    return lines


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 120), st.booleans())
def test_native_equals_reference_on_random_catalog_logs(seed, count, trailing_newline):
    print("seed", seed)
    native, reference = matchers()
    lines = random_lines(seed, count)
    buf = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    got = native.scan(buf)
    assert got == reference.scan(buf)
    assert native.scan_lines(buf.split(b"\n")) == got


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_native_equals_per_line_re_loop(seed):
    print("seed", seed)
    native, _ = matchers()
    lines = random_lines(seed, 40)
    assert native.scan(b"\n".join(lines)) == naive(native.patterns, lines)


def test_every_catalog_example_agrees_with_the_reference():
    native, reference = matchers()
    _, examples = catalog_patterns()
    for text in examples:
        assert native.scan_lines([text]) == reference.scan_lines([text]), text


def test_scan_accepts_any_bytes_like_buffer():
    native, _ = matchers()
    _, examples = catalog_patterns()
    buf = b"\n".join(examples[:50])
    expected = native.scan(buf)
    assert expected
    assert native.scan(bytearray(buf)) == expected
    assert native.scan(memoryview(buf)) == expected


# Patterns outside the catalog rules too: short literals, no literal, ignorecase, anchors.
TRICKY = [
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]{1,16})\): 79\b",
    r"(?:CUDA out of memory|OutOfMemoryError)",
    r"(?i)bus error",
    r"(?i)xyz",
    r"abc[0-9]{0,3}def",
    r"[0-9]{2}zz",
    r"(?:ab)?c",
    r"^start",
    r"end$",
    r"\bword\b",
    r"(?:x|y)?",
    r"\xffq",
]
ALPHABET = [
    b"NVRM: Xid (PCI:0000:3b:00): 79",
    b"CUDA out of memory",
    b"BuS ErRoR",
    b"XyZ",
    b"abc12def",
    b"42zz",
    b"c",
    b"start",
    b"end",
    b"word",
    b"\n",
    b"\r",
    b"\x00",
    b"\xff",
    b"q",
    b" ",
    b"x",
    b"OutOfMemoryError",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=40))
def test_tricky_patterns_equal_per_line_re_loop(pieces):
    buf = b"".join(pieces)
    native = native_module("matcher").Matcher(TRICKY)
    expected = naive(TRICKY, buf.split(b"\n"))
    assert native.scan(buf) == expected
    assert native.scan_lines(buf.split(b"\n")) == expected


@pytest.mark.parametrize(
    "buf", [b"", b"\n", b"\n\n", b"end", b"xyz", b"start\nend", b"abc0def\n", b"\xffq", b"zz"]
)
def test_edge_buffers(buf):
    native = native_module("matcher").Matcher(TRICKY)
    assert native.scan(buf) == matcher_ref.Matcher(TRICKY).scan(buf)
    assert native.scan(buf) == naive(TRICKY, buf.split(b"\n"))


def test_empty_inputs():
    module = native_module("matcher")
    assert module.Matcher([]).scan(b"CUDA out of memory\n") == []
    assert module.Matcher([]).scan_lines([b"x"]) == []
    assert module.Matcher(TRICKY).scan_lines([]) == []
    assert module.Matcher([r"(?:x)?"]).scan(b"") == [(0, 0)]


def test_scan_lines_keeps_each_given_line_whole():
    # a given line may hold a newline: scan_lines searches the line as given, like the reference
    patterns = [r"end$", r"a\nb"]
    lines = [b"the end\n", b"a\nb", b"end"]
    native = native_module("matcher").Matcher(patterns)
    assert native.scan_lines(lines) == matcher_ref.Matcher(patterns).scan_lines(lines)
    assert native.scan_lines(lines) == naive(patterns, lines)


def test_long_line_full_of_literals():
    """Every line is found (its cost, and the compile time, are measured by
    benchmarks/bench_matcher.py: `literal_dense_*` and `compile_s`)."""
    native, _ = matchers()
    line = b"RuntimeError: CUDA out of memory. " * 1900  # 64 KB, a literal every 34 bytes
    pairs = native.scan(b"\n".join([line] * 16))
    assert {li for li, _ in pairs} == set(range(16))
