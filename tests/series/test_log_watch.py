"""The numbers in a job's log become evidence through the scanner: per rank, with the step,
for NaN losses, divergence, loss-scale collapse, stalls and stragglers; healthy logs and the
normal start of fp16 training stay silent."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

import denpex._native as native
from denpex.catalog import load_catalog
from denpex.lite.scanner import Scanner
from denpex.series.log_watch import _Batch, _lines_with_literals
from denpex.series.parse import LITERALS
from denpex.series.sampling import FULL_PARSE_LINES

# the sampler finds non-finite values with the native matcher: on it and on its twin
pytestmark = pytest.mark.usefixtures("both_backends")

START = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
CATALOG = load_catalog()


def stamp(seconds: float) -> str:
    return (START + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def scan(text: str) -> Scanner:
    scanner = Scanner(CATALOG)
    data = text.encode()
    for at in range(0, len(data), 4096):  # arbitrary chunks, as a pipe delivers them
        scanner.feed("log", data[at : at + 4096])
    scanner.close_all()
    scanner.apply_stream_defaults()
    return scanner


def series_evidence(scanner: Scanner, category: str | None = None) -> list:
    return [
        e
        for e in scanner.evidence
        if e.event.attrs.get("detector") == "series" and category in (None, e.category)
    ]


def healthy_loss(step: int, rng: random.Random) -> float:
    return 2.0 + 3.0 * math.exp(-step / 300) + rng.gauss(0, 0.03)


def test_a_nan_on_one_rank_is_evidence_with_its_rank_and_step():
    rng = random.Random(3)
    print("seed", 3)
    lines = []
    for step in range(1, 200):
        for rank in (0, 1):
            loss = "nan" if rank == 1 and step >= 150 else f"{healthy_loss(step, rng):.4f}"
            lines.append(f"[rank{rank}]: {{'loss': '{loss}', 'grad_norm': '0.9', 'epoch': 0.1}}")
    found = scan("\n".join(lines) + "\n")
    (nan,) = series_evidence(found, "train.nan_loss")
    assert nan.signature == "train.nan_loss.value" and nan.severity == "error"
    assert nan.event.rank == 1 and nan.captures["rank"] == "1"
    assert nan.captures["step"] == "150"  # HF dicts carry no step: the entry's index
    assert nan.event.source == "log" and nan.event.attrs["format"] == "hf"
    assert [e.category for e in series_evidence(found)] == ["train.nan_loss"]


def test_a_line_a_signature_matched_keeps_only_the_signatures_evidence():
    text = "".join(f"step {s} | lr 3.0e-04 | loss: {2.5:.4f}\n" for s in range(1, 50))
    found = scan(text + "step 50 | lr 3.0e-04 | loss: nan | grad_norm: inf\n")
    nan = [e for e in found.evidence if e.category == "train.nan_loss"]
    assert [e.signature for e in nan] == ["train.nan_loss.loss_is_nan"]


def megatron(step: int, loss: float, scale: float, ms: float = 400.0, skipped: int = 0) -> str:
    return (
        f" iteration {step:8d}/{5000:8d} | consumed samples: {step * 512:12d} | elapsed time "
        f"per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 | global batch size:   512 "
        f"| lm loss: {loss:.6E} | loss scale: {scale:.1f} | grad norm: 1.234 | number of skipped "
        f"iterations: {skipped:3d} | number of nan iterations:   0 |"
    )


def test_megatron_divergence_and_a_collapsing_loss_scale():
    rng = random.Random(4)
    print("seed", 4)
    lines = []
    for it in range(10, 3010, 10):
        n = it // 10
        loss = healthy_loss(n, rng) if it < 2000 else 12.0 + n * 0.1
        scale = 2.0**16 if it < 2500 else max(1.0, 2.0 ** (16 - (it - 2490) // 10))
        lines.append(megatron(it, loss, scale))
    found = scan("\n".join(lines) + "\n")
    spike, diverged = series_evidence(found, "train.loss_spike")  # a warning, then the failure
    assert spike.signature == "train.loss_spike.robust_z" and spike.severity == "warning"
    assert diverged.signature == "train.loss_spike.divergence" and diverged.is_failure
    assert spike.captures["step"] == diverged.captures["step"] == "2000"
    assert diverged.event.attrs["format"] == "megatron"
    (collapse,) = series_evidence(found, "train.grad_overflow")
    assert collapse.signature == "train.grad_overflow.loss_scale_collapse"
    assert collapse.captures["step"] == "2550"  # the sixth halving past warm-up


def test_the_normal_start_of_fp16_training_is_silent():
    rng = random.Random(5)
    print("seed", 5)
    lines = []
    skipped = 0
    for step in range(1, 400):
        # DeepSpeed's scaler finding its level: a burst of skipped steps, two of them with an
        # fp16 forward that overflowed too (an inf loss)
        skipped += step <= 16
        lines.append(f"[Rank 0] step={step}, skipped={skipped}, lr=[0.0001], mom=[(0.9, 0.99)]")
        loss = "inf" if step in (3, 4) else f"{healthy_loss(step, rng):.4f}"
        lines.append(f"step {step} loss={loss}")
    found = scan("\n".join(lines) + "\n")
    assert [e for e in series_evidence(found) if e.is_failure] == []


def test_a_rank_that_stops_while_the_others_go_on_is_a_hang():
    lines = []
    for step in range(1, 600):
        for rank in (0, 1, 2):
            if rank == 2 and step > 200:
                continue  # rank 2 stopped printing at step 200 (at 400 s)
            t = step * 2.0 + rank * 0.01
            lines.append(f"[rank{rank}]:{stamp(t)} step={step} loss=2.0 step_time=2.0")
    lines.append(f"[rank0]:{stamp(1205.0)} training goes on")
    found = scan("\n".join(lines) + "\n")
    (hang,) = series_evidence(found, "train.hang")
    assert hang.signature == "train.hang.progress_stopped" and hang.severity == "error"
    assert hang.event.rank == 2 and hang.captures["step"] == "200"
    assert float(hang.captures["seconds"]) > 600
    assert hang.summary.startswith("rank 2 logged no step for ")
    assert hang.summary.endswith(" s after step 200, while other ranks went on")


def test_steps_that_stop_before_the_stated_last_one_are_a_hang_and_a_quiet_end_context():
    lines = [f"{stamp(i * 4.0)} " + megatron(i * 10, 2.5, 4096.0) for i in range(1, 100)]
    lines.append(f"{stamp(99 * 4.0 + 1800)} [E ProcessGroupNCCL.cpp:123] watchdog timeout")
    (hang,) = series_evidence(scan("\n".join(lines) + "\n"), "train.hang")
    assert hang.signature == "train.hang.progress_stopped"
    assert hang.captures["total_steps"] == "5000" and hang.captures["step"] == "990"
    assert hang.summary.endswith("after step 990, short of its last step 5000")
    plain = [f"{stamp(i * 4.0)} step={i} loss=2.5" for i in range(1, 100)]
    plain.append(f"{stamp(99 * 4.0 + 1800)} saving the final model")
    (quiet,) = series_evidence(scan("\n".join(plain) + "\n"), "train.hang")
    assert quiet.signature == "train.hang.no_step_before_end" and quiet.severity == "info"
    assert quiet.summary == "the job logged no step for 1800 s after step 99, before the log ended"


def test_a_rank_slower_than_its_peers_is_a_straggler():
    lines = []
    for step in range(1, 80):
        for rank in range(4):
            seconds = 0.52 if rank == 3 else 0.40
            lines.append(f"[rank{rank}]: step={step}, loss=2.0, step_time={seconds}")
    found = scan("\n".join(lines) + "\n")
    (slow,) = series_evidence(found, "train.straggler")
    assert slow.signature == "train.straggler.step_time" and slow.event.rank == 3
    assert slow.severity == "warning" and 1.25 < float(slow.captures["ratio"]) < 1.35
    assert slow.summary == (
        "Rank 3 is a straggler: its steps take 0.52 s, 30 % slower than its peers' median of 0.4 s"
    )


def test_a_long_healthy_log_in_every_format_is_silent():
    rng = random.Random(6)
    print("seed", 6)
    lines = []
    for step in range(1, 600):
        loss = healthy_loss(step, rng)
        lines.append(f"{{'loss': '{loss:.4g}', 'grad_norm': '0.8', 'learning_rate': '1e-4'}}")
        lines.append(megatron(step, loss, 2.0**16, 400 + rng.uniform(-20, 20)))
        lines.append(
            f"[1000] timing/steps_per_second={2.5 + rng.uniform(-0.1, 0.1):.3f}, train/loss={loss:.4f}"
        )
        lines.append(f"{step}/600 [==>....] - ETA: 1:00 - loss: {loss:.4f} - accuracy: 0.9")
        lines.append(f"iter {step}: loss {loss:.4f}, time {120 + rng.uniform(-5, 5):.2f}ms")
    found = scan("\n".join(lines) + "\n")
    assert series_evidence(found) == []
    # past FULL_PARSE_LINES lines with numbers a deterministic sample is read (series.sampling)
    assert FULL_PARSE_LINES < found.series.parsed_lines < 5 * 599


def test_a_long_log_is_sampled_yet_a_nan_and_a_divergence_are_found():
    rng = random.Random(8)
    print("seed", 8)
    lines = []
    for step in range(1, 30001):
        loss = healthy_loss(step, rng) if step < 20000 else 40.0 + step / 1000
        lines.append(f"[rank{step % 4}]: step={step}, loss={loss:.4f}")
    lines[25000] = "[rank0]: step=25001, loss nan"  # a form no signature reads
    found = scan("\n".join(lines) + "\n")
    assert found.series.parsed_lines < 30000 // 4  # a sample ...
    kinds = {(e.signature, e.event.rank) for e in series_evidence(found) if e.is_failure}
    assert ("train.nan_loss.value", 0) in kinds  # ... that never skips a non-finite loss
    assert {r for s, r in kinds if s == "train.loss_spike.divergence"} == {0, 1, 2, 3}


def test_a_long_slow_log_read_on_a_sample_ends_without_a_false_hang():
    # one step a minute: a sampling gap spans hours, yet every rank printed until the end
    rng = random.Random(9)
    print("seed", 9)
    lines = []
    for step in range(1, 5001):
        for rank in range(4):
            t = step * 60.0 + rank * 0.5
            loss = healthy_loss(step, rng)
            lines.append(f"[rank{rank}]:{stamp(t)} step={step} loss={loss:.4f} step_time=59.9")
    lines.append(f"[rank0]:{stamp(5001 * 60.0)} saving the last checkpoint")
    found = scan("\n".join(lines) + "\n")
    assert found.series.parsed_lines < len(lines) // 2  # a sample was judged ...
    assert series_evidence(found, "train.hang") == []  # ... and the end read whole


def test_denpex_scan_reports_the_nan_of_a_log(tmp_path):
    rng = random.Random(7)
    print("seed", 7)
    # nanoGPT's line: no signature reads `loss nan`, the series parser does
    text = "".join(
        f"[rank3]: iter {s}: loss {healthy_loss(s, rng) if s < 80 else math.nan:.4f}, "
        "time 120.00ms\n"
        for s in range(1, 120)
    )
    log = tmp_path / "train.log"
    log.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "denpex", "scan", "--json", str(log)],
        capture_output=True,
        timeout=120,
    )
    report = json.loads(out.stdout)
    rows = [t for t in report["timeline"] if t["category"] == "train.nan_loss"]
    assert len(rows) == 1 and rows[0]["rank"] == 3  # one episode, one row
    assert rows[0]["signature"] == "train.nan_loss.value" and "iter 80:" in rows[0]["line"]
    assert report["root_cause"]["category"] == "train.nan_loss", report["summary"]


def test_the_series_of_two_logs_never_mix():
    scanner = Scanner(CATALOG)
    for name, level in (("a.log", 0.7), ("b.log", 6.9)):  # two jobs: two loss levels
        scanner.feed(name, "".join(f"step={s} loss={level:.3f}\n" for s in range(1, 300)).encode())
    scanner.close_all()
    assert series_evidence(scanner) == []
    assert {key[0] for key in scanner.series.series} == {"a.log", "b.log"}


def test_the_tail_is_read_on_exactly_the_lines_that_hold_a_literal():
    # one search over the joined batch finds the lines the per-line test finds, from `skip` on
    rng = random.Random(11)
    print("seed", 11)
    words = [b"loss=1.5", b"Loss", b"step=3", b"x" * 40, b"per_second", b"NCCL INFO", b"a"]
    lines = [b" ".join(rng.choices(words, k=rng.randint(1, 3))) for _ in range(400)]
    joined = b"\n".join(lines)
    batcher = native.load("linebatch").LineBatcher()
    native_batch = batcher.feed(joined + b"\n")
    assert list(native_batch) == lines
    for skip in (0, 1, 7, len(lines[0]), len(lines[0]) + 1, len(joined) // 2, len(joined)):
        ends, at = [], 0
        for line in lines:
            at += len(line) + 1
            ends.append(at)
        expected = [
            i for i, line in enumerate(lines) if ends[i] > skip and any(w in line for w in LITERALS)
        ]
        for kind in (lines, native_batch):  # a list (SDK lines blanked) and a native batch
            batch = _Batch(kind, joined, lambda i: None, 1, None, "log", set())
            assert list(_lines_with_literals(batch, skip)) == expected, skip
