"""The shipped embedding model: its vectors against the reference model's, offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from denpex.retrieval import embedding
from tests.retrieval.reference import SENTENCES, VECTORS

OFFLINE_PROBE = """
import json, sys
from denpex.retrieval.embedding import Embedder
vectors = Embedder.load().encode(json.loads(sys.argv[1]))
print(json.dumps({"shape": list(vectors.shape), "torch": "torch" in sys.modules,
                  "first": [float(x) for x in vectors[0][:4]]}))
"""


def test_vectors_match_the_reference_model():
    ref = json.loads(VECTORS.read_text())
    assert ref["sentences"] == SENTENCES, "regenerate: python -m tests.retrieval.reference"
    got = embedding.shared_embedder().encode(SENTENCES)
    want = np.array(ref["vectors"], dtype=np.float32)
    assert got.shape == want.shape == (len(SENTENCES), embedding.DIM)
    cosines = (got * want).sum(axis=1)
    worst = int(np.argmin(cosines))
    assert cosines.min() >= 0.99, f"{SENTENCES[worst]!r}: cosine {cosines[worst]:.4f}"
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_related_failures_are_nearer_than_unrelated_text():
    vec = embedding.shared_embedder().encode(
        [
            "CUDA out of memory. Tried to allocate 20.00 MiB",
            "torch.cuda.OutOfMemoryError: GPU memory exhausted while allocating a tensor",
            "She bought three apples at the market.",
        ]
    )
    assert vec[0] @ vec[1] > vec[0] @ vec[2] + 0.3


@pytest.mark.slow
def test_vendored_reference_vectors_are_the_reference_models():
    from tests.retrieval.reference import compute

    fresh = np.array(compute(), dtype=np.float32)
    vendored = np.array(json.loads(VECTORS.read_text())["vectors"], dtype=np.float32)
    assert np.allclose(fresh, vendored, atol=1e-4)


def _offline_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("DENPEX_EMBEDDING_MODEL", None)
    return env


def test_runs_with_the_network_unplugged():
    """In a network namespace of its own (no interface up), with the hub told to stay
    offline: the model loads and encodes, and torch is never imported."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("this check needs root and util-linux `unshare` (both are in CI)")
    cmd = ["unshare", "-n", sys.executable, "-c", OFFLINE_PROBE, json.dumps(SENTENCES[:3])]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_offline_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["shape"] == [3, embedding.DIM]
    assert out["torch"] is False
    ref = json.loads(VECTORS.read_text())["vectors"][0][:4]
    assert np.allclose(out["first"], ref, atol=0.05)


def test_the_network_namespace_really_has_no_network():
    """The probe above proves nothing if the namespace could still connect: check it cannot."""
    probe = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(2)\n"
        "try:\n    s.connect(('192.0.2.1', 80)); print('connected')\n"
        "except OSError as exc:\n    print('errno', exc.errno)\n"
    )
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", probe], capture_output=True, text=True, timeout=30
    )
    assert done.stdout.strip() == "errno 101", done.stdout + done.stderr  # ENETUNREACH


def test_a_missing_library_is_named_with_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    reason = embedding.unavailable_reason()
    assert reason is not None and "onnxruntime" in reason and "denpex[rag]" in reason
    with pytest.raises(embedding.EmbeddingUnavailable, match="denpex\\[rag\\]"):
        embedding.Embedder.load()


def test_a_missing_model_file_is_said(monkeypatch, tmp_path):
    monkeypatch.setenv("DENPEX_EMBEDDING_MODEL", str(tmp_path / "absent.onnx"))
    assert "is not a file" in (embedding.unavailable_reason() or "")
