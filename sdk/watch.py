"""`dx.watch(model, optimizer)` and the Guard it returns: the per-step entry point of the SDK,
which schedules health sampling, checksums, replica agreement and canaries and emits evidence.

`Guard.step()` never raises into the training loop: a failing feature is reported once on
stderr and switched off (and the switch-off is sent as an `sdk_coverage_lost` event, so no
report says OK about a check that did not run), and every rank still enters every collective
at the same step.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import denpex._native as native
from denpex.core.events import Event, metric
from denpex.core.sdk_wire import coverage_event
from denpex.sdk.canary import CanaryCheck, CanaryRunner, WeightIntegrity
from denpex.sdk.checksums import CudaSnapshot, TensorSet, combine, optimizer_state_tensors
from denpex.sdk.health import Finding, ForwardRecorder, LayerNorms, nonfinite_activation
from denpex.sdk.transport import default_emit as transport_emit
from denpex.series.loss import LossSpikeDetector, NonFiniteLoss, nan_finding
from denpex.series.loss_scale import LossScaleTracker
from denpex.series.thresholds import LossRules, LossScaleRules, option_names, with_options

Emit = Callable[[Any], None]
MAX_FEATURE_ERRORS = 3
DEFAULT_OPTIONS: dict[str, Any] = {
    # "always": hooks reduce every module's output on every forward; "sampled": hooks exist
    # only for the forward of a sampled step; "auto": always on CUDA (the reductions are queued
    # asynchronously, nearly free), sampled on CPU (each reduction is synchronous work: about
    # 15 % of a small model's step, and a hooked module alone costs ~1 %)
    "nan_scan": "auto",
    "metrics_top_k": 8,
    "checksum_optimizer": False,
    "replicas": True,  # True: compare with the group's replicas; False: off; "always"
    "replica_slots": 1024,  # digests per replica gather; more tensors are hashed in buckets
    "weight_integrity": True,
    "update_ratio_max_bytes": 1 << 30,  # no update/weight ratio (it needs a weights copy) above
    "progress": True,  # drive sdk/progress.py's ProgressMonitor (hangs, stragglers)
    # the CUPTI tracer (sdk/cupti.py): None follows DENPEX_CUPTI; never loaded unless asked
    "cupti": None,
    "cupti_in_flight_s": 10.0,  # an NCCL kernel running this long: the rank waits on its GPU
    # without the compiled checksum module, the pure-Python XXH3 hashes tens of MB/s: above
    # this many bytes of parameters checksums would cost more than the step, so they are off
    "reference_checksum_max_bytes": 4 << 20,
}


NAN_SCAN_MODES = ("auto", "always", "sampled", "off")
# the series detectors' thresholds (denpex/series/thresholds.yaml) are options under their
# own names, and the progress monitor reads its own and where to beat
KNOWN_OPTIONS = (
    set(DEFAULT_OPTIONS)
    | option_names(sdk=True)
    | {"store", "heartbeat_prefix", "prestop", "prestop_path"}
)


class Monitor(Protocol):
    """A per-step observer the Guard drives (sdk/progress.py's ProgressMonitor follows it)."""

    def on_step(self, step: int, loss: float | None, loss_scale: float | None) -> None: ...

    def close(self) -> None: ...


def _identity(rank: int | None, group: Any) -> tuple[int, int, bool]:
    """(rank, world size, whether torch.distributed is initialized)."""
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    if initialized:
        world = dist.get_world_size()
        return (dist.get_rank() if rank is None else rank), world, True
    env_rank = os.environ.get("RANK")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (rank if rank is not None else int(env_rank or 0)), world, False


class Guard:
    """Everything `watch()` attached to one model; call `step()` once per training step.

    `every`: steps between health samples; `checksum_every` (default `every`): between
    parameter checksums and replica comparisons; `canary_batch`, `canary_every` (default
    4 × `every`): the canary micro-batch; `group`: the process group of the replicas of this
    rank's data (the DP group; default WORLD when distributed); `emit`: where evidence goes
    (default the transport to the local denpex); other keywords override DEFAULT_OPTIONS."""

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        every: int = 50,
        checksum_every: int | None = None,
        canary_batch: Any = None,
        canary_every: int | None = None,
        group: Any = None,
        rank: int | None = None,
        emit: Emit | None = None,
        **options: Any,
    ) -> None:
        if every < 1:
            raise ValueError(f"watch(every={every}): the sampling interval must be >= 1 step")
        unknown = sorted(set(options) - KNOWN_OPTIONS)
        if unknown:
            raise TypeError(
                f"watch() got unknown option(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(KNOWN_OPTIONS))}"
            )
        if options.get("nan_scan", "auto") not in NAN_SCAN_MODES:
            raise ValueError(
                f"watch(nan_scan={options['nan_scan']!r}): one of {', '.join(NAN_SCAN_MODES)}"
            )
        self.model, self.optimizer = model, optimizer
        self.every = every
        self.checksum_every = checksum_every or every
        self.canary_every = canary_every or 4 * every
        self.options = {**DEFAULT_OPTIONS, **options}
        self.emit_fn = emit or transport_emit
        self.rank, self.world_size, distributed = _identity(rank, group)
        self.group = group
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.job = os.environ.get("DENPEX_JOB") or os.environ.get("SLURM_JOB_ID")
        first = next(iter(model.parameters()), None)
        self.device = str(first.device.index) if first is not None and first.is_cuda else None
        self.step_index = 0
        self.optimizer_steps = 0
        self.errors: dict[str, int] = {}
        self.disabled: set[str] = set()
        self._failed_since: dict[str, int] = {}  # feature -> step of its first failure
        self._coverage_lost: set[str] = set()
        self._emitted = 0
        self._closed = False
        self._handles: list[Any] = []
        # (step, loss tensor, forward records, whether the loss scaler skipped that step)
        self._pending_losses: list[tuple[int, Any, list[tuple[int, Any]], bool]] = []
        self._nan_module: str | None = None  # first non-finite module of the NaN episode
        self._pending_snapshot: tuple[int, int, CudaSnapshot] | None = None

        named_params = [(n, p) for n, p in model.named_parameters()]
        self.params = TensorSet.of(named_params)
        self.buffers = TensorSet.of(model.named_buffers())
        self.norms = LayerNorms(named_params)
        param_bytes = sum(p.numel() * p.element_size() for _, p in named_params)
        self.update_ratio = param_bytes <= self.options["update_ratio_max_bytes"]
        scan = self.options["nan_scan"]
        if scan == "auto":
            on_gpu = any(p.is_cuda for _, p in named_params)
            scan = self.options["nan_scan"] = "always" if on_gpu else "sampled"
        self.recorder = None
        if scan != "off":
            self.recorder = ForwardRecorder(model, armed=scan == "always" or 1 % every == 0)
        loss_rules = with_options(LossRules, self.options)
        self.spikes = LossSpikeDetector(loss_rules)
        self.nan = NonFiniteLoss(loss_rules)
        self.scale = LossScaleTracker(with_options(LossScaleRules, self.options))
        self.hash_optimizer = bool(self.options["checksum_optimizer"]) and optimizer is not None
        self.replicas = None
        if distributed and self.options["replicas"]:
            from denpex.sdk.replicas import ReplicaChecker

            names = self.params.names + (["<optimizer state>"] if self.hash_optimizer else [])
            shapes = [tuple(p.shape) for _, p in named_params] + (
                [()] if self.hash_optimizer else []
            )
            checker = ReplicaChecker(group, names, shapes, self.options["replica_slots"])
            # "always" gathers even in a group of one (benchmarks measure the collective)
            alone_ok = self.options["replicas"] == "always"
            self.replicas = checker if checker.size > 1 or alone_ok else None
        self.canary = CanaryRunner(model, canary_batch) if canary_batch is not None else None
        self.canary_check = CanaryCheck()
        self.integrity = WeightIntegrity()
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
            self._handles.append(optimizer.register_step_post_hook(self._after_optimizer_step))
        else:  # no optimizer to hook: gradient norms as backward writes them, on sampled steps
            self.norms.arm_backward(1 % every == 0)
        self._check_coverage_at_start(param_bytes, distributed)
        self.cupti = self._cupti_tracer()
        self.monitor = self._progress_monitor()
        self.prestop = self._prestop(options.get("prestop"), options.get("prestop_path"))

    # --- the per-step entry point --------------------------------------------------------

    def step(self, loss: Any = None, *, loss_scale: float | None = None) -> None:
        """Once per training step, after optimizer.step(). Never raises."""
        if self._closed:
            return
        self.step_index += 1
        step = self.step_index
        sampled = step % self.every == 0
        self.scale.overflowed = False
        if loss_scale is not None:  # first: a NaN on a step the scaler skipped is judged so
            self._run("health", self._observe_scale, step, loss_scale)
        loss_value = self._run("health", self._observe_loss, step, loss, sampled)
        if sampled:
            self._run("health", self._sample_norms, step)
        elif self.norms._snapshot is not None:
            self._run("health", self._emit_update_ratio, step)
        if self.optimizer is None:
            self.norms.arm_backward((step + 1) % self.every == 0)
        self._checksum_schedule(step)
        if self.canary is not None and step % self.canary_every == 0:
            self._run("canary", self._check_canary, step)
        if self.recorder is not None and self.options["nan_scan"] == "sampled":
            self.recorder.armed = (step + 1) % self.every == 0
        if self.cupti is not None:
            self._run("cupti", self.cupti.mark_step, step)
        if self.monitor is not None:
            scale = float(loss_scale) if loss_scale is not None else None
            self._run("progress", self.monitor.on_step, step, loss_value, scale)
        if self.prestop is not None and self.prestop.pending:
            self.prestop.serve(step)

    def close(self) -> None:
        """Read what is pending, remove hooks, close the progress monitor. Idempotent."""
        if self._closed:
            return
        self._run("health", self._flush_losses)
        episode = self.nan.finish()  # a NaN held back in warm-up that never recovered
        if episode is not None:
            self._report(episode.last_step, nan_finding(episode, self._nan_module))
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.norms.arm_backward(False)
        if self.recorder is not None:
            self.recorder.remove()
        if self.monitor is not None:
            self._run("progress", self.monitor.close)
        if self.cupti is not None:
            self._run("cupti", self.cupti.close)
        if self.prestop is not None:
            self.prestop.remove()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- health --------------------------------------------------------------------------

    def _observe_loss(self, step: int, loss: Any, sampled: bool) -> float | None:
        records = self.recorder.take() if self.recorder is not None else []
        if loss is None:
            if sampled and records:
                self._check_activations(step, records)
            return None
        skipped = self.scale.overflowed  # reset by step() when no scale came with this step
        if hasattr(loss, "detach"):
            if loss.is_cuda:
                # reading a CUDA loss waits for the device: batch the reads, one per interval
                self._pending_losses.append((step, loss.detach(), records, skipped))
                if sampled or len(self._pending_losses) >= self.every:
                    self._flush_losses()
                return None
            value = float(loss.detach())
        else:
            value = float(loss)
        self._judge_loss(step, value, records, sampled, skipped)
        return value

    def _flush_losses(self) -> None:
        pending, self._pending_losses = self._pending_losses, []
        if not pending:
            return
        import torch

        values = torch.stack([t.float().reshape(()) for _, t, _, _ in pending]).cpu().tolist()
        for (step, _, records, skipped), value in zip(pending, values, strict=True):
            self._judge_loss(step, value, records, step % self.every == 0, skipped)

    def _judge_loss(
        self, step: int, value: float, records: list, sampled: bool, skipped: bool = False
    ) -> None:
        episode = self.nan.observe(step, value, skipped=skipped)
        if self.nan.started:  # the first NaN of an episode: which module made it
            self._nan_module = self.recorder.first_nonfinite(records) if self.recorder else None
        if episode is not None:
            self._report(step, nan_finding(episode, self._nan_module))
        if not math.isfinite(value):
            return
        spike = self.spikes.observe(step, value)
        if spike is not None:
            self._report(step, spike)
        if sampled:
            self._check_activations(step, records)
            self._metric(step, "sdk_loss", value)

    def _check_activations(self, step: int, records: list) -> None:
        if self.recorder is None:
            return
        module = self.recorder.first_nonfinite(records)
        if module is not None:
            self._report(step, nonfinite_activation(step, module))

    def _observe_scale(self, step: int, scale: float) -> None:
        finding = self.scale.observe(step, float(scale))
        if finding is not None:
            self._report(step, finding)

    def _sample_norms(self, step: int) -> None:
        found = self.norms.measure(keep_snapshot=self.update_ratio)
        self._metric(step, "sdk_weight_l2_norm", found["total_weight"])
        self._metric(step, "sdk_grad_l2_norm", found["total_grad"])
        top = found["grad"].argsort(descending=True)[: self.options["metrics_top_k"]].tolist()
        weights, grads = found["weight"].tolist(), found["grad"].tolist()
        for index in top:
            layer = self.norms.layers[index]
            self._metric(step, "sdk_layer_grad_l2_norm", grads[index], layer=layer)
            self._metric(step, "sdk_layer_weight_l2_norm", weights[index], layer=layer)

    def _emit_update_ratio(self, step: int) -> None:
        measured = self.norms.update_ratio()
        if measured is None:
            return
        ratio, total = measured
        self._metric(step, "sdk_update_weight_ratio", total)
        for index in ratio.argsort(descending=True)[: self.options["metrics_top_k"]].tolist():
            layer = self.norms.layers[index]
            self._metric(step, "sdk_layer_update_weight_ratio", float(ratio[index]), layer=layer)

    # --- checksums, replicas, weight integrity -------------------------------------------

    def _checksum_schedule(self, step: int) -> None:
        """CPU: hash and compare now. CUDA: start a snapshot now, compare at the next step
        (hashed on a worker thread meanwhile). The same schedule on every rank."""
        if self._pending_snapshot is not None:
            taken_at, optimizer_steps, snapshot = self._pending_snapshot
            self._pending_snapshot = None
            digests = self._run("checksums", snapshot.wait_digests)
            self._compare(taken_at, digests, optimizer_steps)
        if step % self.checksum_every != 0:
            return
        if self.params.on_cuda and not self.hash_optimizer and "checksums" not in self.disabled:
            snapshot = self._run("checksums", CudaSnapshot, self.params.tensors)
            if snapshot is not None:
                snapshot.start_hashing()
                self._pending_snapshot = (step, self.optimizer_steps, snapshot)
                return
        digests = None if "checksums" in self.disabled else self._run("checksums", self._digest)
        self._compare(step, digests, self.optimizer_steps)

    def _digest(self) -> list[int]:
        """Parameter digests, plus one digest of the whole optimizer state when asked."""
        digests = self.params.digest_now()
        if self.hash_optimizer:
            state = TensorSet.of(optimizer_state_tensors(self.optimizer)).digest_now()
            digests.append(combine(state))
        return digests

    def _compare(self, step: int, digests: list[int] | None, optimizer_steps: int) -> None:
        """Replica agreement and weight integrity for digests taken at `step`, when the
        optimizer had run `optimizer_steps` steps."""
        if self.replicas is not None and "replicas" not in self.disabled:
            # entered even when hashing failed (digests None), so no peer waits for us
            findings = self._run("replicas", self.replicas.check, step, digests) or []
            for finding in findings:
                self._report(step, finding)
        if digests is not None and self.optimizer is not None and self.options["weight_integrity"]:
            weights = combine(digests[: len(self.params)])
            found = self.integrity.verify(step, weights, optimizer_steps, "at the next check")
            if found is not None:
                self._report(step, found)
            self.integrity.record(weights, optimizer_steps)

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._closed:
            return
        if (self.step_index + 1) % self.every == 0:  # the step guard.step() will sample
            self._run("health", self.norms.capture_grads)
        if not self.integrity.armed:
            return

        def verify() -> None:
            weights = combine(self.params.digest_now())
            where = "before the next optimizer step"
            found = self.integrity.verify(self.step_index, weights, self.optimizer_steps, where)
            if found is not None:
                self._report(self.step_index, found)

        self._run("integrity", verify)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_steps += 1

    def _check_canary(self, step: int) -> None:
        assert self.canary is not None
        weights = combine(self.params.digest_now() + self.buffers.digest_now())
        recorder_armed = self.recorder.armed if self.recorder else False
        if self.recorder is not None:
            self.recorder.armed = False  # the canary's forward is not a training forward
        try:
            finding = self.canary_check.check(step, weights, self.canary)
        finally:
            if self.recorder is not None:
                self.recorder.armed = recorder_armed
        if finding is not None:
            self._report(step, finding)

    # --- emitting ------------------------------------------------------------------------

    def _event(self, body: str, step: int) -> Event:
        return Event(
            body=body,
            ts_ns=time.time_ns(),
            host=self.host,
            source="sdk",
            kind="state",
            rank=self.rank,
            pid=self.pid,
            job=self.job,
            attrs={"step": step},
        )

    def _report(self, step: int, finding: Finding) -> None:
        captures = {"rank": str(self.rank), "host": self.host}
        if self.device is not None:
            captures["device"] = self.device
        self._emitted += 1
        evidence = finding.evidence(
            self._event("", step),
            f"sdk-{self.host}-{self.pid}-{self.rank}-{step}-{self._emitted}",
            captures,
        )
        self._run("emit", self.emit_fn, evidence)

    def _metric(self, step: int, name: str, value: float, **labels: str) -> None:
        event = metric(
            name,
            value,
            source="sdk",
            labels=labels,
            host=self.host,
            ts_ns=time.time_ns(),
            job=self.job,
            rank=self.rank,
            pid=self.pid,
        )
        self._run("emit", self.emit_fn, event)

    def _run(self, feature: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call `fn`; on an exception count it, say so once on stderr, and after a few
        switch the feature off and say that coverage was lost. The training loop never sees
        it."""
        if feature in self.disabled:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            count = self.errors[feature] = self.errors.get(feature, 0) + 1
            self._failed_since.setdefault(feature, self.step_index)
            if count == 1:
                sys.stderr.write(
                    f"denpex.sdk: {feature} failed at step {self.step_index} ({exc!r}); "
                    "training continues\n"
                )
            if count >= MAX_FEATURE_ERRORS and feature != "emit":
                if feature != "replicas":  # replicas still enter the gather (nobody waits)
                    self.disabled.add(feature)
                self._lost(feature, self._failed_since[feature], f"{type(exc).__name__}: {exc}")
            return None

    def _prestop(self, hook: Any, path: Any) -> Any:
        """The pre-stop checkpoint (sdk/prestop.py) when a hook or a path is given."""
        return _prestop_of(self, hook, path)

    # --- coverage ------------------------------------------------------------------------

    def _lost(self, check: str, since_step: int, reason: str) -> None:
        """Say once per check that it has not run since `since_step`, and why."""
        if check in self._coverage_lost:
            return
        self._coverage_lost.add(check)
        event = coverage_event(
            check,
            since_step,
            reason,
            host=self.host,
            rank=self.rank,
            pid=self.pid,
            job=self.job,
            ts_ns=time.time_ns(),
        )
        self._run("emit", self.emit_fn, event)

    def _check_coverage_at_start(self, param_bytes: int, distributed: bool) -> None:
        """Checks that cannot run in this process at all, said before the first step."""
        if self.options["replicas"] and self.world_size > 1 and not distributed:
            self._lost(
                "replicas",
                0,
                f"WORLD_SIZE is {self.world_size} but torch.distributed is not initialized when "
                "dx.watch() is called: replicas are not compared (call init_process_group first)",
            )
        limit = int(self.options["reference_checksum_max_bytes"])
        if native.backend("checksum") == "reference" and param_bytes > limit:
            why = (
                "the compiled checksum module is not available (DENPEX_NO_EXTENSIONS=1 or not "
                f"built) and the pure-Python XXH3 is too slow for {param_bytes >> 20} MiB of "
                f"parameters (reference_checksum_max_bytes={limit})"
            )
            self.disabled.update(("checksums", "integrity"))
            self._lost("checksums", 0, why)
            if self.canary is not None:
                self.disabled.add("canary")
                self._lost("canary", 0, why)

    def _cupti_tracer(self) -> Any:
        """The CUPTI tracer when asked for (cupti=True, or DENPEX_CUPTI=1 with cupti unset);
        when CUPTI says no, coverage of GPU activity is lost from the start, and why."""
        from denpex.sdk.cupti import CuptiTracer, CuptiUnavailable, requested

        wanted = self.options["cupti"]
        if not (wanted if wanted is not None else requested()):
            return None
        try:
            return CuptiTracer()
        except CuptiUnavailable as exc:
            sys.stderr.write(f"denpex.sdk: CUPTI tracer off: {exc}\n")
            self._lost("cupti", 0, str(exc))
            return None

    def _progress_monitor(self) -> Monitor | None:
        if not self.options["progress"]:
            return None
        try:
            from denpex.sdk.progress import ProgressMonitor
        except ImportError:
            return None
        monitor: Monitor | None = self._run(
            "progress",
            lambda: ProgressMonitor(
                rank=self.rank,
                world_size=self.world_size,
                group=self.group,
                emit=self.emit_fn,
                host=self.host,
                options=self.options,
                gpu=self._cupti_feed(),
            ),
        )
        attach = getattr(monitor, "attach", None)
        if attach is not None:
            self._run("progress", attach, self.model)  # times backward, when it knows how
        return monitor

    def _cupti_feed(self) -> Any:
        if self.cupti is None:
            return None
        from denpex.sdk.cupti import CuptiFeed

        return CuptiFeed(self.cupti, float(self.options["cupti_in_flight_s"]))


def _prestop_of(guard: Guard, hook: Any, path: Any) -> Any:
    from denpex.sdk.prestop import PreStop, save_state_hook

    if hook is None and path is None:
        return None
    if hook is not None and not callable(hook):
        raise TypeError("watch(prestop=...) takes a callable hook(step)")
    chosen = hook or save_state_hook(guard.model, guard.optimizer, os.fspath(path))
    prestop = PreStop(chosen, rank=guard.rank)
    return prestop if prestop.install() else None


def watch(model: Any, optimizer: Any = None, **options: Any) -> Guard:
    """Attach denpex to a model (and its optimizer) and return its Guard; the options are
    Guard's (every, checksum_every, canary_batch, canary_every, group, rank, emit, and the
    keys of DEFAULT_OPTIONS)."""
    return Guard(model, optimizer, **options)
