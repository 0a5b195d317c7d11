"""Signals of `denpex run`: forwarded to the job's process group, job control (Ctrl-Z) and
SIGCHLD/SIGWINCH wake-ups for the relay.

Handlers only forward or set flags (the relay wakes on the wake-up pipe); every handler it
installs is put back on exit, and a signal that was ignored (nohup) stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable

from denpex.lite.terminal import RawStdin, copy_winsize

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class JobSignals:
    """Forwards signals to the job's process group and wakes the relay on SIGCHLD."""

    def __init__(self, use_pty: bool, raw: RawStdin) -> None:
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

    def __enter__(self) -> JobSignals:
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
            self._install(signal.SIGWINCH, lambda signum, frame: copy_winsize(self.master))
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
