"""Per-layer health: the first module with a non-finite output, per-layer norms, and gradient
norms taken where the gradients exist whatever the order of zero_grad() and guard.step().
(The loss rules are denpex.series', tested in tests/series.)"""

from __future__ import annotations

import pytest

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


def train_steps(model, optimizer, guard, steps, *, zero_grad_first: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=gen)
        loss = model(x).square().mean()
        if zero_grad_first:  # the common order: zero_grad, backward, step, guard.step
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:  # the order the README once showed: zero_grad right before guard.step
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        guard.step(loss=loss)


def grad_norms(got) -> list[float]:
    return [m.attrs["value"] for m in got if getattr(m, "body", "") == "sdk_grad_l2_norm"]


@pytest.mark.parametrize("zero_grad_first", [True, False])
def test_grad_norms_survive_either_zero_grad_order(zero_grad_first):
    import denpex.sdk as dx

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got: list = []
    guard = dx.watch(model, optimizer, every=5, emit=got.append, progress=False)
    train_steps(model, optimizer, guard, 20, zero_grad_first=zero_grad_first)
    guard.close()
    norms = grad_norms(got)
    assert len(norms) == 4 and all(n > 0 for n in norms), norms


def test_grad_norms_equal_the_gradients_the_optimizer_saw():
    import denpex.sdk as dx

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[float] = []
    optimizer.register_step_pre_hook(
        lambda opt, a, k: seen.append(
            float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())
        )
    )
    got: list = []
    guard = dx.watch(model, optimizer, every=3, emit=got.append, progress=False)
    train_steps(model, optimizer, guard, 6, zero_grad_first=False)
    guard.close()
    assert grad_norms(got) == pytest.approx([seen[2], seen[5]], rel=1e-5)


def test_without_an_optimizer_backward_hooks_take_the_norms_on_sampled_steps_only():
    import denpex.sdk as dx

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    got: list = []
    guard = dx.watch(model, every=2, emit=got.append, progress=False)
    hooked = []
    for _ in range(6):
        hooked.append(bool(guard.norms._grad_hooks))
        model(torch.randn(3, 4)).sum().backward()
        for p in model.parameters():
            p.grad = None  # a loop that clears gradients before guard.step()
        guard.step(loss=1.0)
    guard.close()
    assert hooked == [False, True, False, True, False, True]  # armed for steps 2, 4, 6
    assert len(grad_norms(got)) == 3 and all(n > 0 for n in grad_norms(got))
    assert not guard.norms._grad_hooks  # close removes them
