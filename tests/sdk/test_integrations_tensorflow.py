"""The Keras callback and the tf.distribute helper on CPU: places from TF_CONFIG and from a
strategy, real `model.fit` runs (healthy, a NaN loss, a stalled loop) and, slow, two
MultiWorkerMirroredStrategy workers on loopback exchanging heartbeats through TensorFlow's
coordination service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow", reason="needs TensorFlow: pip install tensorflow-cpu")

from denpex.core.events import Evidence  # noqa: E402
from denpex.sdk.integrations.tensorflow import (  # noqa: E402
    DenpexCallback,
    WorkerPlace,
    place_in_cluster,
    tf_config_place,
    worker_place,
)
from tests.control.pg import free_port  # noqa: E402

CHILD = Path(__file__).parent / "children" / "integ_tf_multiworker.py"
CLUSTER = {"chief": ["c:1"], "worker": ["w0:1", "w1:1", "w2:1"], "evaluator": ["e:1"]}


def test_places_count_the_chief_first_as_tensorflow_does() -> None:
    assert place_in_cluster(CLUSTER, "chief", 0) == WorkerPlace(0, 4, "chief")
    assert place_in_cluster(CLUSTER, "worker", 2) == WorkerPlace(3, 4, "worker")
    assert place_in_cluster({"worker": ["a", "b"]}, "worker", 1) == WorkerPlace(1, 2, "worker")
    assert place_in_cluster(CLUSTER, "evaluator", 0) == WorkerPlace(0, 1, "evaluator")
    with pytest.raises(ValueError, match="does not run the training loop"):
        place_in_cluster({"ps": ["p:1"], "worker": ["w:1"]}, "ps", 0)
    with pytest.raises(ValueError, match="not in the cluster spec"):
        place_in_cluster(CLUSTER, "worker", 3)


def test_tf_config_gives_the_place_or_says_it_is_malformed() -> None:
    config = {"cluster": CLUSTER, "task": {"type": "worker", "index": 1}}
    assert tf_config_place({"TF_CONFIG": json.dumps(config)}) == WorkerPlace(2, 4, "worker")
    assert tf_config_place({}) is None
    assert tf_config_place({"TF_CONFIG": '{"cluster": {}}'}) is None
    with pytest.raises(ValueError, match="TF_CONFIG is not a JSON object"):
        tf_config_place({"TF_CONFIG": "worker:0"})


def test_a_single_worker_strategy_is_rank_zero_of_one(monkeypatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    place = worker_place(tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert (place.rank, place.world_size, place.replicas) == (0, 1, 1)
    config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    assert worker_place(env={"TF_CONFIG": json.dumps(config)}).rank == 1  # default strategy


def fit(callbacks: list, *, poison_batch: int | None = None, epochs: int = 2) -> tf.keras.Model:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = x @ np.arange(4, dtype="float32")
    if poison_batch is not None:
        x[poison_batch * 8] = np.nan  # one sample of that batch: its loss and then the weights
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model


def test_a_healthy_fit_is_timed_step_by_step_and_stays_quiet() -> None:
    got: list = []
    watch = DenpexCallback(emit=got.append, hang_floor_s=60)
    fit([watch])
    assert watch.step == 8 and not watch.active  # 2 epochs × 4 batches, closed at the end
    assert watch.monitor is not None and len(watch.monitor._intervals) == 8
    assert [e for e in got if isinstance(e, Evidence)] == []


def test_a_nan_loss_in_fit_is_reported_once_with_its_step() -> None:
    got: list = []
    fit([DenpexCallback(emit=got.append, hang_floor_s=60)], poison_batch=2)
    found = [e for e in got if isinstance(e, Evidence)]
    assert [e.category for e in found] == ["train.nan_loss"]  # once, though NaN stays
    assert found[0].captures["step"] == "3" and found[0].captures["rank"] == "0"
    assert found[0].event.source == "sdk" and found[0].id.startswith("sdk-keras-")


def test_a_fit_that_stops_stepping_is_a_hang() -> None:
    got: list = []

    class Stall(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                deadline = time.monotonic() + 5
                while not any(isinstance(e, Evidence) for e in got):
                    assert time.monotonic() < deadline, "no hang reported while stalled"
                    time.sleep(0.05)

    fit([DenpexCallback(emit=got.append, hang_floor_s=1.0, watchdog_interval_s=0.1), Stall()])
    hangs = [e for e in got if isinstance(e, Evidence) and e.category == "train.hang"]
    assert hangs and hangs[0].captures["rank"] == "0" and hangs[0].captures["step"] == "3"


@pytest.mark.slow
def test_two_multiworker_workers_see_each_other_through_the_coordination_service() -> None:
    ports = [str(free_port()), str(free_port())]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    workers = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(i), *ports],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = []
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=240)
            assert worker.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for index, result in enumerate(results):
        peer = str(1 - index)
        assert (result["rank"], result["world"]) == (index, 2)
        assert result["step"] == 32 and result["store"] == "StoreLink"  # 256 / 8 batches
        seen, step = result["peers"][peer]
        assert seen and step > 0
        assert result["evidence"] == []


def test_denpex_run_and_the_sdk_never_import_tensorflow() -> None:
    env = dict(os.environ, DENPEX_SERVER_URL="", PYTHONPROFILEIMPORTTIME="1")  # both processes
    run = subprocess.run(
        [sys.executable, "-m", "denpex", "run", "--", sys.executable, "-c", "import denpex.sdk"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if "|" in line}
    assert {"denpex.lite.session", "denpex.sdk.watch"} <= imported  # the run and its job
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "keras")}
