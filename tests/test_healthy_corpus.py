"""A benign corpus of healthy training output (tests/corpus/healthy/) must stay silent: no
failure-severity match on any line, and `denpex scan` finds no failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.catalog import load_catalog

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

HEALTHY = sorted((Path(__file__).parent / "corpus" / "healthy").glob("*.log"))


@pytest.mark.skipif(not HEALTHY, reason="no healthy corpus")
def test_healthy_corpus_is_large():
    lines = sum(len(path.read_bytes().splitlines()) for path in HEALTHY)
    print(f"healthy corpus: {len(HEALTHY)} files, {lines} lines")
    assert len(HEALTHY) >= 6 and lines >= 5000


@pytest.mark.parametrize("path", HEALTHY, ids=[p.name for p in HEALTHY])
def test_no_failure_severity_match(path):
    catalog = load_catalog()
    lines = path.read_bytes().replace(b"\r", b"\n").split(b"\n")
    loud = [
        f"{m.signature.id}: {lines[m.line_index][:160]!r}"
        for m in catalog.match_lines(lines)
        if m.signature.severity in ("error", "critical")
    ]
    assert loud == []


@pytest.mark.skipif(not HEALTHY, reason="no healthy corpus")
def test_scan_of_the_healthy_corpus_finds_no_failure():
    result = subprocess.run(
        [sys.executable, "-m", "denpex", "scan", "--json", "-q", *map(str, HEALTHY)],
        capture_output=True,
        timeout=300,
    )
    data = json.loads(result.stdout)
    assert result.returncode == 0
    assert data["status"] == "ok" and data["root_cause"]["category"] == "unknown"
