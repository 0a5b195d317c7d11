"""Calls into libraries that can hang (NVML, DCGM, a wedged driver) under a deadline.

Python cannot interrupt a thread stuck in C, so the call runs on a worker thread; when it
overruns, the caller gets `DeadlineExceeded` at once, the worker is left to finish, and every
later call fails fast until it has: one hung call blinds the source, it never blocks the
agent. Never raises anything but the call's own exception or DeadlineExceeded.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The call did not return in time, or an earlier call is still stuck."""


class BoundedCaller:
    """One worker thread running calls in order; `hung_for()` says how long a call has been
    stuck (0 when none is)."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.overruns = 0
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue]] = (
            queue.SimpleQueue()
        )
        self._busy_since: float | None = None
        self._stuck_call = ""
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None  # started by the first call

    def hung_for(self) -> float:
        with self._lock:
            if self._busy_since is None:
                return 0.0
            elapsed = time.monotonic() - self._busy_since
            return elapsed if elapsed > self.timeout_s else 0.0

    @property
    def stuck_call(self) -> str:
        return self._stuck_call if self.hung_for() else ""

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        stuck = self.hung_for()
        if stuck:
            raise DeadlineExceeded(
                f"{self.name}: {self._stuck_call} has not returned for {stuck:.0f} s"
            )
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._serve, name=f"bounded-{self.name}", daemon=True
                )
                self._worker.start()
        reply: queue.SimpleQueue = queue.SimpleQueue()
        label = getattr(fn, "__name__", repr(fn))
        self._jobs.put((lambda: fn(*args), reply))
        try:
            ok, value = reply.get(timeout=timeout_s or self.timeout_s)
        except queue.Empty:
            self.overruns += 1
            self._stuck_call = label
            raise DeadlineExceeded(
                f"{self.name}: {label} did not return within {timeout_s or self.timeout_s:g} s"
            ) from None
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            job, reply = self._jobs.get()
            with self._lock:
                self._busy_since = time.monotonic()
            try:
                result = (True, job())
            except BaseException as exc:  # handed to the caller, who decides
                result = (False, exc)
            with self._lock:
                self._busy_since = None
            reply.put(result)
