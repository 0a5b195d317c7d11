"""Durability of the node agent under abuse (prints JSON): the real agent (kmsg collector →
pipeline → handoff → spool → shipper) killed with SIGKILL at random moments, cycle after
cycle, while it ships to a lossy OTLP receiver (refusals with 500/503/429/408, connections
cut mid-request) and, as root, while the disk under its state directory (a tmpfs) fills up
and empties again. Then one last run delivers what is left.

It reports what was written to the kernel log, sent, acknowledged by the receiver,
delivered (unique event ids), lost (written and never delivered: the target is 0) and
duplicated (acknowledged more than once: allowed, deduplicated by event id).

    python benchmarks/bench_durability.py [--cycles 20] [--seed N]

Never run in the test suite: it takes about a minute and, as root, mounts a tmpfs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# the tests' full-disk helper; appended, so an installed denpex stays the one imported
sys.path.append(str(Path(__file__).resolve().parents[1]))
from tests.agent.small_fs import fill

BOOT = "boot-durability"


# --- the agent, in a child process ----------------------------------------------------------


def run_child_agent(args: argparse.Namespace) -> int:
    """The real agent with its kmsg collector reading a kernel-log ring kept in a file."""
    from denpex.agent.config import load_config
    from denpex.agent.daemon import Agent
    from denpex.core.roots import Roots
    from denpex.host.kmsg import KmsgCollector

    class RingFileKmsg(KmsgCollector):
        def __init__(self, roots: Roots, options: Any = None) -> None:
            super().__init__(roots, options)
            self._next = 0

        def available(self) -> tuple[bool, str]:
            return True, "a kernel-log ring in a file"

        def wake_when_readable(self, fd: int) -> None:
            pass  # a regular file is always readable: the interval paces the polls

        def _open(self) -> bool:
            opened = super()._open()
            self._next = 0  # like SEEK_SET on /dev/kmsg: the oldest record of the ring
            return opened

        def read_raw(self, limit: int) -> list[bytes]:
            with open(self.path, "rb") as f:
                records = [line + b"\n" for line in f.read().split(b"\n") if line]
            taken = records[self._next : self._next + limit]
            self._next += len(taken)
            return taken

    config = load_config(
        overrides={
            "listen": "127.0.0.1:0",
            "state_dir": args.state_dir,
            "roots.devfs": args.devfs,
            "roots.procfs": args.procfs,
            "otlp.endpoint": args.endpoint,
            "otlp.timeout_s": 2,
            "spool.fsync": "batch",
            "api.socket": str(Path(args.devfs) / "agent.sock"),
            "collectors": {
                "kmsg": {"start": "persisted", "interval_s": 0.05, "max_records_per_poll": 50}
            },
        }
    )
    agent = Agent(config, collector_classes=(RingFileKmsg,))
    agent.start()
    agent.shipper.max_backoff_s = 0.5  # a lossy endpoint: retry often
    agent.shipper.min_backoff_s = 0.05
    agent.shipper.batch_size = agent.shipper._limit = 32  # many requests, many chances to fail
    signal.sigwait({signal.SIGTERM})
    agent.stop()
    return 0


# --- a lossy OTLP receiver ----------------------------------------------------------------


class LossyReceiver:
    """Accepts OTLP/HTTP logs, refusing a share of requests (transient statuses) and cutting
    some connections before answering; counts records by event id."""

    def __init__(self, loss: float, rng: random.Random) -> None:
        self.loss, self.rng = loss, rng
        self.lock = threading.Lock()
        self.ids: dict[str, int] = {}
        self.sent = self.acknowledged = 0
        self.answers: dict[str, int] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
                    ExportLogsServiceRequest,
                )

                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ids: list[str] = []
                if self.path == "/v1/logs":
                    request = ExportLogsServiceRequest.FromString(body)
                    for resource in request.resource_logs:
                        for scope in resource.scope_logs:
                            for record in scope.log_records:
                                attrs = {a.key: a.value.string_value for a in record.attributes}
                                ids.append(attrs.get("denpex.event_id", ""))
                with receiver.lock:
                    receiver.sent += len(ids)
                    roll = receiver.rng.random()
                if roll < receiver.loss / 3:
                    receiver._count("cut")
                    self.connection.shutdown(2)  # cut before any answer
                    return
                if roll < receiver.loss:
                    status = receiver.rng.choice((500, 503, 429, 408))
                    receiver._count(str(status))
                    return self._answer(status)
                with receiver.lock:
                    receiver.acknowledged += len(ids)
                    for event_id in ids:
                        receiver.ids[event_id] = receiver.ids.get(event_id, 0) + 1
                receiver._count("200")
                self._answer(200)

            def _answer(self, status: int) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler

    def _count(self, key: str) -> None:
        with self.lock:
            self.answers[key] = self.answers.get(key, 0) + 1

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the run ------------------------------------------------------------------------------


class Ring:
    def __init__(self, root: Path) -> None:
        from denpex.core.kmsg import KmsgRecord, format_record

        self.format = lambda seq: format_record(
            KmsgRecord(
                0,
                4,
                seq,
                seq * 1000,
                "-",
                f"NVRM: Xid (PCI:0000:3b:00): 79, pid={seq}, GPU has fallen off the bus.",
            )
        )
        self.dev, self.proc = root / "dev", root / "proc"
        self.dev.mkdir()
        (self.proc / "sys/kernel/random").mkdir(parents=True)
        (self.proc / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
        self.path = self.dev / "kmsg"
        self.path.write_bytes(b"")
        self.last = 0
        self.lock = threading.Lock()

    def write(self, count: int) -> None:
        with self.lock, open(self.path, "ab") as f:
            for _ in range(count):
                self.last += 1
                f.write(self.format(self.last))

    def ids(self) -> set[str]:
        return {f"kmsg:{BOOT}:{seq}" for seq in range(1, self.last + 1)}


@contextlib.contextmanager
def state_filesystem(work: Path, size_kib: int):
    """A tmpfs for the agent's state (root), else a plain folder; (path, can fill)."""
    folder = work / "state"
    folder.mkdir()
    if os.geteuid() != 0:
        yield folder, False
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(folder)],
        capture_output=True,
    )
    try:
        yield folder, done.returncode == 0
    finally:
        if done.returncode == 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def start_agent(ring: Ring, state: Path, endpoint: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, __file__, "--child", "--state-dir", str(state)]
    command += ["--devfs", str(ring.dev), "--procfs", str(ring.proc), "--endpoint", endpoint]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="denpex-durability-"))
    receiver = LossyReceiver(args.loss, random.Random(args.seed + 1))
    ring = Ring(work)
    stop = threading.Event()

    def produce() -> None:  # the kernel keeps logging, whatever the agent does
        while not stop.wait(0.02):
            ring.write(rng.randint(0, 3))

    producer = threading.Thread(target=produce, daemon=True)
    full_phases = 0
    started = time.monotonic()
    try:
        with state_filesystem(work, args.disk_kib) as (state, can_fill):
            producer.start()
            for cycle in range(args.cycles):
                agent = start_agent(ring, state, receiver.url)
                filler = None
                time.sleep(rng.uniform(2.0, 4.0))  # start-up takes ~1.5 s
                if can_fill and cycle % 3 == 1:
                    filler = fill(state)  # the disk fills while the agent runs
                    full_phases += 1
                    time.sleep(rng.uniform(0.5, 1.5))
                    if rng.random() < 0.5:
                        filler.unlink()  # ... and empties before the kill, or after it
                        filler = None
                        time.sleep(rng.uniform(0.2, 0.8))
                agent.send_signal(signal.SIGKILL)
                agent.wait(30)
                if filler is not None:
                    filler.unlink()
            stop.set()
            producer.join()
            agent = start_agent(ring, state, receiver.url)
            deadline = time.monotonic() + args.drain_s
            wanted = ring.ids()
            while time.monotonic() < deadline and not wanted <= set(receiver.ids):
                time.sleep(0.2)
            agent.terminate()
            agent.wait(30)
    finally:
        stop.set()
        receiver.stop()
        shutil.rmtree(work, ignore_errors=True)
    delivered = set(receiver.ids) & wanted
    return {
        "cycles": args.cycles,
        "kill_9": args.cycles,
        "disk_full_phases": full_phases,
        "receiver_loss": args.loss,
        "receiver_answers": dict(sorted(receiver.answers.items())),
        "written": len(wanted),
        "sent": receiver.sent,
        "acknowledged": receiver.acknowledged,
        "delivered": len(delivered),
        "lost": len(wanted - delivered),
        "duplicated": receiver.acknowledged - len(receiver.ids),
        "seconds": round(time.monotonic() - started, 1),
        "seed": args.seed,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--loss", type=float, default=0.3, help="share of requests refused")
    parser.add_argument("--disk-kib", type=int, default=1024, help="tmpfs size for the state")
    parser.add_argument("--drain-s", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--devfs", help=argparse.SUPPRESS)
    parser.add_argument("--procfs", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    if arguments.child:
        sys.exit(run_child_agent(arguments))
    print(json.dumps(main(arguments), indent=2))
