"""The retrieval block: what it cites, when it is silent, and `denpex scan` printing it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from denpex.catalog import load_catalog
from denpex.lite.file_scan import FileInput, scan_files
from denpex.lite.session import LiteSession, ReportOptions
from denpex.retrieval import lookup
from denpex.retrieval.block import assemble, query_evidence, query_text
from denpex.retrieval.index import Hit
from denpex.retrieval.passages import Passage

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
HEALTHY = CORPUS / "healthy" / "hf_trainer_json_metrics.log"  # no failure evidence
DIAG = {
    "status": "failed",
    "summary": "No space left on device (rank 0 at 12:00:03 UTC).",
    "root_cause": {
        "category": "host.disk_full",
        "signature": "host.disk_full.x",
        "evidence": ["e4"],
    },
    "timeline": [
        {
            "id": "e2",
            "line": "[Rank 1] Watchdog caught collective operation timeout",
            "severity": "error",
        },
        {
            "id": "e4",
            "line": "OSError: [Errno 28] No space left on device: '/ckpt/model.pt'",
            "severity": "error",
        },
    ],
}


def _hit(pid: str, score: float, kind: str = "signature", **kw) -> Hit:
    return Hit(Passage(pid, kind, kw.pop("title", pid), kw.pop("text", pid), **kw), score)


def test_the_query_is_the_causes_own_lines_else_the_summary():
    assert query_evidence(DIAG) == ["e4"]
    assert query_text(DIAG) == "OSError: [Errno 28] No space left on device: '/ckpt/model.pt'"
    no_root = {**DIAG, "root_cause": {"evidence": []}, "timeline": []}
    assert query_text(no_root) == DIAG["summary"]


def test_every_line_cites_its_passage_and_the_evidence():
    block = assemble(
        DIAG,
        [_hit("runbook:host.disk_full.x", 0.8), _hit("doc:DESIGN.md#3", 0.5, "doc")],
        [
            _hit(
                "incident:7",
                0.7,
                "incident",
                category="host.disk_full",
                resolution="resolved by ops at 2026-11-02 10:00 UTC",
            ),
            _hit("incident:9", 0.2, "incident", category="gpu.xid"),  # not similar enough
        ],
    )
    lines = block.lines()
    assert lines[0] == "similar past incidents (for evidence e4)"
    assert "[incident:7]" in lines[1] and "resolved by ops" in lines[1]
    assert not any("incident:9" in line for line in lines)
    assert lines[2] == "runbook (for evidence e4)"
    assert lines[3].startswith("  [runbook:host.disk_full.x] (this cause)")
    assert block.citations() == {"runbook:host.disk_full.x", "doc:DESIGN.md#3", "incident:7", "e4"}
    assert block.to_dict()["incidents"][0]["resolution"].startswith("resolved by ops")


def test_silent_when_off_when_not_installed_and_on_success(monkeypatch):
    catalog = load_catalog()
    assert lookup.retrieval_block({**DIAG, "status": "ok"}, catalog) is None
    monkeypatch.setenv("DENPEX_RAG", "off")
    assert lookup.retrieval_block(DIAG, catalog) is None
    monkeypatch.setenv("DENPEX_RAG", "on")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert lookup.retrieval_block(DIAG, catalog) is None


def test_a_down_incident_source_costs_only_its_own_part():
    def down(query, vector, k):
        raise ConnectionRefusedError(111, "Connection refused")

    block = lookup.retrieval_block(DIAG, load_catalog(), incidents=down)
    assert block is not None and block.incidents == []
    assert "host.disk_full" in {h.passage.category for h in block.runbook}
    assert block.notes == ["past incidents unavailable: [Errno 111] Connection refused"]


def test_a_broken_model_is_a_note_not_a_crash(monkeypatch, tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx file")
    monkeypatch.setenv("DENPEX_EMBEDDING_MODEL", str(bad))
    from denpex.retrieval import embedding

    embedding.shared_embedder.cache_clear()
    try:
        block = lookup.retrieval_block(DIAG, load_catalog())
    finally:
        embedding.shared_embedder.cache_clear()
    assert block is not None and block.runbook == []
    assert block.notes[0].startswith("retrieval failed:")


def _scan(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.parametrize("log", ["ckpt_enospc.log"])
def test_denpex_scan_prints_the_block_under_the_verdict_and_nothing_without_it(log):
    env = dict(os.environ, DENPEX_RAG="on", HF_HUB_OFFLINE="1", COLUMNS="100")
    path = str(CORPUS / log)
    on = _scan("-m", "denpex", "scan", "--no-color", path, env=env)
    assert on.returncode == 1, on.stderr
    verdict, _, block = on.stderr.partition("\nrunbook (for evidence ")
    assert block, on.stderr
    assert "[runbook:host.disk_full." in block and "(this cause)" in block
    assert "FAILED" in verdict and "root cause: host.disk_full" in verdict
    # the extra not installed: onnxruntime unimportable in the child
    hide = (
        "import sys, runpy; sys.modules['onnxruntime'] = None; "
        "sys.argv = ['denpex', 'scan', '--no-color', sys.argv[1]]; "
        "runpy.run_module('denpex', run_name='__main__')"
    )
    off = _scan("-c", hide, path, env=env)
    assert off.returncode == 1
    assert off.stderr == verdict + "\n", "without the extra the verdict is all there is"


def test_the_model_loads_while_the_diagnosis_is_made_and_is_never_left_loading(monkeypatch, capsys):
    monkeypatch.setenv("DENPEX_RAG", "on")
    monkeypatch.setenv("COLUMNS", "100")
    failed = LiteSession(load_catalog(), ReportOptions(color=False))
    failed.scan_file(str(CORPUS / "ckpt_enospc.log"))
    failed.conclude(None, None)
    assert failed._retrieval_ready is not None  # started: the evidence holds a failure
    assert not failed._retrieval_ready.is_alive()  # ... and joined before conclude returned
    assert "denpex-retrieval" not in {t.name for t in threading.enumerate()}
    assert "[runbook:host.disk_full." in capsys.readouterr().err
    healthy = LiteSession(load_catalog(), ReportOptions(color=False))
    healthy.scan_file(str(HEALTHY))
    healthy.conclude(0, None)
    assert healthy._retrieval_ready is None  # no failure: no model loaded for nothing


def test_preparing_with_a_broken_model_raises_nothing(monkeypatch, tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx file")
    monkeypatch.setenv("DENPEX_EMBEDDING_MODEL", str(bad))
    monkeypatch.setenv("DENPEX_RAG", "on")
    from denpex.retrieval import embedding

    embedding.shared_embedder.cache_clear()
    catalog = load_catalog()  # a fresh index: the one kept for this catalog is dropped
    monkeypatch.setattr(lookup, "_INDEXES", {})
    try:
        lookup.prepare(catalog)
        block = lookup.retrieval_block(DIAG, catalog)
    finally:
        embedding.shared_embedder.cache_clear()
    assert block is not None and block.notes[0].startswith("retrieval failed:")


def test_a_scan_of_many_files_loads_the_model_while_the_rest_are_read(monkeypatch, capsys):
    monkeypatch.setenv("DENPEX_RAG", "on")
    session = LiteSession(load_catalog(), ReportOptions(color=False))
    files = [FileInput(str(CORPUS / "ckpt_enospc.log")), FileInput(str(HEALTHY))]
    scan_files(session, files, jobs=2)
    assert session._retrieval_ready is not None  # begun on the first part with a failure
    session.conclude(None, None)
    assert not session._retrieval_ready.is_alive()
    assert "[runbook:host.disk_full." in capsys.readouterr().err
