"""Accuracy on the labelled corpus: the synthetic logs of tests/corpus/ and, measured apart,
the real logs of tests/corpus/real/ copied verbatim from public threads.

One helper evaluates each part and prints its per-category table (right/total) and its
confusion list (want → got, with the file); each part keeps its own thresholds here. The
real part's holdout split is reported as totals only: its per-log results stay hidden
(set DENPEX_CORPUS_HOLDOUT=show to list them) so that nobody tunes the rules to it. Every
diagnosis must also validate against the JSON schema.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from denpex.catalog import load_catalog
from denpex.lite.prefixes import hints_from_path
from denpex.lite.session import LiteSession, ReportOptions

CORPUS = Path(__file__).parent / "corpus"
REAL = CORPUS / "real"
SHOW_HOLDOUT = os.environ.get("DENPEX_CORPUS_HOLDOUT") == "show"


def _labels(folder: Path) -> list[dict]:
    path = folder / "labels.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else []


@dataclass(frozen=True)
class Part:
    """One part of the corpus and the levels it must keep."""

    name: str
    folder: Path
    labels: list[dict]
    target: float  # top-1 accuracy over the logs the rules may be tuned on (not the holdout)
    symptom_first_target: float  # … over those whose first error line is a symptom
    holdout_target: float = 0.0  # … over the holdout, which nobody tunes to: a floor, not a goal


# synthetic: the level reached, rounded down (131/137 = 95.6 %; main had 93.4 % when the real
# part was wired in); its logs carry no symptom_first flag
SYNTHETIC = Part("synthetic", CORPUS, _labels(CORPUS), 0.95, 0.0)
# real: the level reached on dev, rounded down (123/127 = 96.9 %, 13 of its 14 symptom-first
# logs = 92.9 %; the first round had 87.4 % and 71.4 %, the code before it 64.6 % and 31.2 %); the
# holdout (12/18 blind, 13/18 now) keeps the level it has as a floor
REAL_PART = Part("real", REAL, _labels(REAL), 0.96, 0.92, holdout_target=0.72)
ATTRIBUTION_TARGET = 0.80


@dataclass(frozen=True)
class Outcome:
    entry: dict
    diagnosis: dict

    @property
    def got(self) -> str:
        return self.diagnosis["root_cause"]["category"]

    @property
    def right(self) -> bool:
        want_status = self.entry.get("status", self.diagnosis["status"])
        return self.got == self.entry["category"] and self.diagnosis["status"] == want_status

    @property
    def hidden(self) -> bool:
        return self.entry.get("split") == "holdout" and not SHOW_HOLDOUT


def _exit_of(entry: dict) -> tuple[int | None, int | None]:
    """(exit code, signal) as a wrapper sees the job end: a negative code is Python's
    `returncode` of a process killed by that signal."""
    exit_ = entry.get("exit") or {}
    code, sig = exit_.get("code"), exit_.get("signal")
    if isinstance(sig, str):
        sig = int(signal.Signals[sig])
    if isinstance(code, int) and code < 0:
        code, sig = None, -code
    return code, sig


def diagnose_file(folder: Path, entry: dict) -> dict:
    session = LiteSession(load_catalog(), ReportOptions(text=False))
    path = folder / entry["file"]
    host, rank = hints_from_path(entry["file"])
    session.scanner.stream(str(path), host=host, rank=rank)
    session.scanner.feed(str(path), path.read_bytes())
    return session.conclude(*_exit_of(entry)).to_dict()


def evaluate(part: Part) -> list[Outcome]:
    return [Outcome(entry, diagnose_file(part.folder, entry)) for entry in part.labels]


def _share(outcomes: list[Outcome]) -> tuple[int, int, float]:
    right = sum(o.right for o in outcomes)
    return right, len(outcomes), (right / len(outcomes) if outcomes else 1.0)


def report(part: Part, outcomes: list[Outcome]) -> str:
    """Per-category table, confusion list and totals of one part (holdout logs: totals)."""
    shown = [o for o in outcomes if not o.hidden]
    per_category: dict[str, list[bool]] = {}
    for o in shown:
        per_category.setdefault(o.entry["category"], []).append(o.right)
    lines = [f"== {part.name} part: per category (right/total)"]
    for category, oks in sorted(per_category.items()):
        lines.append(f"  {category:<28} {sum(oks)}/{len(oks)}")
    lines.append(f"== {part.name} part: confusion (want → got)")
    for o in shown:
        if not o.right:
            root = o.diagnosis["root_cause"]
            lines.append(
                f"  {o.entry['category']:<24} → {o.got:<24} {root['confidence']:.2f} "
                f"{root['rule']:<22} {o.entry['file']}"
            )
    hidden = [o for o in outcomes if o.hidden]
    if hidden:
        lines.append(f"  (+ {sum(not o.right for o in hidden)} holdout mistakes, not listed)")
    right, total, share = _share(outcomes)
    lines.append(f"{part.name} accuracy: {right}/{total} = {share:.1%}")
    for split in sorted({o.entry["split"] for o in outcomes if "split" in o.entry}):
        r, t, s = _share([o for o in outcomes if o.entry.get("split") == split])
        lines.append(f"  {split}: {r}/{t} = {s:.1%}")
    for split in sorted({o.entry.get("split", "") for o in outcomes}):
        r, t, s = _share(
            [
                o
                for o in outcomes
                if o.entry.get("symptom_first") and o.entry.get("split", "") == split
            ]
        )
        if t:
            lines.append(f"  symptom-first{f' ({split})' if split else ''}: {r}/{t} = {s:.1%}")
    r, t, s = _share([o for o in outcomes if o.entry.get("status") == "ok"])
    lines.append(f"  healthy logs silent: {r}/{t}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def results(module_backend) -> list[Outcome]:
    return evaluate(SYNTHETIC)


@pytest.fixture(scope="module")
def real_results(module_backend) -> list[Outcome]:
    return evaluate(REAL_PART)


def test_corpus_is_big_and_varied():
    labels = SYNTHETIC.labels
    assert len(labels) >= 40
    assert len({e["category"] for e in labels}) >= 20
    assert sum(e["category"] == "unknown" for e in labels) >= 8
    for entry in labels:
        assert (CORPUS / entry["file"]).is_file(), entry["file"]


def test_real_part_is_labelled_from_public_threads():
    labels = REAL_PART.labels
    assert len(labels) >= 120
    logs = {p.name for p in REAL.glob("*.log")}
    assert logs == {e["file"] for e in labels}
    for entry in labels:
        assert entry["source"].startswith("https://"), entry["file"]
        assert entry["split"] in ("dev", "holdout"), entry["file"]
        assert isinstance(entry["symptom_first"], bool), entry["file"]
    assert sum(e["status"] == "ok" for e in labels) >= 10


@pytest.mark.parametrize("part", [SYNTHETIC, REAL_PART], ids=lambda p: p.name)
def test_accuracy(part, results, real_results, validate_diagnosis):
    outcomes = results if part is SYNTHETIC else real_results
    for o in outcomes:
        validate_diagnosis(o.diagnosis)
    print(report(part, outcomes))
    tuned = [o for o in outcomes if o.entry.get("split") != "holdout"]
    holdout = [o for o in outcomes if o.entry.get("split") == "holdout"]
    assert _share(tuned)[2] >= part.target
    symptom_first = [o for o in tuned if o.entry.get("symptom_first")]
    assert _share(symptom_first)[2] >= part.symptom_first_target
    assert _share(holdout)[2] >= part.holdout_target


@pytest.mark.parametrize("part", [SYNTHETIC, REAL_PART], ids=lambda p: p.name)
def test_healthy_runs_are_not_failures(part, results, real_results):
    outcomes = results if part is SYNTHETIC else real_results
    healthy = [o for o in outcomes if o.entry.get("status") == "ok"]
    assert healthy
    for o in healthy:
        assert o.diagnosis["status"] == "ok", "a healthy log" if o.hidden else o.entry["file"]
        assert o.got == "unknown", "a healthy log" if o.hidden else o.entry["file"]


def test_root_cause_rank_and_host_where_labelled(results):
    """Attribution: where a label names the culprit's host or rank and the category is right,
    denpex must name the same host/rank (logs that never say which host printed them limit
    this, hence a threshold below 100 %)."""
    checked, wrong = 0, []
    for o in results:
        if not o.right:
            continue
        for key in ("rank", "host"):
            if key in o.entry:
                checked += 1
                if o.diagnosis["root_cause"][key] != o.entry[key]:
                    wrong.append(
                        f"{o.entry['file']}: {key} {o.diagnosis['root_cause'][key]} "
                        f"!= {o.entry[key]}"
                    )
    print("\n".join(wrong))
    print(f"attribution: {checked - len(wrong)}/{checked} host/rank values right")
    assert checked >= 60
    assert (checked - len(wrong)) / checked >= ATTRIBUTION_TARGET


def test_confidence_is_calibrated_on_the_corpus(results):
    """Per rule: how often it is right and the confidence it claims; right answers must carry
    more confidence than wrong ones, so the number means something to a reader."""
    by_rule: dict[str, list[tuple[bool, float]]] = {}
    for o in results:
        root = o.diagnosis["root_cause"]
        if root["category"] == "unknown":
            continue
        by_rule.setdefault(root["rule"], []).append(
            (root["category"] == o.entry["category"], root["confidence"])
        )
    for rule, outcomes in sorted(by_rule.items()):
        right = sum(ok for ok, _ in outcomes)
        mean = sum(c for _, c in outcomes) / len(outcomes)
        print(f"{rule:<24} right {right}/{len(outcomes)}  mean confidence {mean:.2f}")
    all_outcomes = [o for outcomes in by_rule.values() for o in outcomes]
    right = [c for ok, c in all_outcomes if ok]
    wrong = [c for ok, c in all_outcomes if not ok]
    if wrong:
        assert sum(right) / len(right) > sum(wrong) / len(wrong)


def test_real_categories_exist_in_the_taxonomy():
    from denpex.core.taxonomy import load_taxonomy

    taxonomy = load_taxonomy()
    missing = Counter(e["category"] for e in REAL_PART.labels if e["category"] not in taxonomy)
    assert not missing
