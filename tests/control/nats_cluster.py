"""A real NATS JetStream cluster on loopback for tests and benchmarks: N `nats-server`
processes (Debian's package, in scripts/system-packages.txt), each with its own store
folder under one temporary root and routes to the others; `kill(name)` ends one with
SIGKILL, `restart(name)` brings it back on the same ports, `stop()` ends them all and
removes the folder.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.control.pg import free_port


def nats_server_binary() -> str | None:
    return shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )


class NatsCluster:
    def __init__(self, size: int = 3, *, binary: str | None = None) -> None:
        found = binary or nats_server_binary()
        if found is None:
            raise FileNotFoundError(
                "nats-server not found: apt-get install nats-server "
                "(listed in scripts/system-packages.txt)"
            )
        self.binary = found
        self.root = Path(tempfile.mkdtemp(prefix="denpex-nats-"))
        self.names = [f"n{i + 1}" for i in range(size)]
        self.client_ports = {n: free_port() for n in self.names}
        self.route_ports = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen] = {}
        for name in self.names:
            self._write_config(name)
            self._start(name)

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{self.client_ports[n]}" for n in self.names]

    def url(self, name: str) -> str:
        return f"nats://127.0.0.1:{self.client_ports[name]}"

    def _write_config(self, name: str) -> None:
        routes = ", ".join(f"nats-route://127.0.0.1:{self.route_ports[n]}" for n in self.names)
        (self.root / name).mkdir()
        (self.root / f"{name}.conf").write_text(
            f"server_name: {name}\n"
            f"listen: 127.0.0.1:{self.client_ports[name]}\n"
            f"jetstream {{ store_dir: {self.root / name} }}\n"
            f"cluster {{ name: denpex, listen: 127.0.0.1:{self.route_ports[name]}, "
            f"routes: [{routes}] }}\n"
        )

    def _start(self, name: str) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - the process keeps it
        self.procs[name] = subprocess.Popen(
            [self.binary, "-c", str(self.root / f"{name}.conf")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def restart(self, name: str) -> None:
        self._start(name)

    def stream_leader(self, stream: str, timeout_s: float = 20.0) -> str:
        """The server name that leads `stream` (asked through any live node)."""
        return asyncio.run(self._leader(stream, timeout_s))

    async def _leader(self, stream: str, timeout_s: float) -> str:
        import nats

        live = [self.url(n) for n in self.names if self.procs[n].poll() is None]
        deadline = time.monotonic() + timeout_s
        nc = await nats.connect(servers=live, connect_timeout=2)
        try:
            while True:
                try:
                    info = await nc.jetstream().stream_info(stream)
                    if info.cluster is not None and info.cluster.leader:
                        return str(info.cluster.leader)
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no leader for stream {stream} within {timeout_s} s")
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
