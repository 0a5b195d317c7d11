"""The collector contract: what every host collector provides and what it is given.

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

from denpex.core.events import Event, Evidence
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
    `collect`; `options` are the collector's section of the agent config (thresholds and
    settings overriding the defaults in `thresholds.yaml`)."""

    name: ClassVar[str]
    stability: ClassVar[str] = "experimental"
    default_interval_s: ClassVar[float] = 10.0
    default_budget_s: ClassVar[float] = 2.0
    # HELP text per metric name this collector emits (Prometheus `# HELP`, OTLP description)
    metrics_help: ClassVar[Mapping[str, str]] = {}

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        self.roots = roots
        self.options: dict[str, Any] = {**thresholds(self.name), **(options or {})}

    @abstractmethod
    def available(self) -> tuple[bool, str]:
        """(True, what it reads) or (False, why not and what would enable it)."""

    @abstractmethod
    def collect(self, ctx: CollectContext) -> list[Observation]:
        """One poll: the events (and detector evidence, with `id=""`) seen since the last."""

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
def _all_thresholds() -> dict[str, dict[str, Any]]:
    text = resources.files("denpex.host").joinpath("thresholds.yaml").read_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError("denpex/host/thresholds.yaml must be a mapping of collector → settings")
    return data


def thresholds(collector: str) -> dict[str, Any]:
    """The default settings and detector thresholds of one collector (a copy)."""
    return dict(_all_thresholds().get(collector) or {})
