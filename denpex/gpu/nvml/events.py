"""The NVML event thread: waits on an NVML event set (Xid critical errors, ECC events, GPU
recovery actions) with a timeout and hands every event to the Xid tracker, so no Xid is lost
between polls; a recovery-action event asks the collector for a poll at once.

A GPU that supports only some event types refuses a mask with the others (NVML registers
none of them then): registration falls back to the types the GPU lists, then to Xids alone.
Runs on its own daemon thread; never blocks a poll. If `nvmlEventSetWait` itself stops
returning, `hung_for()` says so and the collector reports itself degraded.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from denpex.gpu.nvml.xid import XidTracker

XID_EVENT = 0x8
DBE_EVENT = 0x2
SBE_EVENT = 0x1
RECOVERY_ACTION_EVENT = 0x8000  # nvmlEventTypeGpuRecoveryAction; eventData is 0, read the field
WANTED = XID_EVENT | DBE_EVENT | SBE_EVENT | RECOVERY_ACTION_EVENT
# a double-bit ECC event is what the driver also logs as Xid 48: count it under that code
DBE_AS_XID = 48


def handle_address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class EventWatcher:
    """Owns one event set; `register` adds a GPU (call it from a BoundedCaller worker)."""

    def __init__(
        self,
        nvml: ModuleType,
        tracker: XidTracker,
        wait_ms: int,
        on_recovery_action: Callable[[int], None] | None = None,
    ) -> None:
        self.nvml = nvml
        self.tracker = tracker
        self.wait_ms = wait_ms
        self.on_recovery_action = on_recovery_action
        self.event_set = nvml.nvmlEventSetCreate()
        self.gpus: dict[int, int] = {}  # handle address → GPU index
        self.masks: dict[int, int] = {}  # GPU index → the event types registered
        self.sbe_events: dict[int, int] = {}
        self.errors: dict[int, str] = {}
        self.drained = threading.Event()  # set once a wait found nothing left to deliver
        self._waiting_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, index: int, handle: Any) -> None:
        """Register the wanted types the GPU takes: all of them, else those it lists as
        supported, else Xids alone (they matter most)."""
        nvml = self.nvml
        tried: list[int] = [WANTED]
        try:
            supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            tried.append(WANTED & supported)
        except nvml.NVMLError:
            pass
        tried.append(XID_EVENT)
        error = ""
        for mask in dict.fromkeys(m for m in tried if m):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, mask, self.event_set)
            except nvml.NVMLError as exc:
                error = f"nvmlDeviceRegisterEvents(0x{mask:x}): {exc}"
                continue
            self.masks[index] = mask
            self.gpus[handle_address(handle)] = index
            return
        self.errors[index] = error or "the GPU supports none of the wanted event types"

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
        elif data.eventType & RECOVERY_ACTION_EVENT and self.on_recovery_action is not None:
            self.on_recovery_action(index)
