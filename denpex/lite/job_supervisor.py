"""The job's supervisor for `denpex run`: a small process between denpex and the job that starts
the job, reaps every process orphaned below it and takes what is left of the job down when
denpex ends or dies.

Why a process between denpex and the job, as tini is between a container runtime and its
command: the parent-death signal reaches only the direct child, and a process group misses
every descendant that moved out of it (`setsid`, a daemon's double fork). A subreaper
(`PR_SET_CHILD_SUBREAPER`) adopts such orphans, but when the subreaper itself is SIGKILLed its
adoptees pass to init and nobody can tell them apart any more. So denpex is not the subreaper:
the supervisor is, and it is the ancestor of every process of the job for as long as it
lives. It watches denpex through a pidfd (and the end of a pipe only denpex writes), so when
denpex dies — SIGKILL included, analysis or not — it kills its whole subtree at once; when
denpex ends normally it sends the leftovers SIGTERM (and SIGCONT), then SIGKILL after
END_GRACE_S. The subtree is complete by construction: a subreaper's descendants stay its
descendants. Only a process that changes its credentials (setuid) can refuse the signal.

The supervisor never returns into the caller's stack (it always ends in os._exit), never
writes to the job's output, and never signals a process that is not the job's (its own
subtree and the job's process group).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterable

LINGER_S = 2.0  # after the job's exit, how long the output it left open may stay silent
END_GRACE_S = 1.0  # after SIGTERM, the leftovers' time to exit before SIGKILL
_KILL_WAIT_S = 5.0  # how long SIGKILLed processes may take to be reaped before giving up
_PR_SET_CHILD_SUBREAPER = 36
# denpex forwards these to the job; the supervisor must outlive them (e.g. Ctrl-C reaches
# denpex's whole process group) and the job must get them as denpex's caller left them
_OUTLIVED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTSTP,
    signal.SIGCONT,
    signal.SIGWINCH,
)


class SupervisorLost(RuntimeError):
    """The supervisor died before it reported the job's exit (killed from outside)."""


class Supervisor:
    """denpex's handle on the supervisor process: the job's start, its exit, its end."""

    def __init__(self, pid: int, ctl_w: int, status_r: int) -> None:
        self.pid = pid
        self.job_pid = 0
        self._ctl_w = ctl_w
        self._status_r = status_r
        self._buf = b""
        self._reaped = False

    @property
    def status_fd(self) -> int:
        """Readable when the supervisor has news (the job's exit) or has gone."""
        return self._status_r

    @classmethod
    def start(cls, spawn: Callable[[], subprocess.Popen], keep: set[int]) -> Supervisor:
        """Fork the supervisor, which calls spawn() to start the job; keep: descriptors the job
        needs (the supervisor closes every other one it inherited). Returns once forked."""
        ctl_r, ctl_w = os.pipe()
        status_r, status_w = os.pipe()
        parent = os.getpid()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(ctl_w)
                    os.close(status_r)
                    code = _supervise(
                        spawn, keep | {ctl_r, status_w}, ctl_r, status_w, parent, blocked
                    )
                finally:
                    os._exit(code)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(ctl_r)
        os.close(status_w)
        return cls(pid, ctl_w, status_r)

    def wait_started(self) -> int:
        """The job's pid once it runs; OSError when it could not start."""
        line = self._line(block=True)
        if line is None or not line.startswith(b"started "):
            self.close(1.0)
            if line is not None and line.startswith(b"failed "):
                code, _, text = line[7:].partition(b" ")
                number = int(code)
                raise OSError(number, os.strerror(number) if number else text.decode())
            raise OSError(0, "denpex's job supervisor stopped before the job started")
        self.job_pid = int(line.split()[1])
        return self.job_pid

    def job_status(self) -> int | None:
        """The job's wait status once it exited (never waits); SupervisorLost if the
        supervisor is gone without saying."""
        line = self._line(block=False)
        if line is None:
            raise SupervisorLost("the job's supervisor stopped unexpectedly")
        if line == b"":
            return None
        return int(line.split()[1])

    def end(self) -> None:
        """The run is over: end whatever is left of the job (SIGTERM, then SIGKILL)."""
        if self._ctl_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._ctl_w, b"end\n")

    def close(self, timeout: float = END_GRACE_S + 2.0) -> None:
        """Wait for the supervisor to finish (it kills the job's leftovers first; without
        end() it kills them at once); killed after timeout."""
        if self._ctl_w >= 0:
            os.close(self._ctl_w)
            self._ctl_w = -1
        if not self._reaped:
            if not _wait_exit(self.pid, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                _wait_exit(self.pid, None)
            self._reaped = True
        if self._status_r >= 0:
            os.close(self._status_r)
            self._status_r = -1

    def _line(self, *, block: bool) -> bytes | None:
        """One message line; b"" when none is complete yet (non-blocking), None at EOF."""
        while b"\n" not in self._buf:
            if not block and not select.select([self._status_r], [], [], 0)[0]:
                return b""
            try:  # a byte at a time while blocking: what follows must wake the relay's poll
                chunk = os.read(self._status_r, 1 if block else 4096)
            except InterruptedError:
                continue
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line


def _wait_exit(pid: int, timeout: float | None) -> bool:
    """Reap pid; False if it is still running after timeout (None: wait for good)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG if deadline is not None else 0)
        except ChildProcessError:
            return True
        if done:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


# ---------------------------------------------------------------- inside the supervisor process


def _supervise(
    spawn: Callable[[], subprocess.Popen],
    keep: set[int],
    ctl_r: int,
    status_w: int,
    parent: int,
    mask: Iterable[int],
) -> int:
    gc.disable()  # a collected copy of one of denpex's files would close a descriptor of ours
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    keep = keep | {wake_r, wake_w}
    _close_all_but(keep)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    _take_signals()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # denpex's own: the job inherits it
    import ctypes  # here: the CLI imports this module for LINGER_S

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        watch = os.pidfd_open(parent)
    except OSError:
        watch = -1  # no pidfd (kernel < 5.3): the control pipe's end tells denpex died
    if os.getppid() != parent:  # denpex died before we could watch it
        return 0
    try:
        job = spawn()
    except OSError as exc:
        _say(status_w, f"failed {exc.errno or 0} {exc.strerror or exc}")
        return 0
    except Exception as exc:
        _say(status_w, f"failed 0 {' '.join(str(exc).split()) or type(exc).__name__}")
        return 0
    for fd in keep - {ctl_r, status_w, wake_r, wake_w}:
        with contextlib.suppress(OSError):
            os.close(fd)  # the job holds its ends now; ours would keep its output open
    _say(status_w, f"started {job.pid}")
    graceful = _watch(job.pid, ctl_r, status_w, wake_r, watch)
    _end_subtree(job.pid, graceful)
    return 0


def _nothing(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: exec puts caught signals back to their default for the job."""


def _take_signals() -> None:
    """Replace denpex's handlers (inherited by the fork): the supervisor outlives what denpex
    forwards, wakes on SIGCHLD, and leaves ignored signals ignored (the job inherits them)."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            old = signal.getsignal(sig)
            if callable(old) or (sig in _OUTLIVED and old != signal.SIG_IGN):
                signal.signal(sig, _nothing)
    signal.signal(signal.SIGCHLD, _nothing)


def _close_all_but(keep: set[int]) -> None:
    """Close every inherited descriptor but keep; 0-2 become /dev/null (the supervisor must
    not hold denpex's terminal or the pipe denpex's reader waits on)."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd not in keep:
            os.dup2(null, fd)
    os.close(null)
    low = 3
    for fd in [*sorted(k for k in keep if k >= 3), os.sysconf("SC_OPEN_MAX")]:
        os.closerange(low, fd)
        low = fd + 1


def _say(fd: int, text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, text.replace("\n", " ").encode("utf-8", "replace") + b"\n")


def _watch(job: int, ctl_r: int, status_w: int, wake_r: int, watch: int) -> bool:
    """Reap until denpex ends the run (True) or dies (False)."""
    poller = select.poll()
    for fd in (ctl_r, wake_r, watch):
        if fd >= 0:
            poller.register(fd, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll(500)}  # the timeout reaps when SIGCHLD is lost
        if wake_r in ready:
            with contextlib.suppress(OSError):
                os.read(wake_r, 4096)
        for pid, status in _reap():
            if pid == job:
                _say(status_w, f"exited {status}")
        if watch in ready:
            return False
        if ctl_r in ready:
            try:
                data = os.read(ctl_r, 64)
            except OSError:
                data = b""
            if not data:
                return False
            if b"end" in data:
                return True


def _reap() -> list[tuple[int, int]]:
    """Every child that has exited, with its wait status (never waits)."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _signal_subtree(job: int, sig: int) -> None:
    """sig to the job's process group and to every process below the supervisor."""
    from denpex.core.roots import Roots  # not at import: `denpex run` starts without them
    from denpex.host.procfs import descendants

    with contextlib.suppress(OSError):
        os.killpg(job, sig)
    me = os.getpid()
    for pid in descendants(Roots(), me):
        if pid != me:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def _end_subtree(job: int, graceful: bool) -> None:
    """Leave no process below the supervisor: SIGTERM first when the run ended normally,
    SIGKILL (again, for whatever was forked meanwhile) until nothing is left to reap."""
    _reap()
    if not _has_children():
        return
    if graceful:
        _signal_subtree(job, signal.SIGTERM)
        _signal_subtree(job, signal.SIGCONT)  # a stopped process acts on SIGTERM only then
        deadline = time.monotonic() + END_GRACE_S
        while _has_children() and time.monotonic() < deadline:
            time.sleep(0.01)
            _reap()
    deadline = time.monotonic() + _KILL_WAIT_S
    while _has_children() and time.monotonic() < deadline:
        _signal_subtree(job, signal.SIGKILL)
        time.sleep(0.01)
        _reap()
    _reap()
