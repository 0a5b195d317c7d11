"""Runs every collector at its own interval in its own thread, under its own time budget.

A collector that overruns its budget is reported stuck (an event, a metric, and `/healthz`
turns unhealthy) while the others keep their schedule: one hung source never delays
another. Python cannot kill a thread, so a stuck poll is left to finish; it is not started
again until it has.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from denpex.core.collector import CollectContext, Collector, Observation
from denpex.core.events import Event

ContextFactory = Callable[[], CollectContext]
# (state, what one poll found, the commit of the position it reached, run once it is safe)
ResultSink = Callable[["CollectorState", list[Observation], Callable[[], None] | None], None]


@dataclass(slots=True)
class CollectorState:
    """What the agent knows about one collector, exported as its self-metrics."""

    collector: Collector
    interval_s: float
    budget_s: float
    polls_total: int = 0
    failures_total: int = 0
    consecutive_failures: int = 0
    overruns_total: int = 0
    events_total: int = 0
    last_duration_s: float = 0.0
    cpu_seconds_total: float = 0.0  # CPU the polls cost this agent (thread time)
    last_success: bool = True
    last_error: str = ""
    running_since: float | None = None  # monotonic start of the poll in flight
    stuck: bool = False
    wake: threading.Event = field(default_factory=threading.Event)  # poll now, not at the due time
    delivered_total: int = 0  # polls whose results the sink has taken
    commits_total: int = 0  # positions committed after their records were durable

    @property
    def name(self) -> str:
        return self.collector.name


class Scheduler:
    """Starts one worker thread per collector and a watchdog over their budgets."""

    def __init__(
        self,
        states: list[CollectorState],
        context: ContextFactory,
        sink: ResultSink,
    ) -> None:
        self.states = states
        self.context = context
        self.sink = sink
        self._stop = threading.Event()
        self._poll_started = threading.Event()  # wakes the watchdog: a new budget runs
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        for state in self.states:
            state.collector.set_waker(state.wake.set)
            thread = threading.Thread(
                target=self._worker, args=(state,), name=f"collector-{state.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        watchdog = threading.Thread(target=self._watchdog, name="collector-watchdog", daemon=True)
        watchdog.start()
        self._threads.append(watchdog)

    def stop(self, timeout_s: float = 5.0) -> list[str]:
        """Stop polling; returns the collectors whose poll did not end within the timeout."""
        self._stop.set()
        self._poll_started.set()
        for state in self.states:
            state.wake.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [s.name for s in self.states if s.running_since is not None]

    def refresh(self, timeout_s: float) -> list[str]:
        """Poll every collector now and wait (at most `timeout_s`) until each has finished a
        poll that started after this call: what a caller reads next is current. Returns the
        collectors that did not make it (stuck, or slower than the timeout)."""
        with self._lock:
            wanted = {
                s.name: s.delivered_total + (2 if s.running_since is not None else 1)
                for s in self.states
                if not s.stuck
            }
        for state in self.states:
            if state.name in wanted:
                state.wake.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                late = [s.name for s in self.states if s.delivered_total < wanted.get(s.name, 0)]
            if not late:
                return []
            time.sleep(0.01)
        return late

    def poll_once(self, state: CollectorState) -> list[Observation]:
        """One poll of one collector, with its bookkeeping; never raises."""
        started = time.monotonic()
        cpu_started = time.thread_time()
        with self._lock:
            state.running_since = started
        self._poll_started.set()
        try:
            found = state.collector.collect(self.context())
            error = ""
        except Exception as exc:  # a collector bug must not kill its thread
            found = []
            error = f"{type(exc).__name__}: {exc}"
        duration = time.monotonic() - started
        cpu = time.thread_time() - cpu_started
        recovered = False
        with self._lock:
            state.cpu_seconds_total += cpu
            state.running_since = None
            state.polls_total += 1
            state.last_duration_s = duration
            state.last_success = not error
            state.last_error = error
            state.events_total += len(found)
            if error:
                state.failures_total += 1
                state.consecutive_failures += 1
            else:
                state.consecutive_failures = 0
            if duration > state.budget_s:
                state.overruns_total += 1
            if state.stuck:
                state.stuck, recovered = False, True
        if recovered:
            found.append(
                self._agent_event(
                    state, f"collector {state.name} recovered after {duration:.1f} s", "recovered"
                )
            )
        return found

    def _worker(self, state: CollectorState) -> None:
        next_due = time.monotonic()
        while not self._stop.is_set():
            found = self.poll_once(state)
            checkpoint = state.collector.checkpoint()
            ack = None if checkpoint is None else functools.partial(_commit, state, checkpoint)
            if found or ack is not None:
                self.sink(state, found, ack)
            with self._lock:
                state.delivered_total += 1
            # keep the cadence; a poll that overran skips the slots it missed
            next_due += state.interval_s
            now = time.monotonic()
            if next_due < now:
                next_due = now + state.interval_s
            state.wake.wait(next_due - now)
            if state.wake.is_set():
                state.wake.clear()
                next_due = time.monotonic()

    def _watchdog(self) -> None:
        """Sleeps until the earliest budget of a poll in flight runs out (or a poll starts);
        with nothing running it does not wake at all."""
        while not self._stop.is_set():
            now = time.monotonic()
            newly_stuck = []
            deadlines = []
            with self._lock:
                for state in self.states:
                    started = state.running_since
                    if started is None or state.stuck:
                        continue
                    if now - started > state.budget_s:
                        state.stuck = True
                        newly_stuck.append(state)
                    else:
                        deadlines.append(started + state.budget_s)
                self._poll_started.clear()
            timeout = max(0.0, min(deadlines) - now) + 0.01 if deadlines else None
            if not newly_stuck:
                self._poll_started.wait(timeout)
            for state in newly_stuck:
                message = (
                    f"collector {state.name} is stuck: its poll has run longer than its "
                    f"{state.budget_s:g} s budget; its data is stale until it returns"
                )
                self.sink(state, [self._agent_event(state, message, "stuck")], None)

    @staticmethod
    def _agent_event(state: CollectorState, message: str, status: str) -> Event:
        return Event(
            body=message,
            ts_ns=time.time_ns(),
            source="agent",
            kind="state",
            attrs={"collector": state.name, "status": status},
        )


def _commit(state: CollectorState, checkpoint: object) -> None:
    state.collector.commit(checkpoint)
    state.commits_total += 1
