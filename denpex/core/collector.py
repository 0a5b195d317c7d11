"""The collector contract: what every collector (host, GPU, fabric) provides and is given.

A collector is polled by the agent's scheduler at its own interval, in its own thread, under
a time budget; it must never block longer than one poll needs (open sources non-blocking, or
read a bounded amount) and never raise for an expected condition: a missing file is an
empty result, an unavailable source says why in `available()`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar

import yaml

from denpex.core.events import Event, Evidence, metric
from denpex.core.roots import Roots
from denpex.core.wire import Registration

STABILITIES = ("stable", "experimental")

Observation = Event | Evidence


@dataclass(slots=True)
class CollectContext:
    """What one poll is given: where to read, which host this is, the watched job
    processes (as registered with the agent), and the time the poll started."""

    roots: Roots
    host: str
    jobs: Sequence[Registration] = ()
    now_ns: int = field(default_factory=time.time_ns)


class Collector(ABC):
    """One source. Subclasses set the class attributes and implement `available` and
    `collect`; `options` are the collector's section of the agent config, overriding the
    defaults in its package's settings file (`denpex/host/thresholds.yaml` …)."""

    name: ClassVar[str]
    stability: ClassVar[str] = "experimental"
    default_interval_s: ClassVar[float] = 10.0
    default_budget_s: ClassVar[float] = 2.0
    # HELP text per metric name this collector emits (Prometheus `# HELP`, OTLP description)
    metrics_help: ClassVar[Mapping[str, str]] = {}

    # "package:file.yaml" holding this collector's default settings under its name
    settings_file: ClassVar[str | None] = None

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        self.roots = roots
        defaults = settings(self.settings_file, self.name) if self.settings_file else {}
        self.options: dict[str, Any] = {**defaults, **(options or {})}

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """(True, what it reads) or (False, why not and what would enable it)."""

    @abstractmethod
    def collect(self, ctx: CollectContext) -> list[Observation]:
        """One poll: the events (and detector evidence, with `id=""`) seen since the last."""

    def metric_event(
        self,
        ctx: CollectContext,
        name: str,
        value: float,
        labels: dict[str, str] | None = None,
        counter: bool = False,
    ) -> Event:
        """A metric of this collector (source: its name), stamped with the poll's host and time."""
        return metric(
            name,
            value,
            source=self.name,
            counter=counter,
            labels=labels,
            host=ctx.host,
            ts_ns=ctx.now_ns,
        )

    def degraded(self) -> str | None:
        """Why the collector cannot currently see its source although its polls return (a
        library call stuck past its deadline); None when it sees. `/healthz` turns unhealthy
        while this says something: an exporter must not stay green while blind."""
        return None

    def close(self) -> None:  # noqa: B027 - most collectors hold nothing to release
        """Release files, subprocesses or kernel objects; the collector is not polled again."""


def detector_evidence(
    event: Event,
    *,
    signature: str,
    category: str,
    severity: str,
    summary: str,
    action: str = "none",
    captures: dict[str, str] | None = None,
) -> Evidence:
    """Evidence from a detector (a threshold or a counter, not a log line); the agent gives
    it its id. `signature` names the detector like a catalog id: `host.<category>.<what>`."""
    return Evidence(
        id="",
        event=event,
        signature=signature,
        category=category,
        severity=severity,
        captures=captures or {},
        summary=summary,
        action=action,
    )


@cache
def _settings_file(resource: str) -> dict[str, dict[str, Any]]:
    package, _, filename = resource.partition(":")
    data = yaml.safe_load(resources.files(package).joinpath(filename).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{resource} must be a mapping of collector name → settings")
    return data


def settings(resource: str, collector: str) -> dict[str, Any]:
    """The default settings and detector thresholds of one collector (a copy), from the
    settings file `resource` ("package:file.yaml")."""
    return dict(_settings_file(resource).get(collector) or {})
