"""The NVML collector: per-GPU health and utilisation through pynvml (MIG devices as their
own entities), Xids and recovery actions through an NVML event set, and detector evidence
(GPU lost or needing a reset, Xid bursts, ECC, row remap, thermal, PCIe, NVLink, fabric).

Bounded calls: each GPU has its own BoundedCaller (one worker thread) and the system calls
(init, count, event registration) another, all under `deadline_s`. A call that does not
return blinds only its own GPU: that GPU reports `gpu_nvml_up 0` plus how long its call has
been stuck, one gpu.gsp_timeout evidence names the call, `degraded()` says why (so /healthz
turns unhealthy), and every other GPU keeps reporting. Later polls do not queue behind the
stuck call (the caller fails fast) until it returns. If the driver serialises all GPUs behind
one stuck call, every GPU reports the same way, each naming its own call. Only a GPU that
NVML calls lost or needing a reset is evidence of a lost GPU: a GPU NVML cannot read (no
permission, an unknown error) reports `gpu_nvml_up 0` and a note, once. Never raises for an
NVML error and never blocks a poll longer than one deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from denpex.core.collector import CollectContext, Observation, detector_evidence
from denpex.core.deadline import BoundedCaller, DeadlineExceeded
from denpex.core.events import Event, format_ts
from denpex.core.roots import Roots, read_text
from denpex.gpu.base import GpuCollector
from denpex.gpu.nvml.detect import Finding, detect
from denpex.gpu.nvml.events import EventWatcher
from denpex.gpu.nvml.library import SHIM_ENV, SHIM_SCENARIO_ENV, ShimError, bind_library
from denpex.gpu.nvml.metrics import HELP, down_metrics, gpu_labels, sample_metrics, xid_metrics
from denpex.gpu.nvml.query import GpuGone, GpuReader, GpuSample, GpuUnreadable
from denpex.gpu.nvml.xid import XidBurst, XidTableError, XidTracker, default_table, merge_overrides


class NvmlCollector(GpuCollector):
    name = "nvml"
    stability = "experimental"
    default_interval_s = 10.0
    default_budget_s = 15.0  # the poll in which a call first hangs waits one deadline (5 s)
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self.deadline_s = float(self.options.get("deadline_s", 5.0))
        self._config_error: str | None = None
        try:
            table = merge_overrides(default_table(), self.options.get("xid_overrides"))
        except XidTableError as exc:
            self._config_error = f"collectors.nvml: {exc}"
            table = default_table()
        self.tracker = XidTracker(table)
        self._system = BoundedCaller("nvml", self.deadline_s)
        self._nvml: ModuleType | None = None
        self._about = ""
        self._count = 0
        self._driver = ""
        self._readers: dict[int, GpuReader] = {}
        self._callers: dict[int, BoundedCaller] = {}
        self._samples: dict[int, GpuSample] = {}
        self._gone: dict[int, str] = {}
        self._hangs: dict[int, str] = {}
        self._watcher: EventWatcher | None = None
        self._registered: set[int] = set()
        self._polls = 0

    # -- start-up ------------------------------------------------------------------------
    def _start(self) -> str | None:
        """None once NVML is initialised, else why not (and what would enable it)."""
        if self._config_error:
            return self._config_error
        if self._nvml is not None:
            return None
        try:
            import pynvml
        except ImportError:
            return "pynvml is not installed: pip install nvidia-ml-py"
        try:
            about = bind_library(pynvml)
        except ShimError as exc:
            return str(exc)
        try:
            self._system.call(pynvml.nvmlInit)
            self._count = int(self._system.call(pynvml.nvmlDeviceGetCount))
            driver = self._system.call(pynvml.nvmlSystemGetDriverVersion)
        except DeadlineExceeded as exc:
            return f"nvmlInit did not return ({exc}): the NVIDIA driver may be hung"
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                return (
                    "libnvidia-ml.so.1 not found: no NVIDIA driver on this node (for a demo: "
                    f"{SHIM_ENV}=1 {SHIM_SCENARIO_ENV}=examples/scenarios/xid79.yaml)"
                )
            if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
                return "the NVIDIA kernel driver is not loaded (modprobe nvidia; check dmesg)"
            if code == pynvml.NVML_ERROR_GPU_NOT_FOUND:
                return "NVML found no GPU on this node (nvidia-smi lists none either?)"
            if code == pynvml.NVML_ERROR_NO_PERMISSION:
                return "NVML may not talk to the driver as this user (check /dev/nvidia* access)"
            return f"nvmlInit failed: {exc}"
        self._nvml = pynvml
        version = driver.decode() if isinstance(driver, bytes) else str(driver)
        self._driver = version
        self._about = f"{about}, driver {version}: {self._count} GPU(s)"
        return None

    def available(self) -> tuple[bool, str]:
        problem = self._start()
        return (False, problem) if problem else (True, self._about)

    def host_facts(self) -> Mapping[str, str]:
        """The driver version and the GPUs' VBIOS versions (each distinct one, sorted)."""
        facts = {"driver": self._driver} if self._driver else {}
        firmware = sorted({r.identity.get("vbios", "") for r in self._readers.values()} - {""})
        if firmware:
            facts["firmware"] = ",".join(firmware)
        return facts

    # -- polling ---------------------------------------------------------------------------
    def collect(self, ctx: CollectContext) -> list[Observation]:
        if self._start() is not None or self._nvml is None:
            return []
        out: list[Observation] = []
        for index in range(self._count):
            out += self._poll_gpu(ctx, index)
        self._register_events()
        self._polls += 1
        if self._polls == 1 and self._watcher is not None:
            self._watcher.drained.wait(float(self.options.get("first_drain_s", 1.5)))
        out += [self._xid_evidence(ctx, burst) for burst in self.tracker.due(ctx.now_ns)]
        totals, last = self.tracker.snapshot()
        identities = {i: r.identity for i, r in self._readers.items()}
        titles = self.tracker.table.titles
        out += xid_metrics(totals, last, identities, ctx.host, ctx.now_ns, titles)
        if self._watcher is not None:
            for index, error in sorted(self._watcher.errors.items()):
                if index >= 0 and self.edges.first(("events", index)):
                    out.append(self._note(ctx, index, f"no NVML events for GPU {index}: {error}"))
        return out

    def _uptime(self, ctx: CollectContext) -> float | None:
        """Seconds since boot (/proc/uptime under the configured procfs root), or None."""
        text = read_text(ctx.roots.proc("uptime"))
        try:
            return float(text.split()[0]) if text else None
        except ValueError:
            return None

    def _poll_gpu(self, ctx: CollectContext, index: int) -> list[Observation]:
        assert self._nvml is not None
        reader = self._readers.get(index)
        if reader is None:
            reader = self._readers[index] = GpuReader(self._nvml, index, self._driver)
        caller = self._callers.get(index)
        if caller is None:
            caller = self._callers[index] = BoundedCaller(f"nvml-gpu{index}", self.deadline_s)
        identity = reader.identity
        try:
            sample = caller.call(reader.read)
        except DeadlineExceeded:
            stuck = caller.hung_for() or self.deadline_s
            out: list[Observation] = list(
                down_metrics(index, identity, ctx.host, ctx.now_ns, stuck)
            )
            if index not in self._hangs:
                call = reader.current_call or "an NVML call"
                self._hangs[index] = call
                hung = Finding("gpu.gsp_timeout.nvml_call_hung", {"call": call}, {"stuck_s": stuck})
                out.append(self._evidence(ctx, index, hung))
            return out
        except GpuGone as gone:
            out = list(down_metrics(index, identity, ctx.host, ctx.now_ns, 0.0))
            if index not in self._gone:
                self._gone[index] = gone.text
                out.append(self._evidence(ctx, index, _gone_finding(gone)))
            return out
        except GpuUnreadable as unreadable:  # no permission for the handle, an unknown error
            out = list(down_metrics(index, identity, ctx.host, ctx.now_ns, 0.0))
            if self.edges.rising(("unreadable", index), True):
                out.append(self._note(ctx, index, f"GPU {index} cannot be read: {unreadable}"))
            return out
        out = []
        self.edges.clear(("unreadable", index))
        if self._hangs.pop(index, None) or self._gone.pop(index, None):
            out.append(self._note(ctx, index, f"GPU {index} answers NVML again"))
        out += self._query_notes(ctx, index, sample)
        findings = detect(
            self._samples.get(index), sample, self.options, self.edges, self._uptime(ctx)
        )
        self._samples[index] = sample
        reasons = {k: int(v) for k, v in (self.options.get("clock_event_reasons") or {}).items()}
        out += sample_metrics(sample, ctx.host, ctx.now_ns, reasons)
        out += [self._evidence(ctx, index, finding) for finding in findings]
        return out

    def _query_notes(self, ctx: CollectContext, index: int, sample: GpuSample) -> list[Event]:
        """A note when a query starts failing (an unknown error) or is refused to this user,
        once while it lasts: neither says anything about the GPU's health."""
        failing = {f"error:{k}": v for k, v in sample.errors.items()}
        failing.update({f"denied:{k}": k for k in sample.denied})
        fresh = self.edges.holding(f"gpu{index}:queries", failing)
        out = []
        for key in sorted(fresh):
            kind, _, query = key.partition(":")
            text = failing[key] if kind == "error" else f"{query}: no permission (run as root?)"
            out.append(self._note(ctx, index, f"GPU {index}: {text}"))
        return out

    def _recovery_event(self, index: int) -> None:
        """A recovery-action event (event thread): poll now rather than at the next interval."""
        if self._wake is not None:
            self._wake()

    def _register_events(self) -> None:
        """Create the event set once and add every GPU whose handle is known."""
        assert self._nvml is not None
        try:
            if self._watcher is None:
                self._watcher = self._system.call(
                    EventWatcher,
                    self._nvml,
                    self.tracker,
                    int(self.options.get("event_wait_ms", 1000)),
                    self._recovery_event,
                )
            for index, reader in self._readers.items():
                if index not in self._registered and reader.handle is not None:
                    self._system.call(self._watcher.register, index, reader.handle)
                    self._registered.add(index)
            self._watcher.start()  # once; after registering, so its first wait sees every GPU
        except (DeadlineExceeded, self._nvml.NVMLError):
            return  # degraded() reports a stuck system call; a refused event set means no Xids

    # -- evidence --------------------------------------------------------------------------
    def _event(self, ctx: CollectContext, index: int, body: str, ts_ns: int | None = None) -> Event:
        identity = self._readers[index].identity if index in self._readers else {}
        attrs = gpu_labels(index, identity, ctx.host)
        return Event(
            body=body,
            ts_ns=ts_ns or ctx.now_ns,
            host=ctx.host,
            source="nvml",
            kind="state",
            attrs=attrs,
        )

    def _evidence(
        self, ctx: CollectContext, index: int, finding: Finding, ts_ns: int | None = None
    ) -> Observation:
        identity = self._readers[index].identity if index in self._readers else {}
        bus = identity.get("pci_bus_id")
        captures = {
            "gpu": str(index),
            "pci_bus_id": identity.get("pci_bus_id", ""),
            "uuid": identity.get("uuid", ""),
            **finding.captures,
        }
        # a GPU lost before NVML named its bus is "GPU 3", else "GPU 3 (00000000:3B:00.0)"
        values = {"gpu_name": f"GPU {index} ({bus})" if bus else f"GPU {index}"}
        evidence = detector_evidence(
            self._event(ctx, index, "", ts_ns),
            finding.detector,
            captures=captures,
            values={**values, **finding.values},
            severity=finding.severity,
            action=finding.action,
        )
        evidence.event.body = evidence.summary
        return evidence

    def _note(self, ctx: CollectContext, index: int, text: str) -> Event:
        return self._event(ctx, index, text)

    def _xid_evidence(self, ctx: CollectContext, burst: XidBurst) -> Observation:
        rule = burst.rule
        repeat = f" (x{burst.count} within {rule.window_s:g} s)" if burst.count > 1 else ""
        finding = Finding(
            rule.detector,
            {
                "xid": str(burst.xid),
                "count": str(burst.count),
                "first": format_ts(burst.first_ns) or "",
                "last": format_ts(burst.last_ns) or "",
                "window_s": f"{rule.window_s:g}",
            },
            {"repeat": repeat},
            # the Xid table (a site may tune it per code) decides, not the catalog
            severity=rule.severity,
            action=rule.action,
        )
        return self._evidence(ctx, int(burst.gpu), finding, burst.first_ns)

    # -- health ----------------------------------------------------------------------------
    def degraded(self) -> str | None:
        reasons = []
        for index, caller in sorted(self._callers.items()):
            stuck = caller.hung_for()
            if stuck:
                call = self._hangs.get(index) or self._readers[index].current_call or "a call"
                reasons.append(
                    f"NVML call {call} on GPU {index} has not returned for {stuck:.0f} s"
                )
        if self._system.hung_for():
            reasons.append(f"NVML system call stuck: {self._system.stuck_call}")
        if self._watcher is not None and self._watcher.hung_for():
            reasons.append(
                f"nvmlEventSetWait has not returned for {self._watcher.hung_for():.0f} s"
            )
        return "; ".join(reasons) or None

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()


def _gone_finding(gone: GpuGone) -> Finding:
    captures = {"call": gone.call, "nvml_error": gone.text}
    if gone.reset_required:
        return Finding("gpu.reset_required.nvml_reset_required", captures)
    return Finding("gpu.fallen_off_bus.nvml_gpu_lost", captures)
