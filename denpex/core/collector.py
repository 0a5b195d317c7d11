"""The collector contract: what every collector (host, GPU, fabric) provides and is given.

A collector is polled by the agent's scheduler at its own interval, in its own thread, under
a time budget; it must never block longer than one poll needs (open sources non-blocking, or
read a bounded amount) and never raise for an expected condition: a missing file is an
empty result, an unavailable source says why in `available()`.
"""

from __future__ import annotations

import os
import select
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, ClassVar, TypeVar

import yaml

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence, metric
from denpex.core.roots import Roots
from denpex.core.wire import Registration

STABILITIES = ("stable", "experimental")
DRAIN_WAIT_S = 5.0  # an FdWatch waits this long for a read before it polls the fd again

Observation = Event | Evidence
K = TypeVar("K", bound=Hashable)


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
        self._wake: Callable[[], None] | None = None
        self._fd_watch: FdWatch | None = None
        self.edges = EdgeTrigger()  # what this collector already reported
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

    def finding(
        self, ctx: CollectContext, detector_id: str, *, source: str | None = None, **details: Any
    ) -> Evidence:
        """Detector evidence of this poll (see poll_finding), from this collector's source."""
        return poll_finding(ctx, source or self.name, detector_id, **details)

    def set_waker(self, wake: Callable[[], None]) -> None:
        """The scheduler's way to be asked for a poll now, not at the next interval."""
        self._wake = wake

    def wake_when_readable(self, fd: int) -> None:
        """Ask for a poll whenever `fd` has data: an event source (the kernel log, a pipe)
        is then read within milliseconds while the agent sleeps between events, instead of
        waking several times a second to find nothing. Call `drained()` after reading."""
        if self._fd_watch is not None:
            self._fd_watch.stop()
        self._fd_watch = None
        if self._wake is not None:
            self._fd_watch = FdWatch(fd, self._wake, name=f"{self.name}-fd")

    def drained(self) -> None:
        if self._fd_watch is not None:
            self._fd_watch.drained.set()

    def stop_watching(self) -> None:
        if self._fd_watch is not None:
            self._fd_watch.stop()
            self._fd_watch = None

    def checkpoint(self) -> object | None:
        """The source position the last poll reached (a sequence number, a cursor), or None
        for a source without one. The agent hands it back to `commit` once that poll's
        records are durably queued; until then the saved position stays where it was, so a
        crash in between reads them again instead of losing them."""
        return None

    def commit(self, checkpoint: object) -> None:
        """Persist `checkpoint` (from `checkpoint()`): every record up to it is safe. Called
        in poll order, possibly from another thread; never raises for an unwritable file."""
        return None  # a source without a position has nothing to persist

    def host_facts(self) -> Mapping[str, str]:
        """What this collector's source says of the host's shared dependencies (the GPU
        driver and firmware versions …), as the agent's `host_info` labels; empty when it
        knows none. Read from the last poll: never calls the source."""
        return {}

    def host_links(self) -> list[tuple[str, Mapping[str, str]]]:
        """Where this host's devices sit in the fabric, one (kind, labels) row each: a GPU's
        rail and NIC port ("rail": gpu, nic, rail) from the NCCL topology, the switch port a
        port is cabled to ("port": port, switch, …) from the neighbour tools. The agent sends
        them as its `host_rail` / `host_port_peer` series. Read from the last poll."""
        return []

    def degraded(self) -> str | None:
        """Why the collector cannot currently see its source although its polls return (a
        library call stuck past its deadline); None when it sees. `/healthz` turns unhealthy
        while this says something: an exporter must not stay green while blind."""
        return None

    def close(self) -> None:
        """Release files, subprocesses or kernel objects; the collector is not polled again."""
        self.stop_watching()


class EdgeTrigger:
    """What a collector has already said, so a lasting condition (a threshold crossed, a
    port down, a path missing) is reported once when it starts and again only after it
    stopped. Keys are any hashable naming the condition and its subject: (path, "memory")."""

    def __init__(self) -> None:
        self._holding: set[Hashable] = set()

    def rising(self, key: Hashable, condition: bool) -> bool:
        """True once when `condition` starts holding for `key`; re-armed when it stops."""
        if not condition:
            self._holding.discard(key)
            return False
        if key in self._holding:
            return False
        self._holding.add(key)
        return True

    def first(self, key: Hashable) -> bool:
        """True the first time `key` is seen (a note said once), until `clear(key)`."""
        return self.rising(key, True)

    def clear(self, key: Hashable) -> None:
        self._holding.discard(key)

    def holding(self, group: str, keys: Iterable[K]) -> set[K]:
        """`keys` are every condition of `group` that holds now (the group's others have
        stopped): those that did not hold at the last call, i.e. the ones to report."""
        now = {(group, key) for key in keys}
        new = now - self._holding
        self._holding = {k for k in self._holding if _group_of(k) != group} | now
        return {key for _, key in new}

    def retain(self, keep: Callable[[Any], bool]) -> None:
        """Forget conditions whose subject has gone (a process that exited)."""
        self._holding = {k for k in self._holding if keep(k)}


def _group_of(key: Hashable) -> Hashable:
    return key[0] if isinstance(key, tuple) and key else None


class FdWatch:
    """A thread blocked in poll(2) on one descriptor that calls `wake` when it is readable,
    then waits until the collector has read (`drained`) so unread data never spins it.
    POLLERR counts as readable (the kernel log reports overwritten records that way); the
    thread ends when the descriptor is closed or hung up, or on `stop()`."""

    def __init__(self, fd: int, wake: Callable[[], None], *, name: str) -> None:
        self.fd = fd
        self.wake = wake
        self.drained = threading.Event()
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLPRI)
        poller.register(self._stop_read, select.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_read in ready or ready.get(self.fd, 0) & select.POLLNVAL:
                    return
                self.drained.clear()
                self.wake()
                if ready.get(self.fd, 0) & select.POLLHUP:
                    return  # the writer is gone: one last poll reads what it left
                self.drained.wait(DRAIN_WAIT_S)
        except OSError:
            return
        finally:
            os.close(self._stop_read)

    def stop(self) -> None:
        if self._stop_write < 0:
            return
        try:
            os.write(self._stop_write, b"x")
        except OSError:
            pass
        os.close(self._stop_write)
        self._stop_write = -1


def poll_finding(
    ctx: CollectContext,
    source: str,
    detector_id: str,
    *,
    captures: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
    attrs: dict[str, Any] | None = None,
    kind: str = "state",
    ts_ns: int | None = None,
    pid: int | None = None,
    severity: str | None = None,
    action: str | None = None,
) -> Evidence:
    """Detector evidence of a poll of `source` (see `detector_evidence`): an event whose body
    is the rendered summary, at the poll's time unless the source said when (`ts_ns`)."""
    event = Event(
        body="",
        ts_ns=ts_ns or ctx.now_ns,
        host=ctx.host,
        source=source,
        kind=kind,
        pid=pid,
        attrs=attrs or {},
    )
    evidence = detector_evidence(
        event, detector_id, captures=captures, values=values, severity=severity, action=action
    )
    event.body = evidence.summary
    return evidence


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
