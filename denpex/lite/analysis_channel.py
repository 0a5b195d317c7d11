"""The analysis side channel: a bounded shared-memory ring from the relay to a forked analyzer.

The relay (producer) must never block, wait or slow down on this ring: when it lacks space a
chunk is dropped from *analysis* (counted, flagged as a gap), never from the job's output.
The analyzer process must never return into the caller's stack: it always ends in os._exit.

Why hand-written: analysis is pure-Python, CPU-bound and holds the GIL, so it runs in its own
process; the standard library and PyPI offer no single-producer/single-consumer byte ring that
works across fork() for Python (multiprocessing queues pickle, lock and can block the writer).

Layout of the MAP_SHARED mapping (created before fork), native 8-byte aligned words:
  producer line: write_pos, produced, dropped_bytes, dropped_chunks, producer_done, producer_waiting
  consumer line: read_pos, consumer_sleeping;   then the data area (capacity, a multiple of 8).
Positions are monotonic byte counters. A record is [u32 length][u8 stream][u8 flags][2 pad]
[payload padded to 8]; bit 0 of flags means analysis data was dropped just before it. A record
may wrap: its payload continues at the start of the data area. The producer writes the record,
then publishes write_pos; the consumer reads write_pos, copies the payload out, then publishes
read_pos. Each position is stored with one aligned 8-byte store (x86-64 keeps store order; on a
weakly ordered CPU the worst case is a garbled *analysis* chunk: lengths are validated).
Wake-ups: one byte on a non-blocking pipe when the other side says it sleeps; sleepers use a
timeout of at most 100 ms, which also covers a lost wake-up.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

GAP = 1  # record flag: analysis data was dropped just before this record
ANALYSIS_FAILED = 70  # analyzer exit status when the session raised

_U64 = struct.Struct("@Q")  # native and aligned: one 8-byte load/store
_REC = struct.Struct("=IBBxx")
_STATS = struct.Struct("@QQQ")
_W, _PRODUCED, _DONE, _PWAIT = 0, 8, 32, 40  # producer words (_PRODUCED..+24: 3 counters)
_R, _CSLEEP = 64, 72  # consumer words
_DATA = 128
_HDR = _REC.size
_SLEEP_S = 0.1
_TICK_S = 0.2
_PR_SET_PDEATHSIG = 1


class RingCorrupt(RuntimeError):
    """A record header that cannot be right (only possible on weakly ordered CPUs)."""


def _poke(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, b"\0")


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 4096):
            pass


class AnalysisRing:
    """Single-producer/single-consumer byte ring in an anonymous shared mapping."""

    def __init__(self, capacity: int = 8 << 20) -> None:
        self.capacity = max(4096, capacity - capacity % 8)
        self._mm = mmap.mmap(-1, _DATA + self.capacity)  # MAP_SHARED | MAP_ANONYMOUS
        self._mv = memoryview(self._mm)
        self._data = self._mv[_DATA:]
        flags = os.O_NONBLOCK | os.O_CLOEXEC
        self._notify_r, self._notify_w = os.pipe2(flags)  # producer -> sleeping consumer
        self._space_r, self._space_w = os.pipe2(flags)  # consumer -> waiting producer
        self._w = 0  # producer-private copies of the producer words
        self._produced = self._dropped = self._dropped_chunks = 0
        self._gap = False
        self._r = 0  # consumer-private copy of read_pos

    # ---- producer side: never blocks (except wait_for_space, used only by lossless scans)
    def reserve(self, max_len: int, min_len: int = 1) -> tuple[memoryview, ...] | None:
        """Views of free space for up to max_len payload bytes, or None if < min_len fit."""
        cap = self.capacity
        free = cap - (self._w - _U64.unpack_from(self._mm, _R)[0]) - _HDR
        n = min(max_len, free & ~7)
        if n < min_len or n <= 0:
            return None
        start = (self._w + _HDR) % cap
        end = start + n
        if end <= cap:
            return (self._data[start:end],)
        return (self._data[start:], self._data[: end - cap])

    def commit(self, stream: int, n: int) -> None:
        """Publish n payload bytes written into the views of the last reserve()."""
        mm = self._mm
        _REC.pack_into(mm, _DATA + self._w % self.capacity, n, stream, GAP if self._gap else 0)
        self._gap = False
        self._w += _HDR + ((n + 7) & ~7)
        self._produced += n
        _U64.pack_into(mm, _PRODUCED, self._produced)
        _U64.pack_into(mm, _W, self._w)
        if _U64.unpack_from(mm, _CSLEEP)[0]:
            _poke(self._notify_w)

    def drop(self, n: int) -> None:
        """Count n bytes that analysis will not see; the next record carries the gap flag."""
        self._produced += n
        self._dropped += n
        self._dropped_chunks += 1
        self._gap = True
        _STATS.pack_into(self._mm, _PRODUCED, self._produced, self._dropped, self._dropped_chunks)

    def undrop(self, n: int) -> None:
        """n bytes counted as dropped were pushed after all (the tail after a run)."""
        self._produced -= n
        self._dropped -= n
        _STATS.pack_into(self._mm, _PRODUCED, self._produced, self._dropped, self._dropped_chunks)

    def push(self, stream: int, data: bytes | bytearray | memoryview, gap: bool = False) -> bool:
        """Copy data into the ring (split into records of at most capacity/2); False = dropped.

        gap: mark the first record as following lost data."""
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
            self.commit(stream, len(piece))
            view = view[len(piece) :]
        return True

    def wait_for_space(self, nbytes: int, timeout: float) -> bool:
        """Lossless producers only: wait up to timeout for room for nbytes of payload."""
        if self.reserve(nbytes, nbytes) is not None:
            return True
        _U64.pack_into(self._mm, _PWAIT, 1)
        try:
            if self.reserve(nbytes, nbytes) is None:
                select.select([self._space_r], [], [], timeout)
                _drain(self._space_r)
        finally:
            _U64.pack_into(self._mm, _PWAIT, 0)
        return self.reserve(nbytes, nbytes) is not None

    def finish_producer(self) -> None:
        """No more records will come: set producer_done and wake the consumer."""
        _U64.pack_into(self._mm, _DONE, 1)
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
        return bool(_U64.unpack_from(self._mm, _DONE)[0])

    def stats(self) -> tuple[int, int, int]:
        """(bytes produced, bytes dropped, chunks dropped) as last published."""
        return _STATS.unpack_from(self._mm, _PRODUCED)

    def pop(self) -> tuple[int, bytes, bool] | None:
        """Next record as (stream, payload, gap), or None when the ring is empty."""
        w = _U64.unpack_from(self._mm, _W)[0]
        r = self._r
        if r == w:
            return None
        cap = self.capacity
        off = r % cap
        n, stream, flags = _REC.unpack_from(self._mm, _DATA + off)
        size = _HDR + ((n + 7) & ~7)
        if size > w - r or n > cap - _HDR:
            raise RingCorrupt(f"record of {n} bytes at {r} with {w - r} published")
        start = (off + _HDR) % cap
        end = start + n
        if end <= cap:
            data = bytes(self._data[start:end])
        else:
            data = bytes(self._data[start:]) + bytes(self._data[: end - cap])
        self._release(r + size)
        return stream, data, bool(flags & GAP)

    def discard_all(self) -> None:
        """Skip everything published so far (used once analysis has failed)."""
        self._release(_U64.unpack_from(self._mm, _W)[0])

    def _release(self, r: int) -> None:
        self._r = r
        _U64.pack_into(self._mm, _R, r)
        if _U64.unpack_from(self._mm, _PWAIT)[0]:
            _poke(self._space_w)

    def wait(self, timeout: float, extra_fds: Sequence[int] = ()) -> list[int]:
        """Sleep until data, producer_done, or an extra fd is readable; ≤ timeout seconds."""
        mm = self._mm
        _U64.pack_into(mm, _CSLEEP, 1)
        try:
            if _U64.unpack_from(mm, _W)[0] != self._r:
                return []
            ready, _, _ = select.select([self._notify_r, *extra_fds], [], [], timeout)
        finally:
            _U64.pack_into(mm, _CSLEEP, 0)
        _drain(self._notify_r)
        return [fd for fd in ready if fd != self._notify_r]

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a view still alive: the GC unmaps it later
            self._data.release()
            self._mv.release()
            self._mm.close()
        for fd in (self._notify_r, self._notify_w, self._space_r, self._space_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _send(fd: int, message: tuple[str, Any]) -> bool:
    blob = pickle.dumps(message)
    try:
        os.write(fd, struct.pack("=I", len(blob)) + blob)
    except OSError:
        return False
    return True


class Analyzer:
    """The relay's handle on the forked analyzer process and the ring that feeds it."""

    def __init__(self, ring: AnalysisRing, pid: int, ctl_w: int) -> None:
        self.ring = ring
        self.pid = pid
        self._ctl_w = ctl_w
        self.exit_status: int | None = None

    @classmethod
    def start(cls, session_factory: Callable[[int | None], Any], ring_bytes: int) -> Analyzer:
        """Fork the analyzer now (call before any thread exists); it waits for begin()."""
        ring = AnalysisRing(ring_bytes)
        ctl_r, ctl_w = os.pipe()
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the analyzer: never returns
            code = ANALYSIS_FAILED
            try:
                os.close(ctl_w)
                code = _analyzer_main(ring, ctl_r, parent, session_factory)
            except BaseException as exc:
                _say_failed(exc)
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os._exit(code)
        os.close(ctl_r)
        return cls(ring, pid, ctl_w)

    def begin(self, child_pid: int | None) -> None:
        """Tell the analyzer the job started (child_pid is also the job's process group)."""
        _send(self._ctl_w, ("start", child_pid))

    def abort(self) -> None:
        """The job never started: let the analyzer exit without a report."""
        _send(self._ctl_w, ("abort", None))
        self._close_ctl()
        if _wait_exit(self.pid, 2.0) is None:
            self._kill()

    def finish(
        self, result: Any, timeout: float = 60.0, stop: Callable[[], bool] = lambda: False
    ) -> int | None:
        """Mark the ring done, hand over the result, wait for the report; the exit status."""
        self.ring.finish_producer()
        _send(self._ctl_w, ("result", result))
        self._close_ctl()
        status = _wait_exit(self.pid, timeout, stop)
        if status is None:
            self._kill()
            if not stop():
                print(
                    f"denpex: analysis did not finish within {timeout:.0f} s; no report",
                    file=sys.stderr,
                )
        self.exit_status = status
        return status

    def _close_ctl(self) -> None:
        if self._ctl_w >= 0:
            os.close(self._ctl_w)
            self._ctl_w = -1

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _wait_exit(self.pid, 5.0)


def _wait_exit(pid: int, timeout: float, stop: Callable[[], bool] = lambda: False) -> int | None:
    """Reap pid within timeout seconds; its exit status (128+N for a signal) or None."""
    deadline = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if done:
                code = os.waitstatus_to_exitcode(status)
                return code if code >= 0 else 128 - code
            left = deadline - time.monotonic()
            if left <= 0 or stop():
                return None
            if pidfd >= 0:
                select.select([pidfd], [], [], min(left, _SLEEP_S))
            else:
                time.sleep(min(left, 0.01))
    finally:
        if pidfd >= 0:
            os.close(pidfd)


# ---------------------------------------------------------------- inside the analyzer process
_guard = {"parent": 0, "pgid": 0}


def _say_failed(exc: BaseException) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    with contextlib.suppress(Exception):
        print(f"denpex: analysis failed: {type(exc).__name__}: {text}", file=sys.stderr, flush=True)


def _parent_gone() -> None:
    """denpex died: take the job's process group with us, so nothing is left running."""
    if _guard["pgid"] > 0:
        with contextlib.suppress(OSError):
            os.killpg(_guard["pgid"], signal.SIGKILL)
    os._exit(1)


def _on_sighup(signum: int, frame: object) -> None:
    if os.getppid() != _guard["parent"]:
        _parent_gone()  # PR_SET_PDEATHSIG; a terminal hang-up is left to the relay


def _become_analyzer(parent: int) -> None:
    _guard["parent"] = parent
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)  # the relay forwards them; the report must survive
    for sig in (signal.SIGWINCH, signal.SIGCHLD, signal.SIGTSTP, signal.SIGCONT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, _on_sighup)
    with contextlib.suppress(OSError):
        os.nice(10)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGHUP, 0, 0, 0)
    if os.getppid() != parent:
        _parent_gone()


class _Messages:
    """Length-prefixed pickles from the relay on the control pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.eof = False
        self._buf = b""

    def read(self) -> list[tuple[str, Any]]:
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.eof = True
        self._buf += chunk
        out = []
        while len(self._buf) >= 4:
            (n,) = struct.unpack_from("=I", self._buf)
            if len(self._buf) < 4 + n:
                break
            out.append(pickle.loads(self._buf[4 : 4 + n]))
            self._buf = self._buf[4 + n :]
        return out


def _analyzer_main(
    ring: AnalysisRing, ctl_r: int, parent: int, session_factory: Callable[[int | None], Any]
) -> int:
    _become_analyzer(parent)
    messages = _Messages(ctl_r)
    got: dict[str, Any] = {}
    while "start" not in got and "abort" not in got:
        select.select([ctl_r], [], [], 1.0)
        got.update(messages.read())
        if messages.eof and "start" not in got and "abort" not in got:
            _parent_gone()
    if "start" not in got:
        return 0
    child_pid = got["start"]
    _guard["pgid"] = child_pid or 0
    session: Any = None
    try:
        session = session_factory(child_pid)
    except Exception as exc:
        _say_failed(exc)
    failed = session is None
    last_tick = time.monotonic()
    while True:
        done = ring.producer_done
        if failed:
            ring.discard_all()
            record = None
        else:
            record = ring.pop()
        if record is not None:
            try:
                session.feed(*record)
            except Exception as exc:
                _say_failed(exc)
                failed = True
        elif done and "result" in got:
            break
        now = time.monotonic()
        if not failed and now - last_tick >= _TICK_S:
            last_tick = now
            try:
                session.tick()
            except Exception as exc:
                _say_failed(exc)
                failed = True
        if record is not None:
            continue
        extra = [] if messages.eof else [ctl_r]
        if ring.wait(min(_SLEEP_S, max(0.0, _TICK_S - (now - last_tick))), extra):
            got.update(messages.read())
            if messages.eof and "result" not in got:
                _parent_gone()
    if failed:
        return ANALYSIS_FAILED
    try:
        code = session.finish(got["result"])
    except Exception as exc:
        _say_failed(exc)
        return ANALYSIS_FAILED
    return code if isinstance(code, int) and 0 <= code <= 255 else 0
