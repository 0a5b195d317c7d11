"""The relay of `denpex run` and `denpex scan --tee`: moves the job's output to ours, byte for
byte, reading straight into the analysis ring.

It never waits on analysis (a chunk the ring has no room for is dropped from analysis,
never from output), never alters or reorders a stream's bytes, and stops once the child
has exited and the last writer closed its output (or it stayed silent for the linger time).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from denpex.lite.analysis_channel import Analyzer
from denpex.lite.job_signals import JobSignals
from denpex.lite.job_supervisor import END_GRACE_S, LINGER_S, Supervisor, SupervisorLost
from denpex.lite.spawn import Child

CHUNK = 1 << 20  # largest read
_MIN_RESERVE = 64 << 10  # below this much free ring space the chunk is dropped from analysis
_DRAIN_S = END_GRACE_S + 1.0  # after ending the leftovers, how long their output is relayed
FINISH_S = 60.0  # how long the report may take once the job ended, with no backlog
BACKLOG_BYTES_PER_S = 5e6  # ... and a second more per this many bytes analysis has to read
_COALESCE = 256 << 10  # a greedy (PTY) pump gathers up to this much into one write
_IN, _OUT, _HUP = select.POLLIN, select.POLLOUT, select.POLLHUP | select.POLLERR


class AnalysisSession(Protocol):
    """Analysis of one run; lives INSIDE the analyzer process (see analysis_channel)."""

    def feed(self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None) -> None: ...

    def tick(self) -> None: ...

    def finish(self, result: RunResult) -> int | None: ...


@dataclass
class RunResult:
    exit_code: int | None  # the child's exit code when it exited normally
    exit_signal: int | None  # the signal number when it was killed by a signal
    status: int  # what denpex exits with: exit_code, or 128 + signal
    bytes_total: int  # bytes relayed
    bytes_dropped: int  # bytes dropped from analysis (never from output)
    chunks_dropped: int
    duration_s: float
    child_pid: int | None
    analysis_status: int | None = None  # the analyzer's exit status (finish()'s int, if any)
    bytes_spilled: int = 0  # bytes analysis read from the spill file (it lagged behind)


SessionFactory = Callable[[int | None], AnalysisSession]


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # someone made the shared file description non-blocking
            select.select([], [fd], [])


def _skip(buf: tuple[memoryview, ...], got: int) -> tuple[memoryview, ...]:
    first = buf[0]
    if got < len(first):
        return (first[got:], *buf[1:])
    return (buf[1][got - len(first) :],)


class Relay:
    """Moves output from a source fd to a destination fd, reading straight into the ring."""

    def __init__(
        self, analyzer: Analyzer | None, *, lossless: bool = False, stop: Callable[[], bool] = bool
    ) -> None:
        self.analyzer = analyzer
        self.stop = stop  # true once waiting for the report should end (Ctrl-C)
        self.ring = analyzer.ring if analyzer is not None else None
        self.lossless = lossless
        self._spare = (memoryview(bytearray(CHUNK)),)
        self._min = min(_MIN_RESERVE, self.ring.capacity // 4) if self.ring is not None else 0
        self.total = 0
        self.broken: set[int] = set()  # destinations that failed (EPIPE, EBADF)

    def pump(self, src: int, dest: int, stream: int, greedy: bool = False) -> int:
        """Bytes moved; 0 = end of output (EOF, or EIO from a PTY); -1 = nothing there now.

        greedy: keep reading until the source is empty (a PTY hands out ~4 KiB per read), so
        that one write and one ring record carry many reads."""
        ring = self.ring
        if ring is not None and self.lossless:
            self._room(self._min, None)
        # behind spilled output, a chunk follows it to the spill file (the order is kept)
        spilling = ring is not None and ring.spilling
        views = ring.reserve(CHUNK, self._min) if ring is not None and not spilling else None
        buf = views if views is not None else self._spare
        room = len(buf[0]) if len(buf) == 1 else len(buf[0]) + len(buf[1])
        got, ended = 0, False
        while True:
            try:
                n = os.readv(src, _skip(buf, got) if got else buf)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                n = 0
            if n == 0:
                ended = True
                break
            got += n
            if not greedy or got >= _COALESCE or got >= room:
                break
        if not got:
            return 0 if ended else -1
        if views is not None:
            ring.commit(stream, got)  # type: ignore[union-attr]
        elif ring is not None and not ring.spill(stream, buf[0][:got]):
            ring.drop(got, stream, buf[0][:got])
        self.total += got
        if dest >= 0 and dest not in self.broken:
            self._write(dest, buf, got)
        return got

    def _write(self, dest: int, buf: tuple[memoryview, ...], n: int) -> None:
        try:
            for view in buf:
                if n <= 0:
                    break
                part = view[:n] if len(view) > n else view
                n -= len(part)
                _write_all(dest, part)
        except OSError:
            self.broken.add(dest)

    def _room(self, n: int, deadline: float | None) -> bool:
        """Wait for ring space (lossless scans, and the tail after a run); False if it never came."""
        ring, analyzer = self.ring, self.analyzer
        assert ring is not None and analyzer is not None
        while not ring.wait_for_space(n, 0.1):
            if not analyzer.alive():  # the analyzer is gone: stop waiting for it
                self.lossless = False
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def conclude(self, result: RunResult) -> RunResult:
        """After the run: hand analysis the newest output it had to drop (a failure's last
        words; waits ≤ 2 s for room, nothing else waits now), then the result; wait for the
        report."""
        analyzer = self.analyzer
        if analyzer is not None:
            deadline = time.monotonic() + 2.0
            analyzer.ring.push_tails(lambda n: self._room(n, deadline))
            result.bytes_dropped = analyzer.ring.dropped_bytes
            result.bytes_spilled = analyzer.ring.spilled_bytes
            result.chunks_dropped = analyzer.ring.dropped_chunks
            # the report waits on what analysis has still to read, at a slow analyzer's pace
            timeout = FINISH_S + analyzer.ring.backlog_bytes / BACKLOG_BYTES_PER_S
            result.analysis_status = analyzer.finish(result, timeout, stop=self.stop)
        return result


def relay_child(child: Child, relay: Relay, sig: JobSignals, linger: float = LINGER_S) -> int:
    """Relay until the child exited and its output ended; its wait status.

    After the child's exit its descendants may still hold the output (a pipe's end of file, a
    PTY's EIO, comes only when the last holder closes it): relaying goes on until then, as
    long as the output is never silent for `linger` seconds. After that the supervisor ends
    the leftovers and what they wrote meanwhile is still relayed (for at most _DRAIN_S)."""
    poller = select.poll()
    masks: dict[int, int] = {}
    sources, stdin = child.sources, child.stdin
    supervisor = child.supervisor
    status: int | None = None
    quiet_until = drain_until = math.inf
    ended: list[int] = []
    while True:
        want: dict[int, int] = {fd: _IN for fd in sources}
        if sig.wake_r >= 0:
            want[sig.wake_r] = _IN
        if status is None:
            want[supervisor.status_fd] = _IN
        if stdin.wants_read():
            want[0] = want.get(0, 0) | _IN
        if stdin.pending and stdin.dst >= 0:
            want[stdin.dst] = want.get(stdin.dst, 0) | _OUT
        for fd in set(masks) | set(want):
            if masks.get(fd) != want.get(fd):
                if fd not in want:
                    poller.unregister(fd)
                    del masks[fd]
                else:
                    poller.register(fd, want[fd])
                    masks[fd] = want[fd]
        timeout: float | None = None
        if status is not None:
            if not sources:
                break
            now = time.monotonic()
            if drain_until == math.inf and now >= quiet_until:
                supervisor.end()  # silent too long: end the holders, keep what they still write
                drain_until = now + _DRAIN_S
            if now >= drain_until:
                break
            timeout = (quiet_until if drain_until == math.inf else drain_until) - now
        elif stdin.reading and stdin.tty and 0 not in want:
            timeout = 0.5  # a background job: look again whether we are in the foreground
        events = poller.poll(None if timeout in (None, math.inf) else max(1, int(timeout * 1000)))
        for fd, ev in events:
            if fd == sig.wake_r:
                with contextlib.suppress(OSError):
                    os.read(fd, 4096)
                continue
            if fd == supervisor.status_fd and status is None:
                status = _job_status(supervisor, child.pid)
                if status is not None:
                    sig.child_gone = True
                    quiet_until = time.monotonic() + linger
                continue
            if fd in sources and ev & (_IN | _HUP):
                dest, stream = sources[fd]
                n = relay.pump(fd, dest, stream, greedy=child.master >= 0)
                if n > 0 and status is not None:
                    quiet_until = time.monotonic() + linger
                if n == 0:  # end of output; a PTY master stays open until the child is
                    del sources[fd]  # reaped: closing it hangs up the terminal (SIGHUP), and
                    ended.append(fd)  # the child may still be between close() and exit()
                elif dest in relay.broken:  # nobody reads our side any more: like script(1),
                    del sources[fd]  # close ours, so a pipe writer gets SIGPIPE and a PTY
                    if fd == child.master:  # session SIGHUP
                        stdin.dst = -1
                    os.close(fd)
            if fd == 0 and stdin.reading and ev & (_IN | _HUP):
                stdin.on_readable()
            if fd == stdin.dst and ev & (_OUT | _HUP) and stdin.pending:
                stdin.flush()
    for fd in [*sources, *ended]:
        os.close(fd)
    stdin.close()
    return status


def _job_status(supervisor: Supervisor, pid: int) -> int | None:
    """The job's wait status if the supervisor reported it; a lost supervisor took the job
    with it (the job's parent-death signal): killed by SIGKILL."""
    try:
        return supervisor.job_status()
    except SupervisorLost:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            print("denpex: the job's supervisor was killed; the job with it", file=sys.stderr)
        return signal.SIGKILL  # the wait status of a process killed by SIGKILL
