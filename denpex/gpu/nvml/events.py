"""The NVML event thread: waits on an NVML event set (Xid critical errors, ECC events) with a
timeout and hands every event to the Xid tracker, so no Xid is lost between polls.

Runs on its own daemon thread; never blocks a poll. If `nvmlEventSetWait` itself stops
returning, `hung_for()` says so and the collector reports itself degraded.
"""

from __future__ import annotations

import ctypes
import threading
import time
from types import ModuleType
from typing import Any

from denpex.gpu.nvml.xid import XidTracker

XID_EVENT = 0x8
DBE_EVENT = 0x2
SBE_EVENT = 0x1
# a double-bit ECC event is what the driver also logs as Xid 48: count it under that code
DBE_AS_XID = 48


def handle_address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class EventWatcher:
    """Owns one event set; `register` adds a GPU (call it from a BoundedCaller worker)."""

    def __init__(self, nvml: ModuleType, tracker: XidTracker, wait_ms: int) -> None:
        self.nvml = nvml
        self.tracker = tracker
        self.wait_ms = wait_ms
        self.event_set = nvml.nvmlEventSetCreate()
        self.gpus: dict[int, int] = {}  # handle address → GPU index
        self.sbe_events: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        self.drained = threading.Event()  # set once a wait found nothing left to deliver
        self._waiting_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, index: int, handle: Any) -> None:
        nvml = self.nvml
        wanted = XID_EVENT | DBE_EVENT | SBE_EVENT
        try:
            nvml.nvmlDeviceRegisterEvents(handle, wanted, self.event_set)
        except nvml.NVMLError:
            try:  # some GPUs support only a subset: Xids matter most
                nvml.nvmlDeviceRegisterEvents(handle, XID_EVENT, self.event_set)
            except nvml.NVMLError as exc:
                self.errors[index] = f"nvmlDeviceRegisterEvents: {exc}"
                return
        self.gpus[handle_address(handle)] = index

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def hung_for(self) -> float:
        """Seconds `nvmlEventSetWait` has overrun its own timeout by more than a second."""
        since = self._waiting_since
        if since is None:
            return 0.0
        elapsed = time.monotonic() - since
        return elapsed if elapsed > self.wait_ms / 1000 + 1.0 else 0.0

    def _run(self) -> None:
        nvml = self.nvml
        while not self._stop.is_set():
            if not self.gpus:
                self.drained.set()
                self._stop.wait(self.wait_ms / 1000)
                continue
            self._waiting_since = time.monotonic()
            try:
                data = nvml.nvmlEventSetWait(self.event_set, self.wait_ms)
            except nvml.NVMLError as exc:
                self._waiting_since = None
                if int(exc.value) != nvml.NVML_ERROR_TIMEOUT:
                    self.errors[-1] = f"nvmlEventSetWait: {exc}"
                    self._stop.wait(self.wait_ms / 1000)  # never spin on a failing set
                self.drained.set()
                continue
            self._waiting_since = None
            self._deliver(data)

    def _deliver(self, data: Any) -> None:
        index = self.gpus.get(handle_address(data.device))
        if index is None:
            return
        now = time.time_ns()
        if data.eventType & XID_EVENT:
            self.tracker.record(str(index), int(data.eventData), now)
        elif data.eventType & DBE_EVENT:
            self.tracker.record(str(index), DBE_AS_XID, now)
        elif data.eventType & SBE_EVENT:
            self.sbe_events[index] = self.sbe_events.get(index, 0) + 1
