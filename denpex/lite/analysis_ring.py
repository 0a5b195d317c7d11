"""The analysis ring: a bounded single-producer/single-consumer byte ring in shared memory,
from the relay to the forked analyzer.

The relay (producer) must never block, wait or slow down on this ring: when it lacks space a
chunk is dropped from *analysis* (counted, flagged as a gap), never from the job's output.

Why hand-written: analysis is pure-Python, CPU-bound and holds the GIL, so it runs in its own
process; the standard library and PyPI offer no single-producer/single-consumer byte ring that
works across fork() for Python (multiprocessing queues pickle, lock and can block the writer).

Layout of the MAP_SHARED mapping (created before fork), native 8-byte aligned words:
  producer line: write_pos, produced, dropped_bytes, dropped_chunks, producer_done, producer_waiting
  consumer line: read_pos, consumer_sleeping;   then the data area (capacity, a multiple of 16).
Positions are monotonic byte counters. A record is [u32 length][u8 stream][u8 flags][2 pad]
[i64 arrival, ns since the epoch][payload padded to 16]; bit 0 of flags means analysis data
was dropped just before it; the arrival is when the relay read the chunk, so a lagging
analyzer still times each line by when the job printed it. A record
may wrap: its payload continues at the start of the data area (never its header: records
start at multiples of 16, the header's size). The producer writes the record,
then publishes write_pos; the consumer reads write_pos, copies the payload out, then publishes
read_pos. Each position is stored with one aligned 8-byte store (x86-64 keeps store order; on a
weakly ordered CPU the worst case is a garbled *analysis* chunk: lengths are validated).
Wake-ups: one byte on a non-blocking pipe when the other side says it sleeps; sleepers use a
timeout of at most 100 ms, which also covers a lost wake-up.

The spill: when the ring is full (the analyzer still loading its catalog, or slower than a
job printing hundreds of MB/s), chunks go to an unlinked temporary file instead of being
dropped, in the same record format, and every later chunk follows them there until the
analyzer has read the file up to where the relay wrote it; the analyzer reads the ring
first, then the file, so the order of the output is kept. Only past the spill's budget
(SPILL_BYTES waiting on disk at once) is analysis data dropped. Once the analyzer has read all
the file holds, the next spill starts it again from its beginning and gives its blocks back,
so a long run that lags now and then never uses the budget up. The relay writes the file with
one pwrite per chunk (page cache), never waits for it; spill_w (producer line) and spill_r
(consumer line) are positions in it: the byte offset in the low 40 bits, above them the
file's epoch (how many times it started again), so each is still one 8-byte store and a
consumer whose position is of an older epoch knows it has to start from the beginning.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import struct
import tempfile
import time
from collections.abc import Callable, Sequence

GAP = 1  # record flag: analysis data was dropped just before this record
TAIL_BYTES = 64 << 10  # per stream: newest dropped bytes handed to analysis after the run
SPILL_BYTES = 2 << 30  # the most output waiting on disk at once for a lagging analyzer
_SPILL_OFFSET = (1 << 40) - 1  # the byte offset bits of a spill position
_SPILL_EPOCH = 1 << 40  # one more start of the spill file

_REC = struct.Struct("=IBBxxq")
# Header words, as indexes into a memoryview cast to "Q": an item is read or written with one
# aligned 8-byte access. (Never struct.pack_into here: it zeroes the field before writing it.)
_W, _PRODUCED, _DROPPED, _DROPPED_CHUNKS, _DONE, _PWAIT, _SPILL_W, _SPILLED = range(8)
_R, _CSLEEP, _SPILL_R = 8, 9, 10  # the consumer's cache line
_DATA = 128
_HDR = _REC.size


class RingCorrupt(RuntimeError):
    """A record header that cannot be right (only possible on weakly ordered CPUs)."""


def _poke(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, b"\0")


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 4096):
            pass


class _Tail:
    """The newest bytes of one stream that analysis had to drop (a circular buffer)."""

    __slots__ = ("arrival_ns", "buf", "filled", "pos")

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)
        self.pos = self.filled = 0
        self.arrival_ns = 0  # when the newest of them arrived

    def keep(self, data: memoryview) -> None:
        self.arrival_ns = time.time_ns()
        n, size, pos = len(data), len(self.buf), self.pos
        if n >= size:
            self.buf[:] = data[n - size :]
            self.pos, self.filled = 0, size
            return
        k = min(n, size - pos)
        self.buf[pos : pos + k] = data[:k]
        self.buf[: n - k] = data[k:]
        self.pos, self.filled = (pos + n) % size, min(size, self.filled + n)

    def take(self) -> bytes:
        buf, pos = self.buf, self.pos
        data = bytes(buf[:pos]) if self.filled < len(buf) else bytes(buf[pos:] + buf[:pos])
        self.pos = self.filled = 0
        return data


class AnalysisRing:
    """Single-producer/single-consumer byte ring in an anonymous shared mapping."""

    def __init__(self, capacity: int = 8 << 20, spill_bytes: int = SPILL_BYTES) -> None:
        self.capacity = max(4096, capacity - capacity % _HDR)
        self.spill_bytes = min(spill_bytes, _SPILL_OFFSET >> 1)  # offsets stay in their bits
        self._spill_fd = _spill_file() if spill_bytes > 0 else -1
        self._spill_w = 0  # producer-private copy of spill_w
        self._spill_r = 0  # consumer-private copy of spill_r
        self._spilled = 0
        self._mm = mmap.mmap(-1, _DATA + self.capacity)  # MAP_SHARED | MAP_ANONYMOUS
        self._mv = memoryview(self._mm)
        self._data = self._mv[_DATA:]
        self._words = self._mv[:_DATA].cast("Q")
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        self._notify_r, self._notify_w = os.pipe2(flags)  # producer -> sleeping consumer
        self._space_r, self._space_w = os.pipe2(flags)  # consumer -> waiting producer
        self._w = 0  # producer-private copies of the producer words
        self._produced = self._dropped = self._dropped_chunks = 0
        self._gap = False
        self._tails: dict[int, _Tail] = {}  # per stream: newest dropped bytes (producer only)
        self._r = 0  # consumer-private copy of read_pos

    # ---- producer side: never blocks (except wait_for_space, used only by lossless scans)
    def reserve(self, max_len: int, min_len: int = 1) -> tuple[memoryview, ...] | None:
        """Views of free space for up to max_len payload bytes, or None if < min_len fit."""
        cap = self.capacity
        free = cap - (self._w - self._words[_R]) - _HDR
        n = min(max_len, free & ~15)
        if n < min_len or n <= 0:
            return None
        start = (self._w + _HDR) % cap
        end = start + n
        if end <= cap:
            return (self._data[start:end],)
        return (self._data[start:], self._data[: end - cap])

    def commit(self, stream: int, n: int, arrival_ns: int | None = None) -> None:
        """Publish n payload bytes written into the views of the last reserve(), read from
        the job at `arrival_ns` (default: now)."""
        mm = self._mm
        flags = GAP if self._gap else 0
        arrival = time.time_ns() if arrival_ns is None else arrival_ns
        _REC.pack_into(mm, _DATA + self._w % self.capacity, n, stream, flags, arrival)
        self._gap = False
        if self._tails and stream in self._tails:
            self._tails[stream].pos = self._tails[stream].filled = 0  # older than this record
        self._w += _HDR + ((n + 15) & ~15)
        self._produced += n
        words = self._words
        words[_PRODUCED] = self._produced
        words[_W] = self._w
        if words[_CSLEEP]:
            _poke(self._notify_w)

    @property
    def spilling(self) -> bool:
        """Output spilled earlier is still unread: the next chunk must follow it there."""
        return self._spill_w != self._words[_SPILL_R]

    def spill(
        self, stream: int, data: memoryview, arrival_ns: int | None = None, force: bool = False
    ) -> bool:
        """Append a chunk to the spill file; False (nothing written) when there is none, it
        is over its budget (unless `force`: the last words after a run) or a write failed."""
        n = len(data)
        if self._spill_fd < 0:
            return False
        start = self._spill_w
        if start & _SPILL_OFFSET and not self.spilling:
            start = self._restart_spill()
        if not force and (start & _SPILL_OFFSET) + _HDR + n > self.spill_bytes:
            return False
        flags = GAP if self._gap else 0
        arrival = time.time_ns() if arrival_ns is None else arrival_ns
        try:
            written = os.pwritev(
                self._spill_fd, [_REC.pack(n, stream, flags, arrival), data], start & _SPILL_OFFSET
            )
        except OSError:
            written = -1
        if written != _HDR + n:  # nothing published: the consumer still has nothing to read
            return False
        self._gap = False
        if self._tails and stream in self._tails:
            self._tails[stream].pos = self._tails[stream].filled = 0
        self._spill_w = start + written
        self._spilled += n
        self._produced += n
        words = self._words
        words[_PRODUCED], words[_SPILLED] = self._produced, self._spilled
        words[_SPILL_W] = self._spill_w
        if words[_CSLEEP]:
            _poke(self._notify_w)
        return True

    def _restart_spill(self) -> int:
        """The analyzer read all the file holds: its beginning again (the next epoch), and its
        blocks given back. The position to write at; published with the record written there."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._spill_fd, 0)
        return (self._spill_w & ~_SPILL_OFFSET) + _SPILL_EPOCH

    @property
    def spilled_bytes(self) -> int:
        return self._spilled

    @property
    def backlog_bytes(self) -> int:
        """What the consumer has still to read, in the ring and in the spill (producer side)."""
        words = self._words
        w, r = self._spill_w, words[_SPILL_R]
        on_disk = w - r if (w ^ r) <= _SPILL_OFFSET else w & _SPILL_OFFSET
        return (self._w - words[_R]) + on_disk

    def drop(self, n: int, stream: int = 1, data: memoryview | None = None) -> None:
        """Count n bytes that analysis will not see; the next record carries the gap flag.

        data (the dropped bytes): the newest TAIL_BYTES of them are kept for push_tails()."""
        if data is not None:
            tail = self._tails.get(stream)
            if tail is None:
                tail = self._tails[stream] = _Tail(TAIL_BYTES)
            tail.keep(data)
        self._produced += n
        self._dropped += n
        self._dropped_chunks += 1
        self._gap = True
        self._publish_stats()

    def push_tails(self, room: Callable[[int], bool]) -> None:
        """After the last chunk: push the newest dropped bytes of each stream (a failure's last
        words are at the end) that no later record covers, where room(n) gets space for n."""
        for stream, tail in self._tails.items():
            data = tail.take()[-(self.capacity // 4) :]
            arrival = tail.arrival_ns
            if not data:
                continue
            if self.spilling:  # behind unread spilled output, never ahead of it
                self._gap = True
                pushed = self.spill(stream, memoryview(data), arrival, force=True)
            else:
                pushed = room(len(data)) and self.push(stream, data, gap=True, arrival_ns=arrival)
            if pushed:
                self._produced -= len(data)  # counted once already, as dropped
                self._dropped -= len(data)
        self._publish_stats()

    def push(
        self,
        stream: int,
        data: bytes | bytearray | memoryview,
        gap: bool = False,
        arrival_ns: int | None = None,
    ) -> bool:
        """Copy data into the ring (split into records of at most capacity/2); False = dropped.

        gap: mark the first record as following lost data; arrival_ns: when it was read."""
        self._gap = self._gap or gap
        view = memoryview(data).cast("B")
        limit = self.capacity // 2
        while len(view):
            piece = view[:limit]
            views = self.reserve(len(piece), len(piece))
            if views is None:
                self.drop(len(view))
                return False
            first = len(views[0])
            views[0][:] = piece[:first]
            if len(views) > 1:
                views[1][:] = piece[first:]
            self.commit(stream, len(piece), arrival_ns)
            view = view[len(piece) :]
        return True

    def wait_for_space(self, nbytes: int, timeout: float) -> bool:
        """Lossless producers only: wait up to timeout for room for nbytes of payload."""
        if self.reserve(nbytes, nbytes) is not None:
            return True
        self._words[_PWAIT] = 1
        try:
            if self.reserve(nbytes, nbytes) is None:
                select.select([self._space_r], [], [], timeout)
                _drain(self._space_r)
        finally:
            self._words[_PWAIT] = 0
        return self.reserve(nbytes, nbytes) is not None

    def _publish_stats(self) -> None:
        words = self._words
        words[_PRODUCED], words[_DROPPED] = self._produced, self._dropped
        words[_DROPPED_CHUNKS] = self._dropped_chunks

    def finish_producer(self) -> None:
        """No more records will come: set producer_done and wake the consumer."""
        self._words[_DONE] = 1
        _poke(self._notify_w)

    @property
    def dropped_bytes(self) -> int:
        return self._dropped

    @property
    def dropped_chunks(self) -> int:
        return self._dropped_chunks

    # ---- consumer side
    @property
    def producer_done(self) -> bool:
        return bool(self._words[_DONE])

    def stats(self) -> tuple[int, int, int]:
        """(bytes produced, bytes dropped, chunks dropped) as last published."""
        words = self._words
        return words[_PRODUCED], words[_DROPPED], words[_DROPPED_CHUNKS]

    def pop(self) -> tuple[int, bytes, bool, int] | None:
        """Next record as (stream, payload, gap, arrival ns), or None when it is empty; the
        ring's records come before the spill's (the relay spills only behind them).

        spill_w is read before write_pos: a ring found empty after it holds nothing that was
        pushed before the spilled records it covers, whereas one read first could be refilled,
        and spilled behind, before the spill is read (the spill would overtake the ring)."""
        spill_w = self._words[_SPILL_W]
        w = self._words[_W]
        r = self._r
        if r == w:
            return self._pop_spilled(spill_w)
        cap = self.capacity
        off = r % cap
        n, stream, flags, arrival_ns = _REC.unpack_from(self._mm, _DATA + off)
        size = _HDR + ((n + 15) & ~15)
        if size > w - r or n > cap - _HDR:
            raise RingCorrupt(f"record of {n} bytes at {r} with {w - r} published")
        start = (off + _HDR) % cap
        end = start + n
        if end <= cap:
            data = bytes(self._data[start:end])
        else:
            data = bytes(self._data[start:]) + bytes(self._data[: end - cap])
        self._release(r + size)
        return stream, data, bool(flags & GAP), arrival_ns

    def _pop_spilled(self, w: int) -> tuple[int, bytes, bool, int] | None:
        """The next spilled record up to position w (spill_w as read before the ring)."""
        r = self._spill_r
        if r == w or self._spill_fd < 0:
            return None
        if (w ^ r) > _SPILL_OFFSET:  # the file started again (all before it was read here)
            r = w & ~_SPILL_OFFSET
        at, end = r & _SPILL_OFFSET, w & _SPILL_OFFSET
        header = os.pread(self._spill_fd, _HDR, at)
        if len(header) != _HDR:
            raise RingCorrupt(f"spill record header at {at} cut short")
        n, stream, flags, arrival_ns = _REC.unpack(header)
        if _HDR + n > end - at:
            raise RingCorrupt(f"spilled record of {n} bytes at {at} with {end - at} written")
        data = os.pread(self._spill_fd, n, at + _HDR)
        if len(data) != n:
            raise RingCorrupt(f"spilled record at {at} cut short")
        self._spill_r = r + _HDR + n
        self._words[_SPILL_R] = self._spill_r
        return stream, data, bool(flags & GAP), arrival_ns

    def discard_all(self) -> None:
        """Skip everything published so far (used once analysis has failed)."""
        self._release(self._words[_W])
        self._spill_r = self._words[_SPILL_W]
        self._words[_SPILL_R] = self._spill_r

    def _release(self, r: int) -> None:
        self._r = r
        self._words[_R] = r
        if self._words[_PWAIT]:
            _poke(self._space_w)

    def wait(self, timeout: float, extra_fds: Sequence[int] = ()) -> list[int]:
        """Sleep until data is published or an extra fd is readable; ≤ timeout seconds.

        Returns the extra fds that are readable."""
        words = self._words
        words[_CSLEEP] = 1
        try:
            if words[_W] != self._r or words[_SPILL_W] != self._spill_r:
                return []
            ready, _, _ = select.select([self._notify_r, *extra_fds], [], [], timeout)
        finally:
            words[_CSLEEP] = 0
        _drain(self._notify_r)
        return [fd for fd in ready if fd != self._notify_r]

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still alive: the GC unmaps it later
            self._words.release()
            self._data.release()
            self._mv.release()
            self._mm.close()
        for fd in (self._notify_r, self._notify_w, self._space_r, self._space_w, self._spill_fd):
            with contextlib.suppress(OSError):
                if fd >= 0:
                    os.close(fd)
        self._spill_fd = -1


def _spill_file() -> int:
    """An unlinked file in the temporary directory for spilled output, or -1 (none: a full
    ring drops, as it would without one)."""
    try:
        return os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (OSError, AttributeError):
        pass
    try:
        with tempfile.TemporaryFile(prefix="denpex-spill-") as handle:
            return os.dup(handle.fileno())
    except OSError:
        return -1
