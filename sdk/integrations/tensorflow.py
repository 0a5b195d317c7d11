"""TensorFlow / Keras integration: `model.fit(..., callbacks=[DenpexCallback()])` feeds the
SDK's progress monitor (hangs, stragglers, a job slowing down) and loss rules (NaN, spikes)
once per optimizer step; `worker_place(strategy)` says which worker of a `tf.distribute`
cluster this process is (MultiWorkerMirroredStrategy, or TF_CONFIG).

Workers exchange heartbeats through TensorFlow's coordination service, the key-value store
MultiWorkerMirroredStrategy starts; without one, each worker watches only itself. Keras 3's
`model.fit` does not run under MultiWorkerMirroredStrategy (keras-team/keras#20585): a custom
loop calls `set_model`, `on_train_begin`, `on_train_batch_end(step, {"loss": loss})` and
`on_train_end` itself. It never changes the fit and never raises into it; TensorFlow is
imported when this module is.
"""

from __future__ import annotations

import json
import logging
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

try:
    import keras
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - exercised only without TensorFlow
    raise ImportError(
        "denpex.sdk.integrations.tensorflow needs TensorFlow: pip install tensorflow "
        "(or tensorflow-cpu)"
    ) from exc

from denpex.sdk.progress import ProgressMonitor
from denpex.sdk.step_findings import Emit, StepFindings

log = logging.getLogger("denpex.sdk.tensorflow")
TRAINING_TASKS = ("chief", "worker")  # the tasks that run the training loop in MWMS


@dataclass(frozen=True, slots=True)
class WorkerPlace:
    """This process in its cluster: `rank` counts the chief first, then the workers (TF's own
    numbering of collective members); `world_size` is how many of them train; `task` is the
    TF_CONFIG task type ("" outside a cluster)."""

    rank: int
    world_size: int
    task: str = ""
    replicas: int = 1  # the strategy's replicas in sync (every device of every worker)


def place_in_cluster(cluster: Mapping[str, Sequence[str]], task: str, index: int) -> WorkerPlace:
    """The place of task `task`/`index` in a cluster spec ({"chief": [...], "worker": [...]}),
    numbered as TensorFlow numbers MultiWorkerMirroredStrategy's collective members. An
    evaluator trains alone: rank `index` of its own world of one."""
    chiefs, workers = len(cluster.get("chief", ())), len(cluster.get("worker", ()))
    if task == "evaluator":
        return WorkerPlace(rank=int(index), world_size=1, task=task)
    if task not in TRAINING_TASKS:
        raise ValueError(
            f"task type {task!r} does not run the training loop (MultiWorkerMirroredStrategy "
            "trains on 'chief' and 'worker' tasks): attach the denpex callback there"
        )
    rank = 0 if task == "chief" else int(index) + chiefs
    if not 0 <= rank < chiefs + workers:
        raise ValueError(f"task {task}:{index} is not in the cluster spec {dict(cluster)}")
    return WorkerPlace(rank=rank, world_size=chiefs + workers, task=task)


def tf_config_place(env: Mapping[str, str]) -> WorkerPlace | None:
    """The place TF_CONFIG gives this process, or None without a cluster in it; ValueError
    for a TF_CONFIG that is not the JSON TensorFlow reads."""
    text = env.get("TF_CONFIG", "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"TF_CONFIG is not a JSON object with cluster and task: {exc}") from exc
    if not cluster:
        return None
    return place_in_cluster(cluster, str(task.get("type", "")), int(task.get("index", 0)))


def worker_place(strategy: Any = None, env: Mapping[str, str] | None = None) -> WorkerPlace:
    """This worker's place under `strategy` (default: the strategy in scope): a multi-worker
    strategy's cluster resolver, else TF_CONFIG, else a single worker."""
    strategy = strategy if strategy is not None else tf.distribute.get_strategy()
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    resolver = getattr(strategy, "cluster_resolver", None)
    place = None
    if resolver is not None and resolver.task_type is not None:
        cluster = resolver.cluster_spec().as_dict()
        if cluster:
            place = place_in_cluster(cluster, resolver.task_type, int(resolver.task_id or 0))
    if place is None:
        place = tf_config_place(os.environ if env is None else env)
    place = place or WorkerPlace(rank=0, world_size=1)
    return WorkerPlace(place.rank, place.world_size, place.task, replicas)


class CoordinationStore:
    """The heartbeat Store over TensorFlow's coordination service (set / check / multi_get,
    as the progress monitor asks a torch Store). The service refuses to overwrite a key, so a
    set deletes first; a read of a key seen before waits up to `wait_ms` for it, which covers
    that gap, and a key never seen (a worker not started yet) is not waited for."""

    def __init__(self, wait_ms: int = 200) -> None:
        from tensorflow.python.eager import context

        self._context = context.context()
        self.wait_ms = wait_ms
        self._seen: set[str] = set()

    @staticmethod
    def available() -> bool:
        """Whether this process has a coordination service to talk to."""
        from tensorflow.python.eager import context

        return bool(context.context().coordination_service)

    def set(self, key: str, value: bytes) -> None:
        try:
            self._context.delete_config_key_value(key)
        except tf.errors.OpError:
            pass  # the first heartbeat: nothing to delete
        self._context.set_config_key_value(key, value.decode())

    def _get(self, key: str) -> bytes | None:
        wait_ms = self.wait_ms if key in self._seen else 1
        try:
            value = self._context.get_config_key_value(key, wait_ms).encode()
        except tf.errors.OpError:  # not there (yet): DeadlineExceeded after wait_ms
            return None
        self._seen.add(key)
        return value

    def check(self, keys: list[str]) -> bool:
        return all(self._get(key) is not None for key in keys)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = [self._get(key) for key in keys]
        missing = [k for k, v in zip(keys, values, strict=True) if v is None]
        if missing:
            raise KeyError(f"no heartbeat under {missing}")
        return [v for v in values if v is not None]


def _optimizer_step(model: Any) -> int | None:
    """The optimizer's own step count (gradient accumulation and steps_per_execution
    included), or None before it has one."""
    iterations = getattr(getattr(model, "optimizer", None), "iterations", None)
    try:
        return int(iterations.numpy()) if iterations is not None else None
    except Exception:  # a variable not built yet
        return None


class DenpexCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """A progress monitor and the loss rules for the whole fit: built when training begins
    (rank and world from `worker_place(strategy)`), fed after each batch that stepped the
    optimizer, closed when training ends. Options: the progress and loss thresholds
    (`hang_floor_s`, `straggler_ratio`, `spike_threshold`, …), `store` (a Store of your own),
    `emit` (where evidence goes; default: the `denpex run` socket)."""

    def __init__(self, *, strategy: Any = None, emit: Emit | None = None, **options: Any) -> None:
        super().__init__()
        self.strategy, self.emit, self.options = strategy, emit, options
        self.place: WorkerPlace | None = None
        self.monitor: ProgressMonitor | None = None
        self.findings: StepFindings | None = None
        self.step = 0
        self.active = False  # between on_train_begin and on_train_end

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self.active:
            return
        self.active = True
        try:
            self.place = worker_place(self.strategy)
            options = dict(self.options)
            wants_store = "store" not in options and self.place.world_size > 1
            if wants_store and CoordinationStore.available():
                options["store"] = CoordinationStore()
            self.findings = StepFindings(
                rank=self.place.rank, source="keras", emit=self.emit, options=options
            )
            self.monitor = ProgressMonitor(
                rank=self.place.rank,
                world_size=self.place.world_size,
                emit=self.emit,
                host=self.findings.host,
                options=options,
            )
        except Exception as exc:  # the fit goes on unwatched, and says why
            log.warning("denpex: TensorFlow training is not watched: %s", exc)
            self.monitor = None
        self.step = _optimizer_step(self.model) or 0

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if not self.active or self.monitor is None or self.findings is None:
            return
        try:
            step = _optimizer_step(self.model)
            if step is None:
                step = self.step + 1
            elif step == self.step:
                return  # no optimizer step in this batch
            self.step = step
            loss = (logs or {}).get("loss")
            value = float(loss) if isinstance(loss, numbers.Real) else None
            if value is not None:
                self.findings.loss(step, value)
            self.monitor.on_step(step, value)
        except Exception as exc:  # the fit never sees a denpex failure
            log.debug("denpex keras: batch %d not recorded: %s", batch, exc)

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        """Keras calls no callback when fit raises: the process usually ends then; one that
        catches the error and lives on should call `close()`, or its stop reads as a hang."""
        self.close()

    def close(self) -> None:
        self.active = False
        if self.monitor is not None:
            self.monitor.close()
