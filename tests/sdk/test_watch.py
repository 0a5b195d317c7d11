"""dx.watch() end to end on CPU: NaN naming the module where it started, spikes, loss-scale
collapse, bounded metrics, and a Guard that never raises into the training loop."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_import_without_torch_and_lazy_names():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import denpex.sdk as dx\n"
        "assert callable(dx.watch) and dx.Guard\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    dx.no_such_name\nexcept AttributeError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


torch = pytest.importorskip("torch", reason="watch() tests train a torch model")

import denpex.sdk as dx  # noqa: E402
from denpex.core.events import Evidence  # noqa: E402
from denpex.core.wire import evidence_from_dict, evidence_to_dict  # noqa: E402
from tests.sdk.models import Poison  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 16)
        self.middle = torch.nn.Sequential(torch.nn.Linear(16, 16), Poison(), torch.nn.GELU())
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.middle(self.embed(x)))


def train(guard, model, optimizer, steps, *, poison_at=None, spike_at=None, scales=None):
    gen = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        model.middle[1].on = poison_at is not None and step >= poison_at
        x = torch.randn(8, 6, generator=gen)
        optimizer.zero_grad()
        loss = ((model(x) - 1.0) ** 2).mean()
        loss.backward()
        optimizer.step()
        reported = loss * 1000 if step == spike_at else loss
        guard.step(reported, loss_scale=scales(step) if scales else None)


def evidence(items, category):
    return [e for e in items if isinstance(e, Evidence) and e.category == category]


@pytest.mark.parametrize(
    ("poison_at", "nan_scan"),
    [(13, "always"), (20, "auto")],  # an unsampled step with every forward scanned; a sampled one
)
def test_nan_in_a_middle_activation_names_that_layer(poison_at, nan_scan):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False, nan_scan=nan_scan)
    train(guard, model, optimizer, 30, poison_at=poison_at)
    guard.close()
    (nan,) = evidence(got, "train.nan_loss")  # one per episode, not one per NaN step
    assert nan.captures["module"] == "middle.1"
    assert nan.captures["step"] == str(poison_at)
    assert nan.event.source == "sdk" and nan.event.kind == "state" and nan.event.rank == 0
    assert nan.signature == "train.nan_loss.first_module" and nan.severity == "error"
    assert evidence_from_dict(evidence_to_dict(nan)) == nan  # the wire accepts it


def test_a_nan_between_samples_on_cpu_is_reported_without_guessing_the_module():
    # on CPU the default scans activations on sampled steps only: the NaN at step 13 is
    # reported at once, and no later step names a module that merely inherited it
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False)
    train(guard, model, optimizer, 30, poison_at=13)
    guard.close()
    (nan,) = evidence(got, "train.nan_loss")
    assert nan.signature == "train.nan_loss.value" and nan.captures["step"] == "13"
    assert "module" not in nan.captures


def test_cpu_defaults_hook_modules_only_for_the_forward_of_a_sampled_step():
    # a module with any forward hook leaves PyTorch's fast call path: between samples the
    # model must carry none of ours
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hooked_at = []
    model.register_forward_pre_hook(
        lambda module, args: hooked_at.append(len(model.middle[0]._forward_hooks))
    )
    guard = dx.watch(model, optimizer, every=5, emit=lambda item: None, progress=False)
    train(guard, model, optimizer, 12)
    assert hooked_at == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]  # forwards of steps 5 and 10
    guard.close()
    assert not any(module._forward_hooks for module in model.modules())
    assert len(model._forward_pre_hooks) == 1  # the caller's own hook is left alone


def test_loss_spike_and_loss_scale_collapse():
    # past warm-up (loss_warmup_steps, scale_warmup_steps: 100 steps by default)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False)

    def scales(step):
        return 2.0 ** (16 - max(0, step - 150) // 3)  # halving every 3 steps after step 150

    train(guard, model, optimizer, 180, spike_at=140, scales=scales)
    guard.close()
    (spike,) = evidence(got, "train.loss_spike")
    assert spike.captures["step"] == "140" and spike.severity == "warning"
    (overflow,) = evidence(got, "train.grad_overflow")
    assert overflow.signature == "train.grad_overflow.loss_scale_collapse"
    assert overflow.captures["step"] == "168"  # the sixth halving after warm-up
    assert evidence(got, "train.nan_loss") == evidence(got, "train.sdc") == []


def test_a_recovering_warm_up_spike_and_calibration_overflows_are_not_failures():
    # fp16 scalers start high and halve down (DeepSpeed, Megatron: 2**32) and a warm-up loss
    # can jump once: neither is reported
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False)

    def scales(step):
        return 2.0 ** max(16, 32 - step)  # 16 halvings in the first 16 steps, then steady

    train(guard, model, optimizer, 120, spike_at=30, scales=scales)
    guard.close()
    assert [e for e in got if isinstance(e, Evidence)] == []


def test_a_diverging_loss_is_a_failure():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False)
    for step in range(1, 61):
        guard.step(loss=2.0 + 0.01 * (step % 5) if step < 40 else 50.0 * step)
    guard.close()
    (diverged,) = [e for e in evidence(got, "train.loss_spike") if e.severity == "error"]
    assert diverged.signature == "train.loss_spike.divergence"
    assert diverged.captures["step"] == "40" and diverged.captures["last_step"] == "44"


def test_metrics_only_on_sampled_steps_and_bounded():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False, metrics_top_k=2)
    train(guard, model, optimizer, 30)
    guard.close()
    metrics = [e for e in got if not isinstance(e, Evidence)]
    assert metrics and all(m.kind == "metric" and m.source == "sdk" for m in metrics)
    names = {m.body for m in metrics}
    assert {
        "sdk_loss",
        "sdk_grad_l2_norm",
        "sdk_weight_l2_norm",
        "sdk_update_weight_ratio",
    } <= names
    per_sample = [m for m in metrics if m.attrs.get("layer")]
    assert len(per_sample) <= 3 * 3 * 2  # 3 samples × 3 per-layer series × top 2 layers
    assert all(m.attrs["value"] >= 0 for m in metrics)


def test_guard_never_raises_and_close_removes_hooks():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def broken_emit(item):
        raise OSError("transport down")

    with dx.watch(model, optimizer, every=1, emit=broken_emit, progress=False) as guard:
        train(guard, model, optimizer, 5, poison_at=3)
        guard.step(loss="not a number")  # a bad argument is reported, not raised
    assert guard.errors.get("emit", 0) >= 1
    assert not model._forward_hooks and not model.middle[0]._forward_hooks
    assert not optimizer._optimizer_step_pre_hooks
    guard.step(1.0)  # after close: a no-op


def test_progress_monitor_is_driven_when_present():
    pytest.importorskip("denpex.sdk.progress", reason="sdk/progress.py not present")
    model = Net()
    guard = dx.watch(model, every=5, emit=lambda item: None)
    assert guard.monitor is not None
    guard.step(1.0)
    guard.close()


def test_a_misspelt_option_is_refused_with_the_known_ones():
    model = torch.nn.Linear(2, 1)
    with pytest.raises(TypeError, match=r"unknown option\(s\) evry.*known: .*checksum_optimizer"):
        dx.watch(model, evry=10)
    with pytest.raises(ValueError, match="nan_scan='sometimes'"):
        dx.watch(model, nan_scan="sometimes")
    dx.watch(model, progress=False, hang_floor_s=5.0, spike_window=50).close()  # known ones pass


# --- coverage: a check that cannot run says so, once ---------------------------------------


def coverage(items):
    return [e for e in items if not isinstance(e, Evidence) and e.body == "sdk_coverage_lost"]


def test_failing_checksums_are_reported_as_lost_coverage_once(monkeypatch, capsys):
    from denpex.sdk.checksums import TensorSet

    def no_numpy(self):
        raise RuntimeError("Numpy is not available")  # what a torch without numpy said

    monkeypatch.setattr(TensorSet, "digest_now", no_numpy)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got = []
    guard = dx.watch(model, optimizer, every=5, emit=got.append, progress=False)
    train(guard, model, optimizer, 40)
    guard.close()
    (lost,) = coverage(got)
    assert lost.kind == "state" and lost.source == "sdk" and lost.rank == 0
    assert lost.attrs["check"] == "checksums" and lost.attrs["since_step"] == 5
    assert "Numpy is not available" in lost.attrs["reason"]
    assert "checksums" in guard.disabled
    assert capsys.readouterr().err.count("denpex.sdk: checksums failed") == 1


def test_a_world_without_a_process_group_loses_replica_coverage(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    got = []
    guard = dx.watch(Net(), emit=got.append, progress=False)
    guard.close()
    (lost,) = coverage(got)
    assert lost.attrs["check"] == "replicas" and lost.attrs["since_step"] == 0
    assert lost.rank == 2 and "init_process_group" in lost.attrs["reason"]


def test_the_pure_python_checksum_is_not_used_on_a_model_it_would_slow_down(monkeypatch):
    import denpex._native as native

    monkeypatch.setattr(native, "backend", lambda name: "reference")
    got = []
    model = torch.nn.Linear(256, 64)  # 66 KB of parameters
    guard = dx.watch(model, emit=got.append, progress=False, reference_checksum_max_bytes=1024)
    guard.close()
    (lost,) = coverage(got)
    assert lost.attrs["check"] == "checksums" and "pure-Python XXH3" in lost.attrs["reason"]
    assert {"checksums", "integrity"} <= guard.disabled
    small = dx.watch(model, emit=got.append, progress=False)  # under the default limit
    assert "checksums" not in small.disabled
    small.close()


def test_coverage_notes_reach_the_report_and_no_plain_ok_is_printed():
    from denpex.catalog import load_catalog
    from denpex.core.sdk_wire import coverage_event, stderr_line
    from denpex.lite.report_text import render_text
    from denpex.lite.session import LiteSession, ReportOptions

    session = LiteSession(load_catalog(), ReportOptions(text=False))
    line = stderr_line(coverage_event("checksums", 5, "RuntimeError: Numpy is not available"))
    session.scanner.feed("stderr", b"[rank1]:" + line + b"[rank1]:" + line)
    diag = session.conclude(0, None).to_dict()
    assert diag["status"] == "ok"
    note = "checksums off since step 5 on rank 1: RuntimeError: Numpy is not available"
    assert diag["notes"] == [note]  # the SDK's event as the scanner reads it, once
    assert [c["check"] for c in diag["coverage_lost"]] == ["checksums"]
    text = render_text(diag, color=False, width=100)
    assert "OK" not in text and note in text


def test_without_a_wrapper_a_healthy_run_prints_no_sdk_lines(tmp_path):
    code = (
        "import torch, denpex.sdk as dx\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(8, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "guard = dx.watch(model, opt, every=5)\n"
        "for step in range(100):\n"
        "    loss = model(torch.randn(4, 8)).square().mean()\n"
        "    opt.zero_grad(); loss.backward(); opt.step(); guard.step(loss=loss)\n"
        "guard.step(loss=float('nan'))\n"
        "guard.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DENPEX_SDK_SOCKET", "RANK")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, env=env, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if b"denpex-sdk: " in line]
    assert len(lines) == 1 and b'"train.nan_loss"' in lines[0]  # the one finding, no metrics
