"""Shared by the native-module tests: import a compiled module or skip with the reason, and the
lines of the log corpora and of the benchmarks' corpus that compiled modules are compared on.

It never falls back to the reference: a test that asks for the native module tests it or skips.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import denpex._native as native


def native_module(name: str) -> ModuleType:
    """The compiled `denpex._native.<name>`, or skip the test saying why it is absent."""
    if native.extensions_disabled():
        pytest.skip("DENPEX_NO_EXTENSIONS=1: the pure-Python reference is in use")
    try:
        return importlib.import_module(f"denpex._native.{name}")
    except ImportError as exc:
        pytest.skip(f"denpex._native.{name} is not built ({exc}); `pip install -e .` builds it")


ROOT = Path(__file__).resolve().parents[2]
CORPUS_LOGS = sorted(
    p
    for p in (ROOT / "tests" / "corpus").rglob("*")
    if p.is_file() and p.suffix not in (".yaml", ".md")
)
BENCH_SEED = 20261130  # benchmarks/bench_scan.py's default
FAILURE_LINES = [b"RuntimeError: CUDA error: an illegal memory access was encountered"]


def corpus_lines() -> list[bytes]:
    """Every line of every corpus log, split on newlines alone (carriage returns kept, as a
    line may hold them) and again on every line end."""
    lines: list[bytes] = []
    for path in CORPUS_LOGS:
        data = path.read_bytes()
        lines += data.split(b"\n")
        lines += data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return lines


def bench_lines(size: int = 3_000_000) -> list[bytes]:
    """The lines of `size` bytes of benchmarks/bench_matcher.py's corpus (bench_scan's seed)."""
    path = ROOT / "benchmarks" / "bench_matcher.py"
    spec = importlib.util.spec_from_file_location("bench_matcher_for_native_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    buf, _ = module.make_corpus(size, BENCH_SEED, FAILURE_LINES)
    return buf.split(b"\n")
