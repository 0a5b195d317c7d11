"""Evidence on its way into the disk spool, and the acknowledgements owed to the collectors
whose polls produced it: a source's position (the kernel-log sequence number, the journal
cursor) moves only once its records are durably queued (DESIGN §8), as Vector's and Fluent
Bit's acknowledgements do.

Acknowledgements are released in poll order, once every piece of evidence of that poll and
of every earlier one is in the spool. While the spool cannot write (a full disk) evidence
waits here, bounded; beyond the bound the oldest is dropped and counted, never silently.
Positions stay where they were meanwhile, so an agent killed then reads those records again
(duplicates, deduplicated by event id downstream, never loss). Never raises to a collector.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from denpex.core.events import Evidence

Ack = Callable[[], None]
Write = Callable[[list[Evidence]], None]
MAX_WAITING = 10_000  # pieces of evidence held in memory while the spool cannot write


@dataclass(slots=True)
class _Poll:
    evidence: list[Evidence]
    acks: list[Ack] = field(default_factory=list)


class Handoff:
    """Thread-safe: every collector's thread submits its polls here."""

    def __init__(self, write: Write | None = None, *, max_waiting: int = MAX_WAITING) -> None:
        self.write = write  # None: no durable sink; a poll is safe once the pipeline took it
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._waiting: deque[_Poll] = deque()
        self._waiting_records = 0
        self._errors = 0
        self._dropped = 0
        self._ack_errors = 0
        self._failing_since_ns: int | None = None
        self._last_error = ""

    def submit(self, evidence: list[Evidence], ack: Ack | None = None) -> bool:
        """Queue one poll's evidence and the acknowledgement its collector waits for; returns
        whether everything up to it is now in the spool (its ack then ran)."""
        with self._lock:
            if self._waiting or evidence or ack is not None:
                self._waiting.append(_Poll(list(evidence), [ack] if ack else []))
                self._waiting_records += len(evidence)
            self._flush_locked()
            self._bound_locked()
            return not self._waiting

    def flush(self) -> bool:
        """Try again to write what waits (space may have returned); True when nothing does."""
        with self._lock:
            self._flush_locked()
            return not self._waiting

    def _flush_locked(self) -> None:
        while self._waiting:
            poll = self._waiting[0]
            if poll.evidence and self.write is not None:
                try:
                    self.write(poll.evidence)
                except Exception as exc:  # the spool says why; the poll waits for the next try
                    self._errors += 1
                    self._last_error = str(exc)
                    if self._failing_since_ns is None:
                        self._failing_since_ns = time.time_ns()
                    return
            self._waiting.popleft()
            self._waiting_records -= len(poll.evidence)
            self._failing_since_ns, self._last_error = None, ""
            self._release(poll.acks)

    def _bound_locked(self) -> None:
        """Over the bound, the oldest evidence goes (counted); its poll's position may then
        move on, or no position would ever move again while the disk stays full."""
        while self._waiting_records > self.max_waiting and len(self._waiting) > 1:
            poll = self._waiting.popleft()
            self._waiting_records -= len(poll.evidence)
            self._dropped += len(poll.evidence)
            self._release(poll.acks)

    def _release(self, acks: list[Ack]) -> None:
        for ack in acks:
            try:
                ack()
            except Exception:  # a state file that cannot be written costs resumption only
                self._ack_errors += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "writable": self._failing_since_ns is None,
                "failing_since_ns": self._failing_since_ns,
                "last_error": self._last_error or None,
                "waiting_records": self._waiting_records,
                "waiting_polls": len(self._waiting),
                "errors_total": self._errors,
                "dropped_total": self._dropped,
                "ack_errors_total": self._ack_errors,
            }
