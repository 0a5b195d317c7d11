"""Loss rules of denpex.series: median/MAD spikes, divergence, NaN episodes, and what early
training is allowed (a spike that recovers, a NaN on a step the loss scaler skipped)."""

from __future__ import annotations

import math
import random

import pytest

from denpex.core.detectors import detector
from denpex.series.loss import LossSpikeDetector, NonFiniteLoss, nan_finding, robust_z
from denpex.series.thresholds import LossRules, with_options

NAN = float("nan")


def rules(**overrides: float) -> LossRules:
    return with_options(LossRules, overrides)


def run(detector: LossSpikeDetector, losses: dict[int, float], steps: int, seed: int = 11):
    print("seed", seed)
    rng = random.Random(seed)
    found = []
    for step in range(1, steps + 1):
        loss = losses.get(step, 3.0 * math.exp(-step / 400) + 0.5 + rng.gauss(0, 0.05))
        finding = detector.observe(step, loss)
        if finding:
            found.append(finding)
    return found


def test_robust_z_ignores_outliers_in_the_history():
    history = [1.0, 1.1, 0.9, 1.0, 50.0, 1.05, 0.95]
    assert robust_z(history, 1.0) == pytest.approx(0.0, abs=1e-9)
    assert robust_z(history, 3.0) > 10
    assert math.isfinite(robust_z([2.0] * 30, 2.001))  # flat history: no division by zero


def test_noisy_decreasing_loss_gives_no_spike_and_a_jump_gives_one_warning():
    found = run(LossSpikeDetector(rules(spike_window=100)), {900: 10.0}, 1000)
    assert [f.captures["step"] for f in found] == ["900"]
    assert found[0].signature == "train.loss_spike.robust_z"
    assert detector(found[0].signature).severity == "warning"  # the catalog's, not the code's
    assert found[0].category == "train.loss_spike"
    assert found[0].summary.startswith("loss 10 at step 900 is ")


def test_a_warm_up_spike_that_recovers_is_not_reported():
    found = run(LossSpikeDetector(), {40: 20.0, 41: 15.0}, 300)
    assert found == []


def test_a_warm_up_spike_that_stays_is_a_divergence():
    losses = {step: 30.0 + step for step in range(40, 300)}
    (found,) = run(LossSpikeDetector(), losses, 300)
    assert found.signature == "train.loss_spike.divergence"
    assert detector(found.signature).severity == "error"
    assert found.summary.startswith("the loss diverged: 5 losses in a row from step 40 lie over 10")
    assert found.captures["step"] == "40" and found.captures["last_step"] == "44"


def test_a_divergence_is_reported_once_then_again_after_recovery():
    losses = {s: 40.0 for s in range(200, 210)} | {s: 40.0 for s in range(400, 406)}
    found = run(LossSpikeDetector(), losses, 500)
    kinds = [(f.signature.rsplit(".", 1)[1], f.captures["step"]) for f in found]
    assert kinds == [("robust_z", "200"), ("divergence", "200"), ("robust_z", "400"),
                     ("divergence", "400")]  # fmt: skip


def test_a_wiggle_on_a_flat_coarsely_printed_loss_is_not_a_spike():
    detector = LossSpikeDetector()
    found = [detector.observe(s, 2.31 if s % 7 else 2.32) for s in range(1, 400)]
    assert not any(found)


def test_nan_loss_is_not_a_spike_and_does_not_enter_the_history():
    detector = LossSpikeDetector(rules(spike_min_history=2))
    assert detector.observe(1, NAN) is None
    assert len(detector.history) == 0


def test_a_nan_episode_is_reported_once_at_its_first_step():
    nan = NonFiniteLoss()
    got = [nan.observe(s, NAN if 150 <= s < 160 else 1.0) for s in range(1, 200)]
    episodes = [e for e in got if e is not None]
    assert len(episodes) == 1 and episodes[0].first_step == 150
    finding = nan_finding(episodes[0])
    assert finding.signature == "train.nan_loss.value" and finding.captures["step"] == "150"
    assert finding.summary == "loss became nan at step 150"
    assert nan_finding(episodes[0], "layers.3").signature == "train.nan_loss.first_module"


def test_a_few_skipped_overflow_steps_at_the_start_are_not_failures():
    nan = NonFiniteLoss()
    for step in range(1, 4):  # the scaler's first steps: inf loss, step skipped
        assert nan.observe(step, math.inf, skipped=True) is None
    assert nan.observe(4, 2.5) is None  # recovered: forgiven
    assert nan.finish() is None


def test_warm_up_nans_without_a_skip_or_too_many_are_failures():
    nan = NonFiniteLoss()
    assert nan.observe(5, NAN) is not None  # not a skipped step: at once
    held = NonFiniteLoss(rules(nan_overflow_tolerance=2))
    assert held.observe(1, NAN, skipped=True) is None
    assert held.observe(2, NAN, skipped=True) is None
    episode = held.observe(3, NAN, skipped=True)
    assert episode is not None and episode.first_step == 1 and episode.count == 3
    late = NonFiniteLoss()
    assert late.observe(500, NAN, skipped=True) is not None  # past warm-up: at once


def test_a_held_nan_that_never_recovers_is_reported_at_the_end():
    nan = NonFiniteLoss()
    assert nan.observe(7, NAN, skipped=True) is None
    episode = nan.finish()
    assert episode is not None and episode.first_step == 7
    assert nan.finish() is None  # once
