"""iproute2's folder of named network namespaces, left as a test found it.

The first `ip netns add` makes NETNS_DIR and bind-mounts it onto itself (shared, so that the
namespaces show in every mount namespace); `ip netns del` leaves both behind. A test that adds
namespaces takes a `snapshot()` first and calls `restore()` after deleting them: what it made
is undone once no namespace lives there any more.
"""

from __future__ import annotations

import contextlib
import os
import subprocess

NETNS_DIR = "/run/netns"


def is_mount(path: str) -> bool:
    """Whether something is mounted at `path` (os.path.ismount misses a folder bind-mounted
    onto itself: the same device on both sides)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        return any(line.split()[4] == path for line in mounts)


def snapshot() -> tuple[bool, bool]:
    """(the folder exists, it is a mount point), before a test adds a namespace."""
    return os.path.isdir(NETNS_DIR), is_mount(NETNS_DIR)


def restore(before: tuple[bool, bool]) -> None:
    had_folder, had_mount = before
    with contextlib.suppress(OSError):
        if had_mount or os.listdir(NETNS_DIR):
            return
        if is_mount(NETNS_DIR):
            subprocess.run(["umount", NETNS_DIR], capture_output=True, timeout=30)
        if not had_folder and not is_mount(NETNS_DIR):
            os.rmdir(NETNS_DIR)
