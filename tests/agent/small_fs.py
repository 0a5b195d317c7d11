"""A real, small filesystem for tests that fill a disk: a tmpfs or a loop-mounted ext4 of a
few MB in a temporary folder, unmounted (and its loop device released) in a finally.

Needs root (mount); `unavailable_reason()` says why not, for a skip that names it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

KINDS = ("tmpfs", "ext4")


def unavailable_reason(kind: str) -> str | None:
    if os.geteuid() != 0:
        return "mounting a small filesystem needs root"
    if kind == "ext4" and shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 not found (Debian: e2fsprogs)"
    return None


@contextlib.contextmanager
def small_filesystem(kind: str, size_kib: int = 4096) -> Iterator[Path]:
    """Mount a `size_kib` filesystem of `kind` and yield its mount point."""
    work = Path(tempfile.mkdtemp(prefix=f"denpex-{kind}-"))
    mount_point = work / "mnt"
    mount_point.mkdir()
    image = work / "disk.img"
    try:
        if kind == "tmpfs":
            command = ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mount_point)]
        else:
            with open(image, "wb") as f:
                f.truncate(size_kib * 1024)
            # -m 0: no blocks reserved for root (the tests run as root and must see ENOSPC)
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(image)],
                check=True,
                capture_output=True,
                timeout=60,
            )
            command = ["mount", "-o", "loop", str(image), str(mount_point)]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        try:
            yield mount_point
        finally:
            subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=60)
            if os.path.ismount(mount_point):
                subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fill(folder: Path) -> Path:
    """Write a file in `folder` until the filesystem refuses another byte; returns it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return filler
