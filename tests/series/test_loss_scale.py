"""The fp16 loss-scale rule of denpex.series: a collapse to the minimum, or repeated halvings
after the scaler settled; never the calibration at the start, never a constant bf16 1.0."""

from __future__ import annotations

from denpex.core.detectors import detector
from denpex.series.loss_scale import LossScaleTracker
from denpex.series.thresholds import LossScaleRules, with_options


def tracker(**overrides: float) -> LossScaleTracker:
    return LossScaleTracker(with_options(LossScaleRules, overrides))


def test_repeated_halving_after_warm_up_is_reported_once():
    scales, found, scale = tracker(scale_halvings=4, scale_window=100), [], 65536.0
    for step in range(101, 160):
        if step % 5 == 0:
            scale /= 2  # an overflow every 5 steps, never recovering
        finding = scales.observe(step, scale)
        if finding:
            found.append(finding)
    assert len(found) == 1
    assert found[0].category == "train.grad_overflow"
    assert detector(found[0].signature).severity == "error"
    assert found[0].captures["step"] == "120"


def test_occasional_overflow_with_growth_is_healthy():
    scales, scale = tracker(scale_halvings=4, scale_window=100), 2.0**16
    for step in range(1, 2001):
        if step % 300 == 0:
            scale /= 2  # GradScaler: an occasional overflow ...
        elif step % 250 == 0:
            scale *= 2  # ... and growth after a quiet interval
        assert scales.observe(step, scale) is None


def test_calibration_from_two_to_the_32_is_not_a_collapse():
    scales = tracker()
    for step in range(1, 300):
        assert scales.observe(step, 2.0 ** max(16, 32 - step)) is None


def test_a_fall_to_the_minimum_is_a_collapse_even_early():
    scales = tracker()
    found = [scales.observe(step, 2.0 ** max(0, 16 - step)) for step in range(1, 30)]
    hits = [f for f in found if f is not None]
    assert len(hits) == 1 and hits[0].captures["at_minimum"] == "true"
    assert hits[0].captures["step"] == "16" and hits[0].captures["scale"] == "1"
    assert hits[0].summary == (
        "loss scale fell to its minimum 1 at step 16 (0 overflows after warm-up in the last "
        "200 steps)"
    )


def test_a_bf16_run_printing_a_constant_scale_of_one_never_collapsed():
    scales = tracker()
    assert all(scales.observe(step, 1.0) is None for step in range(1, 500))


def test_skipped_steps_count_when_the_scale_is_not_printed():
    scales = tracker(scale_halvings=6)
    assert scales.observe(10, None, skipped=5) is None  # warm-up: calibration
    assert scales.observe(150, None, skipped=3) is None
    finding = scales.observe(160, None, skipped=3)
    assert finding is not None and finding.captures["halvings"] == "6"
    assert finding.summary.startswith("steps kept being skipped for fp16 overflow at step 160")
    assert scales.overflowed
    assert scales.observe(170, None, skipped=0) is None and not scales.overflowed


def test_a_halving_by_several_powers_counts_each():
    scales = tracker(scale_halvings=6)
    scales.observe(200, 2.0**20)
    finding = scales.observe(210, 2.0**14)  # one log interval, six halvings
    assert finding is not None and finding.captures["halvings"] == "6"
