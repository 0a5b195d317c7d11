"""The tests that need TensorFlow in their own process: tests/sdk/test_integrations_tensorflow.py
runs this file in a child pytest and reports each test here as one of its own. TensorFlow
loads libtensorflow_framework.so.2 with RTLD_GLOBAL, and it exports BoringSSL under OpenSSL's
names: every library loaded after it that calls OpenSSL (SoftHSM2, xmlsec's crypto backend)
would call BoringSSL instead and crash, so the suite's own process never imports it."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import tensorflow as tf

from denpex.core.events import Evidence
from denpex.sdk.integrations.tensorflow import (
    DenpexCallback,
    WorkerPlace,
    place_in_cluster,
    tf_config_place,
    worker_place,
)

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
