"""The transparent wrapper: runs a command so that every byte it writes reaches us unchanged.

The relay must never wait on analysis (the ring drops analysis input, never output), never
alter or reorder a stream's bytes, and always restore the terminal and signals it changed.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from denpex.lite.analysis_channel import Analyzer
from denpex.lite.child_env import child_environ

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_CHUNK = 1 << 20  # largest read; pipes are enlarged to match
_MIN_RESERVE = 64 << 10  # below this much free ring space the chunk is dropped from analysis
_QUIET_S = 0.5  # after the child exits, stop once its output was quiet this long
_COALESCE = 256 << 10  # a greedy (PTY) pump gathers up to this much into one write
_PR_SET_PDEATHSIG = 1
_IN, _OUT, _HUP = select.POLLIN, select.POLLOUT, select.POLLHUP | select.POLLERR


class AnalysisSession(Protocol):
    """Analysis of one run; lives INSIDE the analyzer process (see analysis_channel)."""

    def feed(self, stream: int, data: bytes, gap: bool) -> None: ...

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


SessionFactory = Callable[[int | None], AnalysisSession]

_libc: ctypes.CDLL | None = None


def _pipe() -> tuple[int, int]:
    """A pipe (non-inheritable) whose buffer is as large as allowed, up to one chunk."""
    r, w = os.pipe()
    with contextlib.suppress(OSError, ValueError), open("/proc/sys/fs/pipe-max-size") as f:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, min(_CHUNK, int(f.read())))
    return r, w


def _fd_valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _hold_std_fds() -> list[int]:
    """Open /dev/null on each closed standard fd; the fds to close after the run."""
    held = []
    for fd in (0, 1, 2):
        if not _fd_valid(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd, inheritable=False)
                os.close(null)
            held.append(fd)
    return held


def _foreground(fd: int) -> bool:
    """False only when fd is our controlling terminal and we are a background job."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return True  # not our controlling terminal: job control does not apply


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


class _Relay:
    """Moves output from a source fd to a destination fd, reading straight into the ring."""

    def __init__(
        self, analyzer: Analyzer | None, *, lossless: bool = False, stop: Callable[[], bool] = bool
    ) -> None:
        self.analyzer = analyzer
        self.stop = stop  # true once waiting for the report should end (Ctrl-C)
        self.ring = analyzer.ring if analyzer is not None else None
        self.lossless = lossless
        self._spare = (memoryview(bytearray(_CHUNK)),)
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
        views = ring.reserve(_CHUNK, self._min) if ring is not None else None
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
        elif ring is not None:
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
            result.chunks_dropped = analyzer.ring.dropped_chunks
            result.analysis_status = analyzer.finish(result, stop=self.stop)
        return result


class _RawStdin:
    """Raw mode on our terminal (stdin) for a PTY run; always put back."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted and os.isatty(0)
        self._saved: list | None = None

    def enter(self) -> None:
        if self.wanted and self._saved is None and _foreground(0):
            self._saved = termios.tcgetattr(0)
            atexit.register(self.restore)
            tty.setraw(0, termios.TCSANOW)

    def restore(self) -> None:
        if self._saved is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(0, termios.TCSADRAIN, self._saved)
            self._saved = None
            atexit.unregister(self.restore)


class _StdinPump:
    """Forwards our stdin to the child (pipe, or PTY master) including its end."""

    def __init__(self, dst: int, master: bool, veof: bytes, raw: _RawStdin) -> None:
        self.dst = dst
        self.master = master
        self.veof = veof
        self.raw = raw
        self.reading = dst >= 0
        self.tty = self.reading and os.isatty(0)
        self.pending = b""
        self._last = b"\n"

    def wants_read(self) -> bool:
        if not self.reading or self.pending:
            return False
        if self.tty:
            if not _foreground(0):  # a background job must not read the terminal
                return False
            self.raw.enter()
        return True

    def on_readable(self) -> None:
        try:
            data = os.read(0, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.pending += data
            self._last = data[-1:]
        else:
            self.reading = False
            if self.master:  # end of input on a terminal: VEOF (twice to end a partial line)
                self.pending += self.veof if self._last in (b"\n", b"\r") else self.veof * 2
        self.flush()

    def flush(self) -> None:
        while self.pending:
            try:
                self.pending = self.pending[os.write(self.dst, self.pending) :]
            except BlockingIOError:
                return
            except OSError:  # the child closed its stdin or exited
                self.pending = b""
                self.reading = False
        if not self.reading and not self.master:
            self.close()

    def close(self) -> None:
        self.reading = False
        self.pending = b""
        if self.dst >= 0 and not self.master:
            os.close(self.dst)
        self.dst = -1


class _Signals:
    """Forwards signals to the job's process group and wakes the relay on SIGCHLD."""

    def __init__(self, use_pty: bool, raw: _RawStdin) -> None:
        self.use_pty = use_pty
        self.raw = raw
        self.target = 0
        self.master = -1
        self.child_gone = False
        self.stop_requested = False
        self.wake_r = self._wake_w = -1
        self._pending: list[int] = []
        self._old: dict[int, object] = {}
        self._old_wakeup = -1

    def __enter__(self) -> _Signals:
        if threading.current_thread() is not threading.main_thread():
            return self  # no handlers: the relay polls for the child's exit instead
        self.wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        for sig in FORWARDED:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored stays ignored (nohup)
                self._install(sig, self._forward)
        self._install(signal.SIGCHLD, lambda signum, frame: None)
        self._install(signal.SIGTSTP, self._suspend)
        self._install(signal.SIGCONT, self._resume)
        if self.use_pty:
            self._install(signal.SIGWINCH, lambda signum, frame: _copy_winsize(self.master))
        return self

    def _install(self, sig: int, handler: Callable[[int, object], None]) -> None:
        self._old[sig] = signal.signal(sig, handler)

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)  # type: ignore[arg-type]
        if self._wake_w >= 0:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self.wake_r)
            os.close(self._wake_w)

    def start(self, pgid: int, master: int) -> None:
        self.target, self.master = pgid, master
        for sig in self._pending:
            self._kill(sig)

    def _kill(self, sig: int) -> None:
        if self.target > 0:
            with contextlib.suppress(OSError):
                os.killpg(self.target, sig)

    def _forward(self, signum: int, frame: object) -> None:
        if self.target <= 0:
            self._pending.append(signum)
        self._kill(signum)
        if self.child_gone and signum != signal.SIGUSR1 and signum != signal.SIGUSR2:
            self.stop_requested = True  # e.g. Ctrl-C while the report is being written

    def _suspend(self, signum: int, frame: object) -> None:
        if not self.use_pty:
            self._kill(signal.SIGTSTP)
        was_raw = self.raw._saved is not None
        self.raw.restore()
        os.kill(os.getpid(), signal.SIGSTOP)  # continues here on SIGCONT
        if was_raw:
            self.raw.enter()

    def _resume(self, signum: int, frame: object) -> None:
        if not self.use_pty:
            self._kill(signal.SIGCONT)


def _copy_winsize(master: int) -> None:
    for fd in (0, 1, 2):
        try:
            size = termios.tcgetwinsize(fd)
        except (termios.error, OSError):
            continue
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetwinsize(master, size)
        return


def _preexec(controlling_tty: bool) -> Callable[[], None]:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    libc, parent = _libc, os.getpid()

    def preexec() -> None:  # in the child, after setsid/setpgid, before exec
        if controlling_tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # denpex died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclass
class _Child:
    proc: subprocess.Popen
    sources: dict[int, tuple[int, int]]  # our read end -> (destination fd, stream)
    stdin: _StdinPump
    master: int = -1


def _spawn_pipes(argv: list[str], env: dict[str, str], raw: _RawStdin, stdin_ok: bool) -> _Child:
    out_r, out_w = _pipe()
    err_r, err_w = _pipe()
    in_r, in_w = _pipe() if stdin_ok else (subprocess.DEVNULL, -1)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=in_r,
            stdout=out_w,
            stderr=err_w,
            env=env,
            close_fds=True,
            process_group=0,
            preexec_fn=_preexec(False),
        )
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, in_r):
            if fd >= 0:
                os.close(fd)
    for fd in (out_r, err_r, in_w):
        if fd >= 0:
            os.set_blocking(fd, False)
    return _Child(proc, {out_r: (1, 1), err_r: (2, 2)}, _StdinPump(in_w, False, b"", raw))


def _spawn_pty(argv: list[str], env: dict[str, str], raw: _RawStdin, stdin_ok: bool) -> _Child:
    master, slave = os.openpty()
    try:
        if os.isatty(0):  # the child sees our terminal's settings, like script(1) does
            with contextlib.suppress(termios.error):
                termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(0))
        _copy_winsize(master)
        veof = termios.tcgetattr(slave)[6][termios.VEOF]
        proc = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
            start_new_session=True,
            preexec_fn=_preexec(True),
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    stdin = _StdinPump(master if stdin_ok else -1, True, veof, raw)
    return _Child(proc, {master: (1, 1)}, stdin, master)


def _relay_child(child: _Child, relay: _Relay, sig: _Signals) -> int:
    """Relay until the child exited and its output ended (or went quiet); its wait status."""
    poller = select.poll()
    masks: dict[int, int] = {}
    sources, stdin = child.sources, child.stdin
    pid = child.proc.pid
    status: int | None = None
    quiet_until = 0.0
    ended: list[int] = []
    while True:
        want: dict[int, int] = {fd: _IN for fd in sources}
        if sig.wake_r >= 0:
            want[sig.wake_r] = _IN
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
            timeout = quiet_until - time.monotonic()
            if timeout <= 0:
                break
        elif sig.wake_r < 0 or (stdin.reading and stdin.tty and 0 not in want):
            timeout = 0.05 if sig.wake_r < 0 else 0.5
        events = poller.poll(None if timeout is None else max(1, int(timeout * 1000)))
        woke = sig.wake_r < 0
        for fd, ev in events:
            if fd == sig.wake_r:
                woke = True
                with contextlib.suppress(OSError):
                    os.read(fd, 4096)
                continue
            if fd in sources and ev & (_IN | _HUP):
                dest, stream = sources[fd]
                n = relay.pump(fd, dest, stream, greedy=child.master >= 0)
                if n > 0:
                    quiet_until = time.monotonic() + _QUIET_S
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
        if status is None and woke:
            done, wstatus = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wstatus
                child.proc.returncode = os.waitstatus_to_exitcode(wstatus)
                sig.child_gone = True
                quiet_until = time.monotonic() + _QUIET_S
    for fd in [*sources, *ended]:
        os.close(fd)
    stdin.close()
    return status


def _spawn_failed(name: str, exc: OSError) -> int:
    reason = exc.strerror or str(exc)
    print(f"denpex: cannot run {name!r}: {reason}", file=sys.stderr, flush=True)
    return 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126


def run_command(
    argv: list[str],
    *,
    use_pty: bool | None = None,
    session_factory: SessionFactory | None = None,
    ring_bytes: int = 8 << 20,
    extra_env: Mapping[str, str] | None = None,
) -> int:
    """Run argv transparently (PTY iff our stdout is a TTY, unless forced); the exit status.

    extra_env: variables added to the child's environment (the SDK socket's address)."""
    if not argv:
        raise ValueError("run_command needs a command to run")
    if use_pty is None:
        use_pty = os.isatty(1)
    env = child_environ(extra=extra_env)
    stdin_ok = _fd_valid(0)
    placeholders = _hold_std_fds()  # a closed 0/1/2 must not be reused by our own pipes
    analyzer = Analyzer.start(session_factory, ring_bytes) if session_factory else None
    raw = _RawStdin(use_pty)
    finished = False
    try:
        with _Signals(use_pty, raw) as sig:
            relay = _Relay(analyzer, stop=lambda: sig.stop_requested)
            started = time.monotonic()
            try:
                child = (_spawn_pty if use_pty else _spawn_pipes)(argv, env, raw, stdin_ok)
            except OSError as exc:
                if analyzer is not None:
                    analyzer.abort()
                    finished = True
                return _spawn_failed(argv[0], exc)
            if analyzer is not None:
                analyzer.begin(child.proc.pid)
            sig.start(child.proc.pid, child.master)
            try:
                if use_pty:
                    raw.enter()
                wstatus = _relay_child(child, relay, sig)
            finally:
                raw.restore()
            code = os.waitstatus_to_exitcode(wstatus)
            result = RunResult(
                exit_code=code if code >= 0 else None,
                exit_signal=-code if code < 0 else None,
                status=code if code >= 0 else 128 - code,
                bytes_total=relay.total,
                bytes_dropped=0,
                chunks_dropped=0,
                duration_s=time.monotonic() - started,
                child_pid=child.proc.pid,
            )
            status = relay.conclude(result).status
            finished = True
            return status
    finally:
        if analyzer is not None:
            if not finished:
                analyzer.abort()
            analyzer.ring.close()
        for fd in placeholders:
            os.close(fd)


def tee_stream(
    in_fd: int,
    out_fd: int | None,
    *,
    session_factory: SessionFactory | None,
    ring_bytes: int = 8 << 20,
) -> RunResult:
    """Copy in_fd to out_fd byte-exactly until EOF while analysing it. out_fd None: analyse
    only, and drop nothing (reading waits for the analyzer instead). If out_fd's reader goes
    away, copying stops but analysis goes on to EOF."""
    analyzer = Analyzer.start(session_factory, ring_bytes) if session_factory else None
    relay = _Relay(analyzer, lossless=out_fd is None)
    dest = -1 if out_fd is None else out_fd
    finished = False
    try:
        if analyzer is not None:
            analyzer.begin(None)
        started = time.monotonic()
        while n := relay.pump(in_fd, dest, 1):
            if n < 0:  # a non-blocking descriptor: wait for it
                select.select([in_fd], [], [])
        result = RunResult(None, None, 0, relay.total, 0, 0, time.monotonic() - started, None)
        relay.conclude(result)
        finished = True
        return result
    finally:
        if analyzer is not None:
            if not finished:
                analyzer.abort()
            analyzer.ring.close()
