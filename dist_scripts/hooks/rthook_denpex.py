"""Runtime hook of the frozen denpex: this Python process dies with the process the caller
started, even when that is a bootloader (onefile: PyInstaller's parent; static: staticx's too).

A bootloader cannot forward SIGKILL, so without this hook the wrapped job outlives a killed
denpex. Never fails start-up: any error leaves the process as it was.
"""

import os
import sys


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[1])


def _bootloader_ancestors() -> list[int]:
    """The bootloader processes above this one, nearest first; empty for onedir."""
    home = os.path.realpath(os.path.dirname(sys.executable)) + os.sep
    if os.path.realpath(getattr(sys, "_MEIPASS", home)).startswith(home):
        return []  # onedir: the executable is this process; nothing runs above it
    me = os.readlink("/proc/self/exe")
    parent = os.getppid()
    if parent <= 1 or os.readlink(f"/proc/{parent}/exe") != me:
        return []
    chain = [parent]
    static = os.environ.get("STATICX_PROG_PATH")
    if (
        static
        and os.environ.get("STATICX_BUNDLE_DIR")
        and me.startswith(os.environ["STATICX_BUNDLE_DIR"])
    ):
        grandparent = _parent_of(parent)
        if grandparent > 1 and os.readlink(f"/proc/{grandparent}/exe") == os.path.realpath(static):
            chain.append(grandparent)
    return chain


def _die_with(pids: list[int]) -> None:
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the nearest bootloader
    if os.getppid() != pids[0]:
        os.kill(os.getpid(), signal.SIGKILL)
    if len(pids) > 1:
        import threading

        threading.Thread(
            target=_watch, args=(pids[1:],), name="denpex-bootloader-watch", daemon=True
        ).start()


def _watch(pids: list[int]) -> None:
    """Blocks until any of `pids` exits, then kills this process (and so the wrapped job)."""
    import select
    import signal
    import time

    try:
        fds = [os.pidfd_open(pid) for pid in pids]
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll()
    except OSError:  # no pidfd (kernel < 5.3): poll
        while all(os.path.exists(f"/proc/{pid}") for pid in pids):
            time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


try:
    _ancestors = _bootloader_ancestors()
    if _ancestors:
        _die_with(_ancestors)
except Exception:  # never stop denpex from starting
    pass
