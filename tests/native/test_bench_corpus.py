"""The benchmarks' training-log corpus is a function of its seed alone, so a number measured on
it (benchmarks/bench_scan.py, bench_matcher.py) can be measured again on the same bytes."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

FAILURE_LINES = [b"RuntimeError: CUDA error: an illegal memory access was encountered"]


def _bench_matcher() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_matcher.py"
    spec = importlib.util.spec_from_file_location("bench_matcher_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_corpus_is_the_same_whenever_it_is_made(monkeypatch):
    bench = _bench_matcher()
    now, _ = bench.make_corpus(300_000, 7, FAILURE_LINES)
    # a year later, by every clock the corpus could read
    later = time.time() + 366 * 86400
    monkeypatch.setattr(time, "time", lambda: later)
    monkeypatch.setattr(time, "time_ns", lambda: int(later * 1e9))
    monkeypatch.setattr(time, "localtime", lambda seconds=None: time.gmtime(later))
    monkeypatch.setattr(
        time, "strftime", lambda fmt, t=None: time.asctime(time.gmtime(later)) + fmt
    )
    again, stats = bench.make_corpus(300_000, 7, FAILURE_LINES)
    assert stats["lines"] > 500
    assert again == now
    other, _ = bench.make_corpus(300_000, 8, FAILURE_LINES)
    assert other != now
