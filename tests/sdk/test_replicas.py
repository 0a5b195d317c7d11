"""Replica agreement: the pure majority logic, and real DDP jobs (gloo, spawned processes)
where one rank gets a bit flipped in one parameter."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.sdk.replicas import bucket_bounds, majority_disagreements, slot_digests

# the digests go through the compiled checksum module and its pure-Python twin
pytestmark = pytest.mark.usefixtures("both_backends")

CHILD = Path(__file__).parent / "children" / "ddp_watch.py"


def test_majority_names_the_odd_member_at_its_first_differing_column():
    rows = [[1, 2, 3], [1, 2, 3], [1, 9, 8], [1, 2, 3]]
    found, split = majority_disagreements(rows)
    assert [(d.member, d.slot) for d in found] == [(2, 1)]
    assert not split


def test_agreeing_rows_and_a_two_way_split():
    assert majority_disagreements([[5, 6]] * 3) == ([], False)
    found, split = majority_disagreements([[1, 2], [1, 3]])
    assert found == [] and split


def test_buckets_cover_every_tensor_once():
    for count in (1, 5, 1024, 1025, 5000):
        bounds = bucket_bounds(count, 1024)
        assert bounds[0][0] == 0 and bounds[-1][1] == count
        assert all(a < b for a, b in bounds)
        assert all(b == c for (_, b), (c, _) in itertools.pairwise(bounds))
    assert slot_digests([7, 8, 9], 8) == [7, 8, 9]
    assert len(slot_digests(list(range(10)), 4)) == 4


def run_job(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[int, list[dict]]:
    pytest.importorskip("torch", reason="DDP replica tests need torch")
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {}
    for path in sorted(tmp_path.glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        found[rank] = [json.loads(line) for line in path.read_text().splitlines()]
    return found


def sdc(items: list[dict]) -> list[dict]:
    return [e for e in items if e.get("category") == "train.sdc"]


def test_bit_flip_on_one_of_four_ranks_is_named_within_one_check(tmp_path):
    # 2 slots for 6 tensors: the mismatch is narrowed down by the second, bucket-level gather
    found = run_job(
        tmp_path, "--ranks", "4", "--steps", "12", "--check-every", "5",
        "--flip-rank", "2", "--flip-step", "7", "--slots", "2",
    )  # fmt: skip
    assert sorted(found) == [0, 1, 2, 3]
    assert sdc(found[0]) == sdc(found[1]) == sdc(found[3]) == []
    (evidence,) = sdc(found[2])
    assert evidence["signature"] == "train.sdc.replica_mismatch"
    assert evidence["rank"] == 2 and evidence["source"] == "sdk" and evidence["kind"] == "state"
    assert evidence["captures"]["param"] == "net.2.weight"
    assert evidence["captures"]["rank"] == "2" and evidence["captures"]["host"]
    assert int(evidence["captures"]["step"]) == 10  # the first check after the flip at step 7
    assert evidence["severity"] == "critical" and evidence["action"] == "drain_node"


def test_without_xxhash_or_the_compiled_module_a_flip_is_still_caught(tmp_path):
    # the pure-Python XXH3 is a real fallback: no `xxhash` package (a test extra), no numpy
    # byte views, no compiled module
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "xxhash.py").write_text("raise ImportError('xxhash is not installed here')\n")
    env = {**os.environ, "DENPEX_NO_EXTENSIONS": "1", "PYTHONPATH": str(blocked)}
    found = run_job(
        tmp_path, "--ranks", "3", "--steps", "10", "--check-every", "5",
        "--flip-rank", "1", "--flip-step", "6", env=env,
    )  # fmt: skip
    assert sdc(found[0]) == sdc(found[2]) == []
    (evidence,) = sdc(found[1])
    assert evidence["captures"]["param"] == "net.2.weight"
    assert int(evidence["captures"]["step"]) == 10


@pytest.mark.slow
def test_500_clean_steps_are_silent_then_a_flip_is_caught(tmp_path):
    found = run_job(
        tmp_path, "--ranks", "3", "--steps", "505", "--check-every", "5",
        "--flip-rank", "1", "--flip-step", "501",
    )  # fmt: skip
    for rank in (0, 2):
        assert sdc(found[rank]) == []
    (evidence,) = sdc(found[1])
    assert evidence["captures"]["step"] == "505"
    assert evidence["captures"]["param"] == "net.2.weight"
    # nothing else that claims a failure on any rank during the clean steps
    failures = [e for r in found for e in found[r] if e.get("severity") in ("error", "critical")]
    assert failures == [evidence]
