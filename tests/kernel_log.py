"""The one gate for tests that write into the host's real kernel log (/dev/kmsg, or a real
OOM kill, whose report the kernel writes there).

On a GPU node a fake Xid or OOM line makes the site's own health checks (NHC,
node-problem-detector, Slurm's HealthCheckProgram) drain it, so these tests run only with
DENPEX_TEST_KMSG=1 (CI sets it), and every line they write carries TEST_MARKER, which
denpex's own readers ignore outside tests.
"""

from __future__ import annotations

import os

import pytest

from denpex.core.kmsg import TEST_KMSG_ENV, TEST_MARKER


def unavailable_reason() -> str | None:
    """Why this run may not write the host's kernel log, or None."""
    if os.environ.get(TEST_KMSG_ENV) != "1":
        return f"writes the host's kernel log: set {TEST_KMSG_ENV}=1 (CI does)"
    if not os.access("/dev/kmsg", os.R_OK | os.W_OK):
        return "needs read and write access to /dev/kmsg (run as root)"
    return None


needs_kernel_log = pytest.mark.skipif(
    unavailable_reason() is not None, reason=str(unavailable_reason())
)


def marked(record: bytes) -> bytes:
    """A kmsg record ('<level>message\\n') with the test marker at the end of its message."""
    return record.rstrip(b"\n") + f" {TEST_MARKER}\n".encode()


def body_of(record: bytes) -> str:
    """The message a reader sees of a '<level>message\\n' record."""
    return record[record.index(b">") + 1 :].rstrip(b"\n").decode()


def inject(*records: bytes) -> None:
    """Write records, each marked, into the kernel log; a fresh open per record because the
    kernel rate-limits user-space writes per open file (kernel.printk_devkmsg=ratelimit)."""
    assert unavailable_reason() is None, unavailable_reason()
    for record in records:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            os.write(fd, marked(record))
        finally:
            os.close(fd)
