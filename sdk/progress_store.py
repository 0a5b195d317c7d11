"""The progress monitor's way to the torch.distributed Store: its own client connection, and
every call made on a daemon thread with a deadline.

It never lets a Store call block the caller: a TCPStore client can wait for ever on a server
that is stopped (SIGSTOP), whatever timeout it was given.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("denpex.sdk.progress")


def open_store(store: Any, timeout_s: float) -> Any:
    """Our own client of the Store (so a slow call times out quickly and never shares a
    connection with the process group), or None without torch.distributed."""
    if store is None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            store = _get_default_store()
        except Exception as exc:
            log.debug("progress: no default store: %s", exc)
            return None
    try:
        from datetime import timedelta

        store = store.clone()
        store.set_timeout(timedelta(seconds=timeout_s))
    except Exception as exc:  # a user store without clone(): use it as given
        log.debug("progress: store not cloned: %s", exc)
    return store


class StoreStuck(TimeoutError):
    """A Store call did not return in time (its host may be stopped)."""


class StoreLink:
    """Runs Store calls on a daemon thread of its own: a TCPStore client can block for ever on
    a server that is stopped (SIGSTOP), whatever its timeout, and the watchdog must go on."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._go = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._job: Callable[[Any], Any] | None = None
        self._result: tuple[Any, BaseException | None] = (None, None)
        self._stopping = False
        threading.Thread(target=self._serve, name="denpex-progress-store", daemon=True).start()

    def call(self, job: Callable[[Any], Any], timeout: float) -> Any:
        if not self._done.wait(timeout):  # the previous call is still stuck
            raise StoreStuck("the previous Store call has not returned")
        self._job = job
        self._done.clear()
        self._go.set()
        if not self._done.wait(timeout):
            raise StoreStuck(f"no answer from the Store within {timeout:.1f} s")
        value, error = self._result
        if error is not None:
            raise error
        return value

    def stop(self) -> None:
        self._stopping = True
        self._go.set()

    def _serve(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._stopping:
                return
            job = self._job
            try:
                self._result = (job(self._store) if job else None, None)
            except Exception as exc:
                self._result = (None, exc)
            self._done.set()
