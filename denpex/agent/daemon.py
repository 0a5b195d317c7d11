"""The node agent: collectors → pipeline → local API, Prometheus, OTLP and the spool.

`Agent` owns the pieces and their lifecycle (start, `serve` until a signal, reload on
SIGHUP, stop); it never reads a source itself. A collector that is unavailable here is listed with its reason and the
rest run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from denpex.agent.api import AgentApi
from denpex.agent.config import AgentConfig
from denpex.agent.delivery import Delivery
from denpex.agent.exposition import AgentView, SelfMetric
from denpex.agent.host_state import HELP as HOST_STATE_HELP
from denpex.agent.host_state import host_labels, host_state_metrics, missing
from denpex.agent.jobs import JobTable
from denpex.agent.pipeline import Pipeline
from denpex.agent.registry import COLLECTORS
from denpex.agent.scheduler import CollectorState, Scheduler
from denpex.catalog import Catalog, load_catalog
from denpex.core.collector import CollectContext, Collector, Observation
from denpex.core.events import Event, Evidence, metric

FAILING_AFTER = 3  # consecutive failed polls before /healthz calls a collector blind
JOBS_REFRESH_S = 5.0  # how often descendants of registered processes are looked up
JOBS_IDLE_S = 10.0  # the same check while no job is registered (a registration refreshes now)
JOBS_SPACING_S = 1.0  # at most one refresh this often: a burst of registrations costs one pass


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        catalog: Catalog | None = None,
        collector_classes: Sequence[type[Collector]] = COLLECTORS,
        persist: bool = True,
    ) -> None:
        self.config = config
        self.collector_classes = collector_classes
        self.persist = persist
        self.catalog = catalog or load_catalog(local=config.signatures_local)
        self.jobs = JobTable(
            config.roots, max_per_user=int(config.api.get("max_registrations_per_user") or 256)
        )
        self.shipper: Any = None
        self.delivery: Delivery | None = None
        self.pipeline = Pipeline(
            self.catalog,
            self.jobs,
            host=config.host,
            ring_size=config.evidence_ring,
            metric_ttl_s=config.metric_ttl_s,
        )
        self.states: list[CollectorState] = []
        self.unavailable: dict[str, str] = {}
        self.scheduler: Scheduler | None = None
        self.api: AgentApi | None = None
        self.started_ns = time.time_ns()
        self._stopping = threading.Event()

    # -- collectors ---------------------------------------------------------------------
    def build_collectors(self) -> None:
        """Instantiate every enabled collector and keep those available here."""
        self.states, self.unavailable = [], {}
        for cls in self.collector_classes:
            settings = self.config.collector(cls.name)
            if not settings.enabled:
                self.unavailable[cls.name] = "disabled in the configuration"
                continue
            options = dict(settings.options)
            if cls.name == "journal" and any(s.name == "kmsg" for s in self.states):
                options.setdefault("skip_kernel", True)  # kernel lines come from kmsg already
            if self.persist:
                state_dir = self.config.state_dir / cls.name
                options.setdefault("state_dir", str(state_dir))
            try:
                collector = cls(self.config.roots, options)
                ok, reason = collector.available()
            except Exception as exc:  # a broken option must not take the agent down
                self.unavailable[cls.name] = f"cannot start: {type(exc).__name__}: {exc}"
                continue
            if not ok:
                collector.close()
                self.unavailable[cls.name] = reason
                continue
            self.states.append(
                CollectorState(
                    collector,
                    interval_s=settings.interval_s or cls.default_interval_s,
                    budget_s=settings.budget_s or cls.default_budget_s,
                )
            )

    def context(self) -> CollectContext:
        return CollectContext(self.config.roots, self.config.host, self.jobs.snapshot())

    def _on_result(
        self,
        state: CollectorState,
        found: list[Observation],
        ack: Callable[[], None] | None = None,
    ) -> None:
        self.pipeline.ingest(found, ack)
        for item in found:
            if isinstance(item, Event) and item.source == "agent":
                print(f"denpex agent: {item.body}", file=sys.stderr, flush=True)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self.build_collectors()
        self._start_delivery()
        self.view = AgentView(
            host=self.config.host,
            pipeline=self.pipeline,
            states=lambda: list(self.states),
            unavailable=lambda: dict(self.unavailable),
            help_texts=self.help_texts,
            extra=[self._delivery_metrics, self._host_state_samples],
        )
        self.api = self._make_api(self.config)
        self.api.start()
        self._start_scheduler()
        threading.Thread(target=self._maintain_jobs, name="jobs", daemon=True).start()

    def _make_api(self, config: AgentConfig) -> AgentApi:
        requeue = self.delivery.requeue_dead_letter if self.delivery is not None else None
        return AgentApi(config, self.view, self.health, self.refresh, requeue)

    def refresh(self, timeout_s: float) -> list[str]:
        """Poll every collector now (for a caller that wants current evidence)."""
        scheduler = self.scheduler
        return scheduler.refresh(timeout_s) if scheduler is not None else []

    def _maintain_jobs(self) -> None:
        while not self._stopping.is_set():
            self.jobs.changed.wait(JOBS_REFRESH_S if self.jobs.count() else JOBS_IDLE_S)
            self.jobs.changed.clear()
            self.jobs.expire()
            self.jobs.refresh()
            self._stopping.wait(JOBS_SPACING_S)

    def _start_scheduler(self) -> None:
        self.scheduler = Scheduler(self.states, self.context, self._on_result)
        self.scheduler.start()

    def _start_delivery(self) -> None:
        """With an OTLP endpoint: evidence through the handoff into the disk spool (at least
        once, positions committed after), metrics as a periodic snapshot (best effort)."""
        self.delivery = Delivery.from_config(self.config, self.help_texts())
        if self.delivery is None:
            return
        self.shipper = self.delivery.shipper
        self.pipeline.handoff = self.delivery.handoff
        self.delivery.start()
        interval = float(self.config.otlp.get("metrics_interval_s") or 30)
        threading.Thread(
            target=self._send_metrics, args=(interval,), name="otlp-metrics", daemon=True
        ).start()

    def _send_metrics(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            self.pipeline.handoff.flush()  # space may have returned with no poll since
            snapshot = [
                metric(
                    name,
                    value.value,
                    source=value.source,
                    counter=value.type == "counter",
                    labels=dict(labels),
                    host=self.config.host,
                    ts_ns=value.ts_ns,
                )
                for (name, labels), value in self.pipeline.metric_values().items()
            ]
            self.shipper.submit_metrics(snapshot + self.host_state(time.time_ns()))

    def host_state(self, now_ns: int) -> list[Event]:
        """host_info and the last passing diagnostics (denpex.agent.host_state)."""
        collectors = [state.collector for state in list(self.states)]
        return host_state_metrics(
            collectors, self.config.roots, self.config.state_dir, self.config.host, now_ns
        )

    def _host_state_samples(self) -> list[SelfMetric]:
        out = []
        for event in self.host_state(time.time_ns()):
            labels = {k: str(v) for k, v in event.attrs.items() if k not in ("value", "type")}
            value = float(event.attrs["value"])
            out.append(SelfMetric(event.body, HOST_STATE_HELP[event.body], value, labels))
        return out

    def _delivery_metrics(self) -> list[SelfMetric]:
        sink_errors = SelfMetric(
            "pipeline_sink_errors_total",
            "Batches a best-effort evidence or metric sink failed to take",
            self.pipeline.stats.sink_errors,
        )
        return [sink_errors, *(self.delivery.metrics() if self.delivery else [])]

    def stop(self) -> None:
        self._stopping.set()
        self.jobs.changed.set()
        if self.scheduler is not None:
            self.scheduler.stop()
        for state in self.states:
            state.collector.close()
        if self.api is not None:
            self.api.stop()
        if self.delivery is not None:
            self.delivery.stop(timeout_s=5.0)

    def reload(self, config: AgentConfig) -> None:
        """Apply a new configuration: collectors restart with their new settings; the
        evidence ring, the registered jobs and the listen socket (unless changed) stay."""
        if self.scheduler is not None:
            self.scheduler.stop()
        for state in self.states:
            state.collector.close()
            self.pipeline.forget_metrics(state.name)
        listen_changed = config.listen != self.config.listen
        api_changed = config.api != self.config.api or config.socket != self.config.socket
        self.config = config
        self.jobs.roots = config.roots
        self.build_collectors()
        if (listen_changed or api_changed) and self.api is not None:
            self.api.stop()
            self.api = self._make_api(config)
            self.api.start()
        self._start_scheduler()

    def serve(
        self,
        reload_config: Callable[[], AgentConfig],
        say: Callable[[str], None],
    ) -> None:
        """Run until SIGTERM or SIGINT (main thread only), reloading on SIGHUP with the
        configuration `reload_config()` returns; a reload that raises keeps the old settings
        and `say`s why. Call after start(); stops the agent before returning."""
        # handlers only set flags (taking a lock in a handler can deadlock the thread it
        # interrupted); the C-level handler writes to the wake-up pipe the main thread sleeps on
        flags = {"stop": False, "reload": False}
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        previous_wakeup = signal.set_wakeup_fd(wake_write)

        def on_signal(flag: str) -> Callable[..., None]:
            def handler(*_: object) -> None:
                flags[flag] = True
                with contextlib.suppress(OSError):  # one more turn of the loop, after the flag
                    os.write(wake_write, b"!")

            return handler

        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {sig: signal.getsignal(sig) for sig in handled}
        signal.signal(signal.SIGTERM, on_signal("stop"))
        signal.signal(signal.SIGINT, on_signal("stop"))
        signal.signal(signal.SIGHUP, on_signal("reload"))
        try:
            while not flags["stop"]:
                os.read(wake_read, 512)  # no timeout: an idle agent does not wake for nothing
                if flags["reload"]:
                    flags["reload"] = False
                    try:
                        self.reload(reload_config())
                        say("configuration reloaded")
                    except Exception as exc:  # a bad file must not stop a running agent
                        say(f"reload refused, keeping the old settings: {exc}")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_wakeup)
            os.close(wake_read)
            os.close(wake_write)
            self.stop()

    def collect_once(self) -> tuple[list[Event], list[Evidence]]:
        """One poll of every available collector: (events, evidence), for `--once`."""
        self.build_collectors()
        scheduler = Scheduler(self.states, self.context, self._on_result)
        events: list[Event] = []
        evidence: list[Evidence] = []
        for state in self.states:
            found = scheduler.poll_once(state)
            evidence.extend(self.pipeline.ingest(found))
            events.extend(item for item in found if isinstance(item, Event))
            if state.last_error:
                self.unavailable[state.name] = f"poll failed: {state.last_error}"
            state.collector.close()
        return events, evidence

    # -- health -------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        collectors = {}
        blind = []
        for state in list(self.states):
            status, blind_reason = "ok", state.collector.degraded()
            if state.stuck:
                status = "stuck"
            elif state.consecutive_failures >= FAILING_AFTER:
                status = "failing"
            elif blind_reason:
                status = "degraded"
            if status != "ok":
                blind.append(state.name)
            collectors[state.name] = {
                "status": status,
                "polls": state.polls_total,
                "last_duration_s": round(state.last_duration_s, 6),
                "last_error": state.last_error or None,
                "degraded": blind_reason,
            }
        status = "unhealthy" if blind else "ok"
        labels = host_labels((s.collector for s in list(self.states)), self.config.roots)
        report: dict[str, Any] = {
            "status": status,
            "host": self.config.host,
            "blind": blind,
            "collectors": collectors,
            "unavailable": dict(self.unavailable),
            "host_info": {"labels": labels, "missing": missing(labels)},
        }
        if self.delivery is not None:
            spool = report["spool"] = self.delivery.health()
            if spool["status"] != "ok" and status == "ok":
                report["status"] = "degraded"  # seeing, but what it sees is not kept
        return report

    def help_texts(self) -> dict[str, str]:
        texts: dict[str, str] = {}
        for cls in self.collector_classes:
            texts.update(cls.metrics_help)
        return texts
