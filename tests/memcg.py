"""A real v1 memory cgroup for tests that need a genuine OOM kill (MACHINE-NOTES: hybrid v1
hosts produce one on demand). Removed afterwards, even when the test fails."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests import kernel_log

MEMCG_V1 = Path("/sys/fs/cgroup/memory")

# waits for a line on stdin, then allocates far beyond any test limit
HOG = (
    "import sys; sys.stdin.readline(); "
    "chunks = [bytearray(8 << 20) for _ in range(64)]; print('survived', flush=True)"
)


def unavailable_reason() -> str | None:
    """Why a real OOM kill cannot be produced here, or None. The kernel writes its OOM report
    into the host's real kernel log, which a site's health checks read: opt-in only."""
    why_not = kernel_log.unavailable_reason()
    if why_not is not None:
        return why_not
    if os.geteuid() != 0:
        return "needs root to create a memory cgroup"
    if not (MEMCG_V1 / "memory.limit_in_bytes").exists():
        return "needs a cgroup v1 memory controller at /sys/fs/cgroup/memory"
    return None


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int = 32 << 20) -> Iterator[tuple[Path, str]]:
    """(folder, path as /proc/<pid>/cgroup names it) of a fresh memory cgroup."""
    name = f"denpex-test-{uuid.uuid4().hex[:12]}"
    folder = MEMCG_V1 / name
    folder.mkdir()
    try:
        (folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
        swap = folder / "memory.memsw.limit_in_bytes"
        if swap.exists():  # no escape into swap: the kernel must kill
            swap.write_text(str(limit_bytes))
        yield folder, f"/{name}"
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                folder.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # the killed process is still being torn down


def enter(folder: Path, pid: int) -> None:
    (folder / "cgroup.procs").write_text(str(pid))
