"""What both rankers see of a text: the run's own tokens gone, the failure's words kept, and
the lines of a query searched one by one (the best line decides)."""

from __future__ import annotations

import numpy as np

from denpex.retrieval.block import query_lines, query_text
from denpex.retrieval.bm25 import Bm25Index
from denpex.retrieval.index import VectorIndex, query_vectors
from denpex.retrieval.normalise import normalise, rules
from denpex.retrieval.passages import Passage


def test_a_slurm_line_and_its_catalog_example_become_the_same_words():
    run = "slurmstepd: error: *** JOB 4812399 ON gpu-c-004 CANCELLED AT 2026-12-11T11:02:44 "
    example = "slurmstepd: error: *** JOB 123 ON node7 CANCELLED AT 2026-11-30T04:56:09 "
    tail = "DUE TO PREEMPTION ***"
    assert normalise(run + tail) == "slurmstepd: error: JOB ON CANCELLED AT DUE TO PREEMPTION"
    assert (
        normalise(example + tail) == "slurmstepd: error: JOB 123 ON CANCELLED AT DUE TO PREEMPTION"
    )


def test_the_failures_own_numbers_and_names_stay():
    xid = "NVRM: Xid (PCI:0000:b5:00): 79, pid=201877, name=python, GPU has fallen off the bus."
    assert (
        normalise(xid) == "NVRM: Xid (PCI: ): 79, pid= , name=python, GPU has fallen off the bus."
    )
    errno = "OSError: [Errno 28] No space left on device: '/shared/ckpt/run7/step_12000/model.pt'"
    assert normalise(errno) == "OSError: [Errno 28] No space left on device: 'model.pt'"
    ib = "peer 10.88.17.3<51022> status=IBV_WC_RETRY_EXC_ERR(12) at 0x7f3a2c001000 on utf-8"
    assert normalise(ib) == "peer status=IBV_WC_RETRY_EXC_ERR(12) at on utf-8"
    assert len(rules()) >= 10  # read from the data file, in its order


def test_the_query_is_the_causes_distinct_lines_in_the_order_it_cites_them():
    diag = {
        "status": "failed",
        "summary": "s",
        "root_cause": {"evidence": ["e3", "e1", "e2"]},
        "timeline": [
            {"id": "e1", "line": "Traceback (most recent call last):"},
            {"id": "e2", "line": "  Traceback (most recent call last):  "},
            {"id": "e3", "line": "KeyError: 'pixel_values'"},
        ],
    }
    assert query_lines(diag) == ["KeyError: 'pixel_values'", "Traceback (most recent call last):"]
    assert query_text(diag) == "KeyError: 'pixel_values'\nTraceback (most recent call last):"


class _Lines:
    """An embedder that maps each known text to an axis (unknown texts: the last axis)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.seen: list[list[str]] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.seen.append(list(texts))
        out = np.zeros((len(texts), len(self.texts) + 1), np.float32)
        for row, text in enumerate(texts):
            out[row, self.texts.index(text) if text in self.texts else -1] = 1.0
        return out


def test_each_query_line_is_embedded_normalised_and_the_best_line_decides():
    a, b = "disk full on", "link down"
    embedder = _Lines([a, b])
    vectors = query_vectors(embedder, "disk full on gpu-c-004\n\nlink down\nlink down")
    assert embedder.seen == [[a, b]]  # blank and repeated lines left out
    passages = [Passage("p:a", "doc", "a", "x"), Passage("p:b", "doc", "b", "y")]
    index = VectorIndex(passages, np.eye(3, dtype=np.float32)[:2])
    hits = index.search(vectors, 2)
    assert [h.score for h in hits] == [1.0, 1.0]  # each passage through its own line
    assert [h.passage.id for h in index.search(vectors[1], 1)] == ["p:b"]


def test_bm25_indexes_and_searches_the_normalised_words():
    passages = [
        Passage(
            "runbook:pre",
            "signature",
            "preempted",
            "Slurm preempted the job",
            probes=(
                "slurmstepd: error: *** JOB 123 ON node7 CANCELLED AT 2026-11-30T04:56:09 DUE TO "
                "PREEMPTION ***",
            ),
        ),
        Passage("runbook:host", "signature", "node", "node7 node7 node7 is a host"),
    ]
    hits = Bm25Index(passages).search("CANCELLED on node7 DUE TO PREEMPTION", 2)
    assert [h.passage.id for h in hits] == ["runbook:pre"]  # node7 is no word of either


def test_texts_normalised_ahead_read_back_the_same_and_a_damaged_copy_is_redone(
    tmp_path, monkeypatch
):
    from denpex.retrieval import normalise as module

    texts = [
        f"RuntimeError: CUDA error at 2026-12-0{i}T04:56:09 on gpu-c-00{i} pid {i}0000"
        for i in range(1, 8)
    ]
    expected = [module._normalise(t) for t in texts]
    monkeypatch.setattr(module, "_KNOWN", {})
    module.normalise_ahead(texts, tmp_path)
    (kept,) = tmp_path.glob("normalised-*.json")
    assert [normalise(t) for t in texts] == expected
    # a later process reads the copy instead of normalising: a copy that was changed shows it
    kept.write_bytes(kept.read_bytes().replace(b"RuntimeError", b"FromTheCopy"))
    monkeypatch.setattr(module, "_KNOWN", {})
    module.normalise_ahead(texts, tmp_path)
    assert normalise(texts[0]).startswith("FromTheCopy")
    # a torn copy is normalised again and replaced
    kept.write_bytes(b'["half')
    monkeypatch.setattr(module, "_KNOWN", {})
    module.normalise_ahead(texts, tmp_path)
    assert [normalise(t) for t in texts] == expected
    # other texts: another copy, the earlier one removed
    monkeypatch.setattr(module, "_KNOWN", {})
    module.normalise_ahead(texts[:3], tmp_path)
    assert [p.name for p in tmp_path.glob("normalised-*.json")] != [kept.name]
    assert len(list(tmp_path.glob("normalised-*.json"))) == 1
