"""Prometheus text exposition of the agent: collector values and the agent's own health.

Formatting is prometheus_client's (escaping, `# HELP`/`# TYPE`); names follow the rule of
denpex.agent.metric_names (`denpex_<name>`, counters end in `_total`), shared with OTLP.
The one exception is a counter under another exporter's name (dcgm-exporter's `DCGM_*`):
its `# HELP`/`# TYPE` lines carry the name as that exporter writes it, without the `_total`
prometheus_client's text format would add.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from denpex import __version__
from denpex.agent.metric_names import PREFIX, family_name, help_text, series_name, verbatim
from denpex.agent.pipeline import Pipeline
from denpex.agent.scheduler import CollectorState


@dataclass(frozen=True, slots=True)
class SelfMetric:
    """One sample of the agent's own state (delivery, spool): `name` without the prefix,
    a counter's ending in `_total`."""

    name: str
    help: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class AgentView:
    """Everything `/metrics` shows, read at scrape time."""

    host: str
    pipeline: Pipeline
    states: Callable[[], list[CollectorState]]
    unavailable: Callable[[], Mapping[str, str]]
    help_texts: Callable[[], Mapping[str, str]]
    extra: list[Callable[[], Iterable[SelfMetric]]] = field(default_factory=list)
    verbatim_counters: set[str] = field(default_factory=set)  # seen by the last collect()

    def collect(self) -> Iterator[Metric]:
        yield from self._collector_values()
        yield from self._self_metrics()

    def _collector_values(self) -> Iterator[Metric]:
        helps = self.help_texts()
        families: dict[str, Metric] = {}
        for (name, labels), value in sorted(self.pipeline.metric_values().items()):
            counter = value.type == "counter"
            base = family_name(name, counter=counter)
            family = families.get(base)
            if family is None:
                doc = help_text(name, value.source, helps)
                family = families[base] = Metric(base, doc, "counter" if counter else "gauge")
                if counter and verbatim(name):
                    self.verbatim_counters.add(base)
            family.add_sample(series_name(name, counter=counter), dict(labels), value.value)
        yield from families.values()

    def _self_metrics(self) -> Iterator[Metric]:
        info = Metric(PREFIX + "agent", "denpex agent build and host", "info")
        info.add_sample(PREFIX + "agent_info", {"version": __version__, "host": self.host}, 1)
        yield info
        jobs = _gauge("agent_watched_processes", "Job processes registered with this agent")
        jobs.add_sample(jobs.name, {}, self.pipeline.jobs.count())
        yield jobs

        states = self.states()
        up = _gauge("collector_up", "1 when the collector runs, 0 when unavailable here")
        stuck = _gauge("collector_stuck", "1 while a poll has overrun the collector's budget")
        degraded = _gauge(
            "collector_degraded", "1 while the collector cannot see its source (a stuck call)"
        )
        duration = _gauge("collector_poll_duration_seconds", "Duration of the last poll")
        success = _gauge("collector_last_poll_success", "1 when the last poll succeeded")
        polls = _counter("collector_polls", "Polls started")
        failures = _counter("collector_failures", "Polls that raised an error")
        overruns = _counter("collector_overruns", "Polls that took longer than the budget")
        events = _counter("collector_events", "Events and evidence produced")
        cpu = _counter("collector_cpu_seconds", "CPU time this agent spent in the polls")
        for state in states:
            labels = {"collector": state.name}
            up.add_sample(up.name, labels, 1)
            stuck.add_sample(stuck.name, labels, int(state.stuck))
            degraded.add_sample(degraded.name, labels, int(state.collector.degraded() is not None))
            duration.add_sample(duration.name, labels, state.last_duration_s)
            success.add_sample(success.name, labels, int(state.last_success))
            polls.add_sample(polls.name + "_total", labels, state.polls_total)
            failures.add_sample(failures.name + "_total", labels, state.failures_total)
            overruns.add_sample(overruns.name + "_total", labels, state.overruns_total)
            events.add_sample(events.name + "_total", labels, state.events_total)
            cpu.add_sample(cpu.name + "_total", labels, state.cpu_seconds_total)
        for name in sorted(self.unavailable()):
            up.add_sample(up.name, {"collector": name}, 0)
        yield from (up, stuck, degraded, duration, success, polls, failures, overruns, events, cpu)

        evidence = _counter("evidence", "Evidence found, by failure category and severity")
        for (category, severity), count in sorted(self.pipeline.stats.evidence_by_category.items()):
            evidence.add_sample(
                evidence.name + "_total", {"category": category, "severity": severity}, count
            )
        yield evidence
        lines = _counter("lines_scanned", "Log lines matched against the signature catalog")
        lines.add_sample(lines.name + "_total", {}, self.pipeline.stats.lines)
        yield lines

        families: dict[str, Metric] = {}
        for extra in self.extra:
            for sample in extra():
                counter = sample.name.endswith("_total")
                base = sample.name.removesuffix("_total")
                family = families.get(base)
                if family is None:
                    family = families[base] = (_counter if counter else _gauge)(base, sample.help)
                family.add_sample(
                    family.name + ("_total" if counter else ""), dict(sample.labels), sample.value
                )
        yield from families.values()


def _gauge(name: str, doc: str) -> Metric:
    return Metric(PREFIX + name, doc, "gauge")


def _counter(name: str, doc: str) -> Metric:
    return Metric(PREFIX + name, doc, "counter")


def render(view: AgentView) -> bytes:
    text = generate_latest(view)  # type: ignore[arg-type]
    for name in sorted(view.verbatim_counters):
        raw = name.encode()
        text = text.replace(b"# HELP " + raw + b"_total ", b"# HELP " + raw + b" ", 1)
        text = text.replace(
            b"# TYPE " + raw + b"_total counter\n", b"# TYPE " + raw + b" counter\n", 1
        )
    return text
