"""Canary micro-batch and weight integrity: weights perturbed outside the optimizer are caught,
legitimate training is not; a faulty compute unit is told transient from persistent."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="canary tests run a torch model")

import denpex.sdk as dx  # noqa: E402
from denpex.sdk.canary import CanaryCheck, CanaryRunner  # noqa: E402


class Faulty(torch.nn.Module):
    """A unit that returns a slightly wrong result on the calls listed in `bad_calls`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.bad_calls: set[int] = set()

    def forward(self, x):
        self.calls += 1
        return x + 1e-3 if self.calls in self.bad_calls else x


def make(seed: int = 0):
    torch.manual_seed(seed)
    faulty = Faulty()
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 12), torch.nn.Dropout(0.5), faulty, torch.nn.Tanh(),
        torch.nn.BatchNorm1d(12), torch.nn.Linear(12, 1),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, faulty


def train(model, optimizer, guard, steps: int, perturb_at: int | None = None) -> None:
    gen = torch.Generator().manual_seed(5)
    for step in range(1, steps + 1):
        x = torch.randn(8, 6, generator=gen)
        optimizer.zero_grad()
        loss = ((model(x) - x[:, :1]) ** 2).mean()
        loss.backward()
        optimizer.step()
        guard.step(loss)
        if step == perturb_at:
            with torch.no_grad():  # a write that is not an optimizer step
                model[0].weight[1, 2] += 1e-4


def sdc(items):
    return [e for e in items if getattr(e, "category", None) == "train.sdc"]


def test_legitimate_training_steps_raise_nothing():
    model, optimizer, _ = make()
    got = []
    guard = dx.watch(
        model, optimizer, every=5, canary_batch=torch.randn(4, 6), canary_every=5,
        emit=got.append, progress=False,
    )  # fmt: skip
    train(model, optimizer, guard, 60)
    guard.close()
    assert sdc(got) == []
    assert model.training  # the canary's eval() was undone


def test_weights_perturbed_outside_the_optimizer_are_detected():
    model, optimizer, _ = make()
    got = []
    guard = dx.watch(
        model, optimizer, every=5, canary_batch=torch.randn(4, 6), canary_every=5,
        emit=got.append, progress=False,
    )  # fmt: skip
    train(model, optimizer, guard, 30, perturb_at=10)  # right after the check at step 10
    guard.close()
    (evidence,) = sdc(got)
    assert evidence.signature == "train.sdc.weights_changed_outside_optimizer"
    assert evidence.captures["step"] == "10"
    assert evidence.captures["seen"] == "before the next optimizer step"
    assert evidence.event.source == "sdk" and evidence.severity == "critical"


def test_a_change_with_no_optimizer_step_is_seen_at_the_next_check():
    model, optimizer, _ = make()
    got = []
    guard = dx.watch(model, optimizer, every=1, emit=got.append, progress=False)
    train(model, optimizer, guard, 3)
    with torch.no_grad():
        model[5].bias += 1.0
    guard.step()  # a step in which the optimizer did not run (e.g. skipped by a GradScaler)
    guard.close()
    (evidence,) = sdc(got)
    assert evidence.captures["seen"] == "at the next check"


@pytest.mark.parametrize(
    ("bad_calls", "kind", "severity"),
    [({2}, "transient", "warning"), ({2, 3, 4}, "persistent", "critical"),
     ({2, 4}, "intermittent", "critical")],
)  # fmt: skip
def test_canary_mismatch_on_unchanged_weights_is_classified(bad_calls, kind, severity):
    model, _, faulty = make()
    faulty.bad_calls = bad_calls
    check = CanaryCheck()
    run = CanaryRunner(model, torch.randn(4, 6))
    finding = check.check(7, weights=123, run=run)  # call 1: reference, call 2: its check
    assert finding is not None and faulty.calls == 4  # bounded: two re-runs, no more
    assert finding.captures["kind"] == kind and finding.severity == severity
    assert finding.signature == "train.sdc.canary_mismatch"


def test_new_weights_take_a_new_reference_and_modes_are_restored():
    model, _, _faulty = make()
    model[1].eval()  # a submodule the user put in eval mode stays so
    check = CanaryCheck()
    run = CanaryRunner(model, torch.randn(4, 6))
    assert check.check(1, weights=1, run=run) is None
    assert check.check(2, weights=1, run=run) is None
    with torch.no_grad():
        model[0].weight.mul_(2)
    assert check.check(3, weights=2, run=run) is None
    assert check.reference is not None and check.reference[0] == 2
    assert model.training and not model[1].training and model[0].training
    assert all(p.grad is None for p in model.parameters())
