"""Test launcher standing in for `denpex run` / `denpex scan --tee`: calls the runner directly.

Usage: launch.py MODE [--session KIND] [--out FILE] [--ring BYTES] [--spill BYTES] [--delay S] [--linger S]
                 [-- CMD ...]
MODE is pipe, pty, auto (run_command), tee or scan (tee_stream to stdout / to nowhere).
It must never print anything of its own to stdout: the tests compare stdout byte for byte.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import signal
import sys
import time

from denpex.lite.analysis_ring import SPILL_BYTES
from denpex.lite.runner import RunResult, run_command, tee_stream


class CountSession:
    """Counts and hashes what analysis sees; writes it all to a JSON file in finish()."""

    def __init__(self, child_pid: int | None, out: str, delay: float) -> None:
        self.child_pid = child_pid
        self.out = out
        self.delay = delay
        self.bytes = {1: 0, 2: 0}
        self.sha = {1: hashlib.sha256(), 2: hashlib.sha256()}
        self.gaps = 0
        self.ticks = 0
        self.last = b""

    def feed(self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None) -> None:
        if self.delay:
            time.sleep(self.delay)
        self.bytes[stream] += len(data)
        self.sha[stream].update(data)
        self.gaps += gap
        self.last = (self.last + data)[-64:]

    def tick(self) -> None:
        self.ticks += 1

    def finish(self, result: RunResult) -> None:
        doc = {
            "child_pid": self.child_pid,
            "bytes": self.bytes,
            "sha": {k: v.hexdigest() for k, v in self.sha.items()},
            "gaps": self.gaps,
            "last": self.last.decode("latin-1"),
            "ticks": self.ticks,
            "result": dataclasses.asdict(result),
        }
        with open(self.out, "w") as f:
            json.dump(doc, f)


class FailingSession(CountSession):
    def feed(self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None) -> None:
        raise RuntimeError("boom in feed")


class CrashingSession(CountSession):
    """The analyzer process dies outright (as if the OOM killer took it)."""

    def feed(self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["pipe", "pty", "auto", "tee", "scan"])
    parser.add_argument(
        "--session", default="none", choices=["none", "count", "fail", "broken", "crash"]
    )
    parser.add_argument("--out", default="")
    parser.add_argument("--ring", type=int, default=8 << 20)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--spill", type=int, default=SPILL_BYTES)
    parser.add_argument("--linger", type=float, default=None)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    cmd = argv[split + 1 :]

    def factory(child_pid: int | None) -> CountSession:
        if args.session == "broken":
            raise RuntimeError("cannot build the session")
        cls = {"fail": FailingSession, "crash": CrashingSession}.get(args.session, CountSession)
        return cls(child_pid, args.out, args.delay)

    session_factory = None if args.session == "none" else factory
    if args.mode in ("tee", "scan"):
        out_fd = 1 if args.mode == "tee" else None
        result = tee_stream(0, out_fd, session_factory=session_factory, ring_bytes=args.ring)
        return result.status
    use_pty = {"pipe": False, "pty": True, "auto": None}[args.mode]
    linger = {} if args.linger is None else {"linger": args.linger}
    return run_command(
        cmd,
        use_pty=use_pty,
        session_factory=session_factory,
        ring_bytes=args.ring,
        spill_bytes=args.spill,
        **linger,
    )


if __name__ == "__main__":
    sys.exit(main())
