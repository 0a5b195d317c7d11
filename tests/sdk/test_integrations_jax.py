"""dx.jax.watch_step on CPU: timing and hang through the progress monitor, loss finiteness,
the parameter checksum, and replicas on two CPU devices that disagree (a child process, since
the device count is fixed when JAX starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason='dx.jax needs JAX: pip install "jax[cpu]"')
import jax.numpy as jnp  # noqa: E402

import denpex.sdk as dx  # noqa: E402
from denpex._native import load  # noqa: E402
from denpex.core.events import Evidence  # noqa: E402

CHILD = Path(__file__).parent / "children" / "integ_jax_replicas.py"


def make_step(poison_at: int | None = None):
    calls = {"n": 0}

    @jax.jit
    def update(w, x, y, poison):
        def loss_fn(w):
            return jnp.mean((x @ w - y) ** 2) * poison

        loss, grad = jax.value_and_grad(loss_fn)(w)
        return w - 0.1 * grad, loss

    def step(w, x, y):
        calls["n"] += 1
        poison = jnp.float32(np.nan) if calls["n"] == poison_at else jnp.float32(1.0)
        return update(w, x, y, poison)

    return step


def data():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(16, 4)), dtype=jnp.float32)
    return jnp.zeros((4,), jnp.float32), x, x @ jnp.arange(4.0, dtype=jnp.float32)


def test_healthy_steps_are_timed_and_checksummed() -> None:
    got: list = []
    w, x, y = data()
    step = dx.jax.watch_step(
        make_step(), every=1, checksum_every=5, emit=got.append, hang_floor_s=60
    )
    with step:
        for _ in range(10):
            w, _loss = step(w, x, y)
    assert step.step == 10 and [e for e in got if isinstance(e, Evidence)] == []
    assert len(step.monitor._intervals) == 10
    digest = load("checksum").xxh3_64(
        np.array([load("checksum").xxh3_64(np.asarray(w).view(np.uint8))], np.uint64).tobytes()
    )
    assert step.last_digest == digest


def test_nonfinite_loss_is_reported_once_with_its_step() -> None:
    got: list = []
    w, x, y = data()

    @dx.jax.watch_step(every=1, emit=got.append, hang_floor_s=60)
    def step(w, x, y):
        return inner(w, x, y)

    inner = make_step(poison_at=4)
    for _ in range(6):
        w, _loss = step(w, x, y)
    step.close()
    found = [e for e in got if isinstance(e, Evidence)]
    assert [e.category for e in found] == ["train.nan_loss"]  # once, though NaN stays
    assert found[0].captures["step"] == "4" and found[0].event.source == "sdk"


def test_stalled_jax_loop_is_a_hang() -> None:
    got: list = []
    w, x, y = data()
    step = dx.jax.watch_step(
        make_step(), emit=got.append, hang_floor_s=1.0, watchdog_interval_s=0.1
    )
    for _ in range(3):
        w, _ = step(w, x, y)
    started = time.monotonic()
    while not got and time.monotonic() - started < 5:
        time.sleep(0.05)
    step.close()
    hangs = [e for e in got if isinstance(e, Evidence) and e.category == "train.hang"]
    assert hangs and hangs[0].captures["rank"] == "0" and hangs[0].captures["step"] == "3"


def test_disagreeing_replicas_on_two_devices_name_the_device(tmp_path: Path) -> None:
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        [sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert lines["healthy_evidence"] == "0"
    assert lines["signature"] == "train.sdc.replica_mismatch"
    assert lines["devices"].endswith("1") and lines["step"] == "2"
