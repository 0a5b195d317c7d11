"""The job's terminal side of `denpex run`: raw mode on our terminal, stdin forwarding (pipe
or PTY master, end of input included) and the window size.

Always puts the terminal back as it found it (atexit too); a background job never reads
the terminal; forwarding never drops or reorders a byte of input.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import termios
import tty


def foreground(fd: int) -> bool:
    """False only when fd is our controlling terminal and we are a background job."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return True  # not our controlling terminal: job control does not apply


class RawStdin:
    """Raw mode on our terminal (stdin) for a PTY run; always put back."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted and os.isatty(0)
        self._saved: list | None = None

    def enter(self) -> None:
        if self.wanted and self._saved is None and foreground(0):
            self._saved = termios.tcgetattr(0)
            atexit.register(self.restore)
            tty.setraw(0, termios.TCSANOW)

    def restore(self) -> None:
        if self._saved is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(0, termios.TCSADRAIN, self._saved)
            self._saved = None
            atexit.unregister(self.restore)


class StdinPump:
    """Forwards our stdin to the child (pipe, or PTY master) including its end."""

    def __init__(self, dst: int, master: bool, veof: bytes, raw: RawStdin) -> None:
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
            if not foreground(0):  # a background job must not read the terminal
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


def copy_winsize(master: int) -> None:
    for fd in (0, 1, 2):
        try:
            size = termios.tcgetwinsize(fd)
        except (termios.error, OSError):
            continue
        with contextlib.suppress(termios.error, OSError):
            termios.tcsetwinsize(master, size)
        return
