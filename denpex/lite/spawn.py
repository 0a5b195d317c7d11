"""Starting the job for `denpex run`: pipes or a PTY, its own process group or session, below
the job's supervisor (job_supervisor.py, its parent and subreaper, with a parent-death
signal tied to it), and standard descriptors that are never reused by our own pipes.

Never changes the environment it is given; a child that cannot start leaves nothing
behind (every descriptor opened for it is closed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import stat
import subprocess
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass

from denpex.lite.job_supervisor import Supervisor
from denpex.lite.terminal import RawStdin, StdinPump, copy_winsize

PIPE_BYTES = 1 << 20  # pipes are enlarged to the relay's largest read
_PR_SET_PDEATHSIG = 1

_libc: ctypes.CDLL | None = None


def _pipe() -> tuple[int, int]:
    """A pipe (non-inheritable) whose buffer is as large as allowed, up to one chunk."""
    r, w = os.pipe()
    enlarge_pipe(w)
    return r, w


def enlarge_pipe(fd: int) -> None:
    """Grow the buffer of `fd` to one chunk (as far as pipe-max-size and the user's pipe quota
    allow) when it is a pipe; never shrinks one, leaves anything else alone. Our own output
    too: a relay writing 1 MiB into a pipe's default 64 KiB waits on its reader 16 times."""
    with contextlib.suppress(OSError, ValueError):
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        with open("/proc/sys/fs/pipe-max-size") as f:
            size = min(PIPE_BYTES, int(f.read()))
        if fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < size:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)


def fd_valid(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def hold_std_fds() -> list[int]:
    """Open /dev/null on each closed standard fd; the fds to close after the run."""
    held = []
    for fd in (0, 1, 2):
        if not fd_valid(fd):
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd, inheritable=False)
                os.close(null)
            held.append(fd)
    return held


def preexec_for(controlling_tty: bool) -> Callable[[], None]:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    libc, parent = _libc, os.getpid()

    def preexec() -> None:  # in the job, after setsid/setpgid, before exec
        if controlling_tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclass
class Child:
    pid: int  # the job's first process (also its process group)
    supervisor: Supervisor  # its parent: reaps, reports the exit, ends the leftovers
    sources: dict[int, tuple[int, int]]  # our read end -> (destination fd, stream)
    stdin: StdinPump
    master: int = -1


def _start(
    argv: list[str], env: dict[str, str], fds: tuple[int, int, int], terminal: bool
) -> tuple[int, Supervisor]:
    """Start argv on fds (stdin, stdout, stderr) below a new supervisor: (job pid, supervisor).
    The job's process group (a session, with the terminal as controlling one) is its own."""
    stdin, stdout, stderr = fds

    def spawn() -> subprocess.Popen:  # runs in the supervisor, the job's parent
        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            close_fds=True,
            start_new_session=terminal,
            process_group=None if terminal else 0,
            preexec_fn=preexec_for(terminal),
        )

    supervisor = Supervisor.start(spawn, {fd for fd in fds if fd >= 0})
    return supervisor.wait_started(), supervisor


def spawn_pipes(argv: list[str], env: dict[str, str], raw: RawStdin, stdin_ok: bool) -> Child:
    out_r, out_w = _pipe()
    err_r, err_w = _pipe()
    in_r, in_w = _pipe() if stdin_ok else (subprocess.DEVNULL, -1)
    try:
        pid, supervisor = _start(argv, env, (in_r, out_w, err_w), False)
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
    stdin = StdinPump(in_w, False, b"", raw)
    return Child(pid, supervisor, {out_r: (1, 1), err_r: (2, 2)}, stdin)


def spawn_pty(argv: list[str], env: dict[str, str], raw: RawStdin, stdin_ok: bool) -> Child:
    master, slave = os.openpty()
    try:
        if os.isatty(0):  # the child sees our terminal's settings, like script(1) does
            with contextlib.suppress(termios.error):
                termios.tcsetattr(slave, termios.TCSANOW, termios.tcgetattr(0))
        copy_winsize(master)
        veof = termios.tcgetattr(slave)[6][termios.VEOF]
        pid, supervisor = _start(argv, env, (slave, slave, slave), True)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    stdin = StdinPump(master if stdin_ok else -1, True, veof, raw)
    return Child(pid, supervisor, {master: (1, 1)}, stdin, master)


def spawn_failed(name: str, exc: OSError) -> int:
    reason = exc.strerror or str(exc)
    print(f"denpex: cannot run {name!r}: {reason}", file=sys.stderr, flush=True)
    return 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
