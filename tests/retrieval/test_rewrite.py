"""The optional rewrite against a local fake OpenAI-compatible server, good and bad."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.retrieval.block import assemble
from denpex.retrieval.index import Hit
from denpex.retrieval.passages import Passage
from denpex.retrieval.rewrite import endpoint, rewrite, rewritten_lines
from tests.retrieval.fake_openai import FakeOpenAI
from tests.retrieval.test_block import DIAG

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
BLOCK = assemble(
    DIAG,
    [
        Hit(
            Passage(
                "runbook:host.disk_full.x", "signature", "disk", "Free space.", "host.disk_full"
            ),
            0.8,
        )
    ],
    [
        Hit(
            Passage(
                "incident:7", "incident", "t", "disk full", "host.disk_full", "resolved by ops"
            ),
            0.7,
        )
    ],
)
SUMMARY = "No space left on device (rank 0 at 12:00:03 UTC)."


def test_endpoint_urls():
    assert endpoint("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert endpoint("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert endpoint("http://h/x/chat/completions") == "http://h/x/chat/completions"


def test_a_faithful_rewrite_is_kept_and_was_given_only_the_passages():
    with FakeOpenAI("good") as fake:
        done = rewrite(SUMMARY, BLOCK, "host.disk_full", url=fake.url)
    assert done.text is not None and done.reason == ""
    assert "[incident:7]" in done.text and "[e4]" in done.text
    (req,) = fake.requests
    assert req["path"] == "/v1/chat/completions" and req["body"]["temperature"] == 0
    user = req["body"]["messages"][-1]["content"]
    assert (
        "[runbook:host.disk_full.x] Free space." in user and "Resolution: resolved by ops" in user
    )


@pytest.mark.parametrize(
    "mode,reason",
    [
        ("drop", "it dropped citations: runbook:host.disk_full.x"),
        ("invent", "it cites what it was not given: incident:999"),
        ("recause", "it no longer names the root cause host.disk_full"),
        ("http500", "the endpoint answered HTTP 500"),
        ("garbage", "the endpoint is unreachable or broken"),
        ("empty", "the endpoint's answer has no choices[0].message.content"),
        ("slow", "the endpoint is unreachable or broken: timed out"),
    ],
)
def test_a_misbehaving_endpoint_is_discarded_with_its_reason(mode, reason):
    with FakeOpenAI(mode, delay_s=2.0) as fake:
        done = rewrite(SUMMARY, BLOCK, "host.disk_full", url=fake.url, timeout_s=0.5)
    assert done.text is None and done.reason.startswith(reason), done.reason


def test_a_down_endpoint_and_no_endpoint(monkeypatch):
    with FakeOpenAI() as fake:
        url = fake.url
    done = rewrite(SUMMARY, BLOCK, "host.disk_full", url=url, timeout_s=1)  # closed: refused
    assert done.text is None and "unreachable" in done.reason
    monkeypatch.delenv("DENPEX_LLM_URL", raising=False)
    assert rewritten_lines(DIAG, BLOCK) == []  # off by default: not even a note


def test_denpex_scan_prints_a_checked_rewrite_and_survives_a_bad_one():
    path = str(CORPUS / "ckpt_enospc.log")
    for mode, want in (("good", "rewritten by the local model"), ("invent", "rewrite discarded")):
        with FakeOpenAI(mode) as fake:
            env = dict(os.environ, DENPEX_RAG="on", DENPEX_LLM_URL=fake.url, COLUMNS="100")
            done = subprocess.run(
                [sys.executable, "-m", "denpex", "scan", "--no-color", path],
                capture_output=True,
                text=True,
                timeout=300,
                env=env,
            )
        assert done.returncode == 1, done.stderr
        verdict = done.stderr.split("\nrunbook (for evidence")[0]
        assert "root cause: host.disk_full" in verdict  # first and unchanged
        assert want in done.stderr, done.stderr
