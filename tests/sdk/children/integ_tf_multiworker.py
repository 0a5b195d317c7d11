"""One worker of a two-worker MultiWorkerMirroredStrategy training loop on loopback, watched
by the denpex Keras callback; prints its place and what it saw of its peer as one JSON line.

Keras 3's model.fit does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585),
so this is the custom loop TensorFlow's multi-worker tutorial writes, calling the callback's
hooks itself.

Usage: integ_tf_multiworker.py INDEX PORT0 PORT1
"""

from __future__ import annotations

import json
import os
import sys
import time

index, ports = int(sys.argv[1]), sys.argv[2:]
os.environ["TF_CONFIG"] = json.dumps(
    {
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    }
)
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from denpex.sdk.integrations.tensorflow import DenpexCallback  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01)

rng = np.random.default_rng(index)
x = rng.normal(size=(256, 4)).astype("float32")
y = x @ np.arange(4, dtype="float32")
data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))


@tf.function
def train_step(batch):
    def replica_step(inputs):
        features, target = inputs
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(features)[:, 0] - target) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    losses = strategy.run(replica_step, args=(batch,))
    return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)


got: list = []
watch = DenpexCallback(strategy=strategy, emit=got.append, watchdog_interval_s=0.1, hang_floor_s=60)
watch.set_model(model)
watch.on_train_begin()
for step, batch in enumerate(data):
    loss = float(train_step(batch))
    watch.on_train_batch_end(step, {"loss": loss})
    time.sleep(0.05)  # long enough for heartbeats to go round a few times
views = dict(watch.monitor._views) if watch.monitor is not None else {}
watch.on_train_end()
print(
    json.dumps(
        {
            "rank": watch.place.rank,
            "world": watch.place.world_size,
            "step": watch.step,
            "store": type(watch.monitor._store).__name__ if watch.monitor else None,
            "peers": {str(r): [v.seen, v.step] for r, v in views.items() if r != watch.place.rank},
            "evidence": [getattr(e, "category", "") for e in got if hasattr(e, "category")],
        }
    ),
    flush=True,
)
