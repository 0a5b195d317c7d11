"""The analyzer process of `denpex run`: forked before the job starts, fed through the
analysis ring (analysis_ring.py), told the job's start and result over a control pipe.

It must never return into the caller's stack (it always ends in os._exit), never outlive
denpex (parent-death signal; the job goes with denpex's supervisor, job_supervisor.py), and
a failing analysis costs the report, never the job: the ring keeps being drained.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from denpex.lite.analysis_ring import SPILL_BYTES, AnalysisRing

ANALYSIS_FAILED = 70  # analyzer exit status when the session raised
_SLEEP_S = 0.1
_TICK_S = 0.2
_PR_SET_PDEATHSIG = 1


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
        self.exit_status: int | None = None  # once reaped: exit code, or 128 + signal
        self._reaped = False

    @classmethod
    def start(
        cls,
        session_factory: Callable[[int | None], Any],
        ring_bytes: int,
        spill_bytes: int = SPILL_BYTES,
    ) -> Analyzer:
        """Fork the analyzer now (call before any thread exists); it waits for begin()."""
        ring = AnalysisRing(ring_bytes, spill_bytes)
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

    def alive(self) -> bool:
        """Reap the analyzer if it has exited (never waits)."""
        if self._reaped:
            return False
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done, status = self.pid, -1
        if not done:
            return True
        self._reaped = True
        if status >= 0:
            code = os.waitstatus_to_exitcode(status)
            self.exit_status = code if code >= 0 else 128 - code
        return False

    def abort(self) -> None:
        """The job never started (or the relay failed): the analyzer exits without a report."""
        _send(self._ctl_w, ("abort", None))
        self._close_ctl()
        if not self._wait(2.0):
            self._kill()

    def finish(
        self, result: Any, timeout: float = 60.0, stop: Callable[[], bool] = bool
    ) -> int | None:
        """Mark the ring done, hand over the result, wait for the report; the exit status."""
        self.ring.finish_producer()
        _send(self._ctl_w, ("result", result))
        self._close_ctl()
        if not self._wait(timeout, stop):
            self._kill()
            if not stop():
                _warn(f"analysis did not finish within {timeout:.0f} s; no report")
            return None
        status = self.exit_status
        if status is not None and status > 128 and status != ANALYSIS_FAILED:
            _warn(f"analysis stopped unexpectedly (signal {status - 128}); no report")
        return status

    def _wait(self, timeout: float, stop: Callable[[], bool] = bool) -> bool:
        """True once the analyzer has exited (within timeout, unless stop() turns true)."""
        deadline = time.monotonic() + timeout
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            pidfd = -1
        try:
            while self.alive():
                left = deadline - time.monotonic()
                if left <= 0 or stop():
                    return False
                if pidfd >= 0:
                    select.select([pidfd], [], [], min(left, _SLEEP_S))
                else:
                    time.sleep(min(left, 0.01))
            return True
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def _close_ctl(self) -> None:
        if self._ctl_w >= 0:
            os.close(self._ctl_w)
            self._ctl_w = -1

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self._wait(5.0)


def _warn(text: str) -> None:
    with contextlib.suppress(Exception):
        print(f"denpex: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- inside the analyzer process
_guard = {"parent": 0}


def _say_failed(exc: BaseException) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    message = f"denpex: analysis failed: {type(exc).__name__}: {text}\n"
    with contextlib.suppress(Exception):
        # one write(2): the job's own stderr shares the descriptor and must not land mid-line
        sys.stderr.flush()
        os.write(2, message.encode("utf-8", "replace"))


def _parent_gone() -> None:
    """denpex died: no report can reach anyone (its supervisor ends the job)."""
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
    session: Any = None
    try:
        session = session_factory(child_pid)
    except Exception as exc:
        _say_failed(exc)
    failed = session is None
    last_tick = time.monotonic()
    while True:
        done = ring.producer_done
        record = None
        try:
            if failed:
                ring.discard_all()  # keep draining: the relay's ring must not stay full
            elif (record := ring.pop()) is not None:
                session.feed(*record)
        except Exception as exc:  # the session's, or RingCorrupt
            _say_failed(exc)
            failed = True
        if record is None and done and "result" in got:
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
