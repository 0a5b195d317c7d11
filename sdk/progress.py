"""Progress, hang and straggler detection: a step heartbeat in the torch.distributed Store, read
by a watchdog thread in every rank, which names the hung or slow rank(s) in evidence (the
rules are denpex.series.progress; a slowdown of the whole job, denpex.series.throughput).

It never raises into training and never blocks it: the training thread only records numbers;
every Store round trip, judgement and emit happens on the watchdog thread. When the Store is
missing or stops answering, it says once that hang detection across ranks is off.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from statistics import median
from typing import Any, Protocol

import orjson

import denpex
import denpex._native
from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence, metric
from denpex.core.sdk_wire import coverage_event
from denpex.sdk.progress_store import StoreLink, open_store
from denpex.sdk.step_findings import process_state_event
from denpex.series.findings import Finding
from denpex.series.progress import (
    PeerView,
    deadline_of,
    find_stragglers,
    hang_evidence_id,
    judge_hang,
)
from denpex.series.thresholds import ProgressRules, ThroughputRules, with_options
from denpex.series.throughput import ThroughputDrop

log = logging.getLogger("denpex.sdk.progress")

Emit = Callable[[Evidence | Event], None]


class GpuActivity(Protocol):
    """What a GPU tracer (sdk/cupti.py's CuptiFeed) tells the monitor: where the rank's GPU
    waits (an NCCL kernel long in flight) and the GPU time of its last step."""

    def place(self) -> tuple[str, str] | None: ...

    def step_busy_s(self) -> float | None: ...


KEY_PREFIX = "denpex/hb"
_PARAMS_TIMED = 4  # backward ends when the first parameters get their gradients: hook a few


class ProgressMonitor:
    """One per training process: `on_step` after each optimizer step, `close` at the end.

    `options` may hold the ProgressRules and ThroughputRules fields (denpex/series/
    thresholds.yaml) and `store`: any object
    with `set(key, bytes)`, `check([keys])` and `multi_get([keys])`, like a torch.distributed
    Store (default: the default process group's Store, when torch.distributed is initialized).
    Heartbeats live under `denpex/hb/<restart count>/<global rank>`.
    """

    def __init__(
        self,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        group: Any = None,
        emit: Emit | None = None,
        host: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: GpuActivity | None = None,
    ) -> None:
        options = dict(options or {})
        self._gpu = gpu
        self.thresholds = ProgressRules.from_options(options)
        self.rank = int(rank) if rank is not None else 0
        self.world_size = int(world_size) if world_size is not None else 1
        self.host = host or socket.gethostname()
        self._emit = emit
        self._ranks = _group_ranks(group, self.world_size)
        # only the lowest few ranks read every heartbeat: N ranks reading N keys each second
        # would load the Store with N² values a second; every rank still writes its own
        self._readers = set(sorted(self._ranks)[: max(1, self.thresholds.readers)])
        store = open_store(options.get("store"), self.thresholds.store_timeout_s)
        self._store = StoreLink(store) if store is not None else None
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._prefix = f"{options.get('heartbeat_prefix', KEY_PREFIX)}/{restart}"
        self._store_on_rank0 = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        window = self.thresholds.straggler_window
        self._intervals: deque[float] = deque(maxlen=window)
        self._busy: deque[float] = deque(maxlen=window)
        self._step = 0
        self._step_started = time.perf_counter()
        self._grad_done = 0.0  # perf_counter when backward last wrote a timed gradient
        self._hooks: list[Any] = []
        self._main_thread = threading.get_ident()  # the training thread: updated by on_step
        self._views: dict[int, PeerView] = {}
        self._beat = 0
        self._closed = False
        self._reported_hangs: set[str] = set()
        self._stragglers_named: set[int] = set()
        self._store_failures = 0
        self._store_failed_at_step: int | None = None
        self._coverage_said = False
        # the lowest rank of the group watches the job's own pace against its baseline
        self._pace = (
            ThroughputDrop(with_options(ThroughputRules, options), subject="the job")
            if self.rank == min(self._ranks, default=self.rank)
            else None
        )
        self._paced_step = 0
        self._last_metric = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="denpex-progress-watchdog", daemon=True
        )
        self._thread.start()

    # --- training thread: record numbers only --------------------------------------------

    def attach(self, model: Any) -> None:
        """Time backward on `model` so that waiting inside gradient collectives does not count
        as this rank's own work (a synchronised job has equal step intervals on every rank)."""
        try:
            params = [p for p in model.parameters() if p.requires_grad][:_PARAMS_TIMED]
            for param in params:
                self._hooks.append(param.register_post_accumulate_grad_hook(self._on_grad))
        except Exception as exc:  # never break the caller's model set-up
            log.debug("progress: cannot time backward: %s", exc)

    def _on_grad(self, _param: Any) -> None:
        self._grad_done = time.perf_counter()

    def on_step(
        self, step: int, loss: float | None = None, loss_scale: float | None = None
    ) -> None:
        now = time.perf_counter()
        interval = now - self._step_started
        busy = interval
        if self._step_started < self._grad_done <= now:
            busy = self._grad_done - self._step_started
        gpu_busy = self._gpu.step_busy_s() if self._gpu is not None else None
        if gpu_busy is not None:  # the GPU's own kernels: waiting for peers is not in them
            busy = gpu_busy
        self._intervals.append(interval)
        self._busy.append(busy)
        self._step = int(step)
        self._step_started = now
        self._main_thread = threading.get_ident()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()  # the watchdog writes the closing heartbeat, then ends
        self._thread.join(timeout=self.thresholds.watchdog_interval_s + 2 * self._store_wait())
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def __enter__(self) -> ProgressMonitor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- watchdog thread ------------------------------------------------------------------

    def _store_wait(self) -> float:
        return self.thresholds.store_timeout_s if self._store is not None else 0.0

    def _watch(self) -> None:
        if self._store is None and len(self._ranks) > 1:
            self._coverage_lost(
                0,
                "no torch.distributed store to exchange heartbeats (the process group is not "
                "initialized): hangs and stragglers of other ranks are not watched",
            )
        try:
            self._publish()  # at once: a rank that stops before its first tick is still seen
        except Exception as exc:
            log.debug("progress: first heartbeat not written: %s", exc)
        while not self._stop.wait(self.thresholds.watchdog_interval_s):
            try:
                self._tick()
            except Exception as exc:  # the watchdog must outlive any surprise
                log.debug("progress: watchdog tick failed: %s", exc)
        try:  # a closed rank is finished, not hung: say so to the others
            self._publish(closed=True)
        except Exception as exc:
            log.debug("progress: closing heartbeat not written: %s", exc)
        if self._store is not None:
            self._store.stop()

    def _tick(self) -> None:
        self._beat += 1
        now = time.monotonic()
        own = self._own_record()
        self._observe(self.rank, own, now)
        self._maybe_emit_metric(now)
        self._judge_pace(own)
        if self._store is not None:
            try:
                reads = self.rank in self._readers
                records = self._publish(own, read=reads) or {}
                self._store_failures = 0
                self._store_failed_at_step = None
            except Exception as exc:
                self._store_failures += 1
                if self._store_failed_at_step is None:
                    self._store_failed_at_step = self._step
                log.debug("progress: store unreachable: %s", exc)
                if self._store_failures >= max(1, self.thresholds.store_failures_lost):
                    self._coverage_lost(
                        self._store_failed_at_step,
                        f"the torch.distributed store stopped answering "
                        f"({type(exc).__name__}: {exc}): hangs of other ranks are judged "
                        "from this rank alone",
                    )
                self._judge_without_store(now)
                return
            if self.rank not in self._readers:
                return
            for rank in self._ranks:
                if rank == self.rank:
                    continue
                if rank in records:
                    self._observe(rank, records[rank], now)
                else:
                    self._views[rank] = _unseen(rank, now)
        self._judge(now)

    def _own_record(self) -> dict[str, Any]:
        where, frame = _main_thread_place(self._main_thread)
        if self._gpu is not None:
            try:
                on_gpu = self._gpu.place()
            except Exception as exc:  # a tracer failing costs its hint, never the heartbeat
                log.debug("progress: GPU activity unreadable: %s", exc)
                on_gpu = None
            if on_gpu is not None:
                where, gpu_frame = on_gpu
                frame = f"{gpu_frame}; {frame}" if frame else gpu_frame
        return {
            "step": self._step,
            "interval": median(self._intervals) if self._intervals else None,
            "busy": median(self._busy) if len(self._busy) == self._busy.maxlen else None,
            "beat": self._beat,
            "where": where,
            "frame": frame,
            "host": self.host,
            "pid": os.getpid(),
        }

    def _publish(
        self, record: dict[str, Any] | None = None, *, closed: bool = False, read: bool = False
    ) -> dict[int, dict[str, Any]] | None:
        """Write our heartbeat (and read the others' when `read`) on the Store's thread;
        raises StoreStuck when that takes longer than store_timeout_s."""
        if self._store is None:
            return None
        payload = orjson.dumps({**(record or self._own_record()), "closed": closed})
        key = f"{self._prefix}/{self.rank}"

        def exchange(store: Any) -> dict[int, dict[str, Any]] | None:
            store.set(key, payload)
            return self._read_all(store) if read else None

        return self._store.call(exchange, self.thresholds.store_timeout_s)

    def _read_all(self, store: Any) -> dict[int, dict[str, Any]]:
        keys = {rank: f"{self._prefix}/{rank}" for rank in self._ranks if rank != self.rank}
        present = keys
        if keys and not store.check(list(keys.values())):  # someone not started yet
            present = {r: k for r, k in keys.items() if store.check([k])}
        if not present:
            return {}
        values = store.multi_get(list(present.values()))
        return {rank: orjson.loads(bytes(v)) for rank, v in zip(present, values, strict=True)}

    def _observe(self, rank: int, record: dict[str, Any], now: float) -> None:
        old = self._views.get(rank)
        step_changed_at = now if old is None or old.step != record["step"] else old.step_changed_at
        beat_changed_at = now if old is None or old.beat != record["beat"] else old.beat_changed_at
        self._views[rank] = PeerView(
            rank=rank,
            step=record["step"],
            beat=record["beat"],
            interval_s=record.get("interval"),
            busy_s=record.get("busy"),
            where=record.get("where", "unknown"),
            frame=record.get("frame", ""),
            host=record.get("host", ""),
            closed=bool(record.get("closed")),
            step_changed_at=step_changed_at,
            beat_changed_at=beat_changed_at,
        )

    def _judge(self, now: float) -> None:
        hang = judge_hang(self._views.values(), now, self.thresholds, self._readers)
        if hang is None:
            self._reported_hangs.clear()  # progress resumed: a new hang is a new report
        elif hang.reporter == self.rank or self._store is None:
            evidence_id = hang_evidence_id(hang)
            if evidence_id not in self._reported_hangs:
                self._reported_hangs.add(evidence_id)
                self._send(hang.evidence(self.rank, self.host, evidence_id))
        slow = find_stragglers(self._views.values(), self.thresholds)
        named = {s.rank for s in slow}
        if self._lowest_live_reader(now) == self.rank:
            for straggler in slow:
                if straggler.rank not in self._stragglers_named:
                    self._send(straggler.evidence(self.rank, self.host, self._views))
        self._stragglers_named = named

    def _lowest_live_reader(self, now: float) -> int | None:
        limit = self.thresholds.unresponsive_limit
        live = (
            v.rank
            for v in self._views.values()
            if v.rank in self._readers and v.seen and now - v.beat_changed_at <= limit
        )
        return min(live, default=None)

    def _judge_without_store(self, now: float) -> None:
        """The Store stopped answering (its host may be stopped): name the host rank once our
        own steps are overdue; every rank sends the same id, so receivers keep one."""
        own = self._views.get(self.rank)
        if own is None or self._store_failures < 2:
            return
        deadline = deadline_of(self._views.values(), self.thresholds)
        if now - own.step_changed_at <= deadline:
            return
        suspect = 0 if self._store_on_rank0 else None
        key = f"sdk:train.hang.store_unreachable:{self._prefix}:{own.step}"
        if key in self._reported_hangs:
            return
        self._reported_hangs.add(key)
        who = f"rank {suspect}" if suspect is not None else "the store host"
        captures = {"rank": str(suspect if suspect is not None else ""), "step": str(own.step)}
        captures["seconds"] = f"{now - own.step_changed_at:.1f}"
        captures["reporter_rank"] = str(self.rank)
        event = Event(
            body="",
            ts_ns=time.time_ns(),
            host=self.host,
            source="sdk",
            kind="state",
            rank=suspect,
        )
        evidence = detector_evidence(
            event, "train.hang.store_unreachable", captures=captures, values={"who": who}
        )
        evidence.id = key
        event.body = evidence.summary
        self._send(evidence)

    def _judge_pace(self, own: dict[str, Any]) -> None:
        """The job's median step time against its own baseline, once per new step seen."""
        interval = own.get("interval")
        if self._pace is None or interval is None or self._step <= self._paced_step:
            return
        self._paced_step = self._step
        finding = self._pace.observe(self._step, float(interval))
        if finding is not None:
            self._send(self._finding_evidence(finding, f"sdk:{finding.signature}:{self._step}"))

    def _finding_evidence(self, finding: Finding, evidence_id: str) -> Evidence:
        event = process_state_event(self.host, self.rank)
        return finding.evidence(event, evidence_id, {"rank": str(self.rank), "host": self.host})

    def _coverage_lost(self, since_step: int, reason: str) -> None:
        if self._coverage_said:
            return
        self._coverage_said = True
        self._send(
            coverage_event(
                "progress",
                since_step,
                reason,
                host=self.host,
                rank=self.rank,
                pid=os.getpid(),
                ts_ns=time.time_ns(),
            )
        )

    def _maybe_emit_metric(self, now: float) -> None:
        if now - self._last_metric < self.thresholds.metric_every_s or not self._intervals:
            return
        self._last_metric = now
        labels = {"rank": str(self.rank)}
        value = median(self._intervals)
        self._send(
            metric(
                "sdk_step_seconds",
                value,
                source="sdk",
                labels=labels,
                host=self.host,
                ts_ns=time.time_ns(),
                rank=self.rank,
            )
        )

    def _send(self, item: Evidence | Event) -> None:
        try:
            (self._emit or _default_emit())(item)
        except Exception as exc:
            log.debug("progress: emit failed: %s", exc)


def _unseen(rank: int, now: float) -> PeerView:
    return PeerView(rank, -1, -1, None, None, "unknown", "", "", False, now, now, seen=False)


def _default_emit() -> Emit:
    from denpex.sdk.transport import default_emit

    return default_emit


def _group_ranks(group: Any, world_size: int) -> list[int]:
    """Global ranks of `group` (a torch ProcessGroup), or every rank when there is none."""
    if group is not None and "torch.distributed" in sys.modules:
        try:
            import torch.distributed as dist

            return list(dist.get_process_group_ranks(group))
        except Exception as exc:
            log.debug("progress: group ranks unknown, watching the world: %s", exc)
    return list(range(world_size))


def _package_dir(module: Any) -> str:
    """The folder a package is installed in, with a trailing separator."""
    return os.path.join(os.path.dirname(os.path.realpath(module.__file__)), "")


# frames of denpex itself (the package and the SDK, wherever they are installed: a clone in a
# folder named `denpex` holds the user's own code too) and of the threading module
_OWN_PATHS = (
    _package_dir(denpex),
    _package_dir(denpex._native),
    os.path.join(os.path.dirname(os.path.realpath(__file__)), ""),
    os.path.realpath(threading.__file__),
)
_path_cache: dict[str, str] = {}


def _real(path: str) -> str:
    real = _path_cache.get(path)
    if real is None:
        real = _path_cache[path] = os.path.realpath(path) if len(_path_cache) < 4096 else path
    return real


def _collective_paths(torch_dir: str) -> tuple[str, str]:
    """torch.distributed, and DDP's module (its forward and backward wait in collectives)."""
    return (
        f"{torch_dir}distributed{os.sep}",
        f"{torch_dir}nn{os.sep}parallel{os.sep}distributed.py",
    )


def _main_thread_place(thread_id: int) -> tuple[str, str]:
    """Where the training thread is now: 'collective' (inside torch.distributed), 'backward'
    or 'compute', and its innermost frame outside torch and denpex as `file:line function`."""
    frame = sys._current_frames().get(thread_id)
    torch = sys.modules.get("torch")
    torch_dir = _package_dir(torch) if getattr(torch, "__file__", None) else None
    where, place = "compute", ""
    while frame is not None:
        path = _real(frame.f_code.co_filename)
        in_torch = torch_dir is not None and path.startswith(torch_dir)
        if torch_dir is not None and in_torch and path.startswith(_collective_paths(torch_dir)):
            where = "collective"
        elif in_torch and where == "compute" and path.startswith(f"{torch_dir}autograd{os.sep}"):
            where = "backward"
        if not place and not in_torch and not path.startswith(_OWN_PATHS):
            place = f"{os.path.basename(path)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return where, place
