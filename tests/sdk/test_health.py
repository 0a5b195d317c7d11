"""Health detectors: median/MAD loss spikes, loss-scale collapse, the first module with a
non-finite output, per-layer norms."""

from __future__ import annotations

import math
import random

import pytest

from denpex.sdk.health import LossScaleTracker, LossSpikeDetector, robust_z


def test_robust_z_ignores_outliers_in_the_history():
    history = [1.0, 1.1, 0.9, 1.0, 50.0, 1.05, 0.95]
    assert robust_z(history, 1.0) == pytest.approx(0.0, abs=1e-9)
    assert robust_z(history, 3.0) > 10
    assert math.isfinite(robust_z([2.0] * 30, 2.001))  # flat history: no division by zero


def test_noisy_decreasing_loss_gives_no_spike_and_a_jump_gives_one():
    seed = 11
    print("seed", seed)
    rng = random.Random(seed)
    detector = LossSpikeDetector(window=100, min_history=20, threshold=10.0)
    found = []
    for step in range(1, 1001):
        loss = 3.0 * math.exp(-step / 400) + rng.gauss(0, 0.05)
        if step == 900:
            loss = 10.0
        finding = detector.observe(step, loss)
        if finding:
            found.append(finding)
    assert [f.captures["step"] for f in found] == ["900"]
    assert found[0].category == "train.loss_spike"
    assert found[0].signature == "train.loss_spike.robust_z"


def test_nan_loss_is_not_a_spike_and_does_not_enter_the_history():
    detector = LossSpikeDetector(min_history=2)
    assert detector.observe(1, float("nan")) is None
    assert len(detector.history) == 0


def test_repeated_loss_scale_halving_is_reported_once():
    tracker = LossScaleTracker(halvings=4, window=100, floor=1.0)
    scale, found = 65536.0, []
    for step in range(1, 60):
        if step % 5 == 0:
            scale /= 2  # an overflow every 5 steps, never recovering
        finding = tracker.observe(step, scale)
        if finding:
            found.append(finding)
    assert len(found) == 1
    assert found[0].category == "train.grad_overflow"
    assert found[0].captures["step"] == "20"


def test_occasional_overflow_with_growth_is_healthy_and_a_floor_collapse_is_not():
    tracker = LossScaleTracker(halvings=4, window=100, floor=1.0)
    scale = 2.0**16
    for step in range(1, 2001):
        if step % 300 == 0:
            scale /= 2  # GradScaler: an occasional overflow ...
        elif step % 250 == 0:
            scale *= 2  # ... and growth after a quiet interval
        assert tracker.observe(step, scale) is None
    assert tracker.observe(2001, 0.5) is not None  # below the floor at once


torch = pytest.importorskip("torch", reason="module hooks and norms need torch")

from tests.sdk.models import Poison  # noqa: E402


def test_recorder_names_the_first_module_in_forward_order():
    from denpex.sdk.health import ForwardRecorder

    poison = Poison()
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(8, 8), poison),
        torch.nn.Linear(8, 2),
    )  # fmt: skip
    recorder = ForwardRecorder(model)
    model(torch.ones(3, 4))
    assert recorder.first_nonfinite(recorder.take()) is None
    poison.on = True
    model(torch.ones(3, 4))
    assert recorder.first_nonfinite(recorder.take()) == "2.1"
    recorder.remove()
    model(torch.ones(3, 4))
    assert recorder.take() == []


def test_layer_norms_match_a_direct_computation():
    from denpex.sdk.health import LayerNorms

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    norms = LayerNorms(model.named_parameters())
    assert norms.layers == ["0", "1"]
    found = norms.measure(keep_snapshot=True)
    want_w0 = torch.cat([model[0].weight.flatten(), model[0].bias]).detach().norm()
    want_g1 = torch.cat([model[1].weight.grad.flatten(), model[1].bias.grad]).norm()
    assert float(found["weight"][0]) == pytest.approx(float(want_w0), rel=1e-5)
    assert float(found["grad"][1]) == pytest.approx(float(want_g1), rel=1e-5)
    before = [p.detach().clone() for p in model[1].parameters()]
    optimizer.step()
    ratio, total = norms.update_ratio()
    delta = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(model[1].parameters(), before, strict=False)]
    )
    base = torch.cat([b.flatten() for b in before])
    assert float(ratio[1]) == pytest.approx(float(delta.norm() / base.norm()), rel=1e-4)
    assert total > 0 and norms.update_ratio() is None  # the snapshot is used once
