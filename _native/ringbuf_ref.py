"""Reference ingest ring buffer (pure-Python twin of `denpex._native.ringbuf`).

Fixed capacity between a producer (the wrapper's reader) and the analysis thread. A write never
blocks and never fails: when the ring is full the *oldest* buffered bytes are dropped and counted.
"""

from __future__ import annotations

import threading

from denpex._native import load

_TERMINATORS = b"\n\r"


def _frame(ring, data: bytes, gap: bool, mid_line: bool) -> list[bytes]:
    """Lines of `data` for `ring` (shared by the native module): resynchronise after a drop."""
    if gap:
        ring._splitter.reset()
        ring._resyncing = mid_line
    if ring._resyncing:
        ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
        if not ends:
            ring._resync_dropped += len(data)
            return []
        cut = min(ends) + 1
        ring._resync_dropped += cut
        data = data[cut:]
        ring._resyncing = False
    return ring._splitter.feed(data)


class RingBuffer:
    """A byte FIFO of `capacity` bytes that drops its oldest bytes on overflow, plus lines."""

    def __init__(self, capacity: int = 1 << 22, line_cap: int = 65536) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1 byte")
        self.capacity = capacity
        self.overflows = 0  # writes that dropped something
        self._overflow_dropped = 0
        self._resync_dropped = 0
        self._data = bytearray()
        self._lock = threading.Lock()
        self._gap = False  # bytes were dropped since the last read
        self._gap_mid_line = False  # ... and the last dropped byte was not a line end
        self._resyncing = False  # skipping the rest of a line cut by a drop
        self._splitter = load("linesplit").LineSplitter(line_cap)

    @property
    def dropped_bytes(self) -> int:
        """Bytes lost to overflow, plus the rest of each line a drop cut."""
        return self._overflow_dropped + self._resync_dropped

    @property
    def used(self) -> int:
        return len(self._data)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append `data` (all of it, always, dropping the oldest bytes); returns its length."""
        data = bytes(data)
        size = len(data)
        with self._lock:
            excess = len(self._data) + size - self.capacity
            if excess > 0:
                from_old = min(excess, len(self._data))
                from_new = excess - from_old
                last = data[from_new - 1] if from_new else self._data[from_old - 1]
                del self._data[:from_old]
                data = data[from_new:]
                self._overflow_dropped += excess
                self.overflows += 1
                self._gap = True
                self._gap_mid_line = last not in _TERMINATORS
            self._data += data
        return size

    def read(self, max_bytes: int = -1) -> bytes:
        """Take up to `max_bytes` (all if negative) of the oldest buffered bytes."""
        return self._read(max_bytes)[0]

    def _read(self, max_bytes: int = -1) -> tuple[bytes, bool, bool]:
        """(bytes, a drop happened before them, it ended inside a line), atomically."""
        with self._lock:
            n = len(self._data) if max_bytes < 0 else min(max_bytes, len(self._data))
            out = bytes(self._data[:n])
            del self._data[:n]
            gap, mid = self._gap, self._gap_mid_line
            self._gap = self._gap_mid_line = False
            return out, gap, mid

    def read_lines(self) -> list[bytes]:
        """The complete lines buffered so far (framed as `linesplit` does, across wrap-around).

        After a drop, the partial line before it and the fragment after it are discarded and
        counted in `dropped_bytes`, so no line returned is ever spliced from two places."""
        data, gap, mid_line = self._read()
        return _frame(self, data, gap, mid_line)

    def flush(self) -> list[bytes]:
        """Everything left, the unterminated last line included (at end of input)."""
        lines = self.read_lines()
        return lines + self._splitter.flush()

    @property
    def truncated_bytes(self) -> int:
        return self._splitter.truncated_bytes
