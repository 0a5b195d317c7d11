"""Child process for the position-commit tests: the real node agent (pipeline, handoff,
spool, shipper) with its kmsg collector reading a kernel-log ring kept in a file, and a
SIGKILL of itself at the N-th spool append, before a byte is written: the moment between a
poll that read records and the spool holding them.

The ring file holds one `/dev/kmsg` record per line, as the kernel formats them; on open the
collector starts from the top of it, as from the kernel's ring after SEEK_SET, and its saved
sequence number says where to resume. Nothing else of the collector is replaced.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from denpex.agent.config import load_config
from denpex.agent.daemon import Agent
from denpex.agent.spool import Spool
from denpex.core.roots import Roots
from denpex.host.kmsg import KmsgCollector


class RingFileKmsg(KmsgCollector):
    """KmsgCollector whose device read() comes from a file of records (see the docstring)."""

    def __init__(self, roots: Roots, options=None) -> None:
        super().__init__(roots, options)
        self._records: list[bytes] = []
        self._next = 0

    def available(self) -> tuple[bool, str]:
        return True, f"reads the ring file {self.path}"

    def wake_when_readable(self, fd: int) -> None:
        pass  # a regular file is always readable: the interval paces the polls instead

    def _open(self) -> bool:
        opened = super()._open()
        self._next = 0  # SEEK_SET: the oldest record in the ring
        return opened

    def read_raw(self, limit: int) -> list[bytes]:
        with open(self.path, "rb") as f:
            self._records = [line + b"\n" for line in f.read().split(b"\n") if line]
        taken = self._records[self._next : self._next + limit]
        self._next += len(taken)
        return taken


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--devfs", required=True)
    parser.add_argument("--procfs", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--crash-at-append", type=int, default=0)
    args = parser.parse_args()

    if args.crash_at_append:
        real_append = Spool.append
        calls = {"n": 0}

        def append(self: Spool, records: list) -> None:
            if self.directory.name == "spool":
                calls["n"] += 1
                if calls["n"] == args.crash_at_append:
                    os.kill(os.getpid(), signal.SIGKILL)  # between collect and append
            real_append(self, records)

        Spool.append = append  # type: ignore[method-assign]

    config = load_config(
        overrides={
            "listen": "127.0.0.1:0",
            "state_dir": args.state_dir,
            "roots.devfs": args.devfs,
            "roots.procfs": args.procfs,
            "otlp.endpoint": args.endpoint,
            "spool.fsync": "always",
            "collectors": {
                "kmsg": {"start": "persisted", "interval_s": 0.05, "max_records_per_poll": 4}
            },
        }
    )
    agent = Agent(config, collector_classes=(RingFileKmsg,))
    agent.start()
    print("STARTED", flush=True)
    try:
        while True:
            time.sleep(1)
    finally:
        agent.stop()


if __name__ == "__main__":
    sys.exit(main())
