"""The wrapper's listening end of the SDK wire: a Unix socket in a private (0700) directory
whose path `denpex run` hands the job in DENPEX_SDK_SOCKET; any descendant may connect.

Opened in the relay before the analyzer forks; only the analyzer accepts and reads it, with
non-blocking polls, so it never touches the child's output relay. Never raises on bad peers.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import tempfile
import time

from denpex.core.events import Event, Evidence
from denpex.core.sdk_wire import SOCKET_ENV, DecodeStats, LineDecoder

_SOCKET_NAME = "sdk.sock"
_MAX_PATH = 100  # sun_path holds 108 bytes on Linux; keep a margin
_MAX_CONNECTIONS = 4096  # more than any node runs ranks + DataLoader workers
_READ_BYTES = 1 << 16
_POLL_BUDGET_BYTES = 8 << 20  # per poll(): one chatty process cannot starve the session


class SdkListener:
    """Accepts SDK connections and turns their JSON lines into Evidence and Events."""

    def __init__(self, directory: str, sock: socket.socket) -> None:
        self.directory = directory
        self.path = os.path.join(directory, _SOCKET_NAME)
        self._sock = sock
        sock.setblocking(False)  # accept() in poll() must never wait
        self._owner = os.getpid()  # only the process that made the directory removes it
        self._peers: dict[int, tuple[socket.socket, LineDecoder]] = {}
        self.stats = DecodeStats()
        self.connections = 0
        self.refused_connections = 0
        self.closed = False

    @classmethod
    def open(cls, parent_dir: str | None = None) -> SdkListener:
        """Bind a listening socket in a new private directory (mode 0700, like mkdtemp)."""
        base = parent_dir or tempfile.gettempdir()
        if len(os.path.join(base, "denpex-sdk-XXXXXXXX", _SOCKET_NAME)) > _MAX_PATH:
            base = "/tmp"  # a long TMPDIR would not fit in sun_path
        directory = tempfile.mkdtemp(prefix="denpex-sdk-", dir=base)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # non-inheritable by default
        try:
            sock.bind(os.path.join(directory, _SOCKET_NAME))
            sock.listen(128)
        except OSError:
            sock.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls(directory, sock)

    def environ(self) -> dict[str, str]:
        """What the job's environment must carry to reach this listener."""
        return {SOCKET_ENV: self.path}

    def fileno(self) -> int:
        return self._sock.fileno()

    def poll(self, timeout: float = 0.0) -> list[Evidence | Event]:
        """Accept new peers and read what has arrived; waits at most `timeout` seconds."""
        if self.closed:
            return []
        self._accept()
        out: list[Evidence | Event] = []
        if not self._peers:
            return out
        try:
            ready, _, _ = select.select(list(self._peers), [], [], timeout)
        except (OSError, ValueError):
            return out
        budget = _POLL_BUDGET_BYTES
        for fd in ready:
            budget -= self._read(fd, out, budget)
            if budget <= 0:
                break
        return out

    def drain(self, deadline_s: float = 0.5) -> list[Evidence | Event]:
        """After the job ended: read until every peer has closed, for at most deadline_s (a
        descendant that outlives the job may keep its connection open)."""
        out: list[Evidence | Event] = []
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            got = self.poll(0.02)
            out.extend(got)
            if not self._peers and not got:
                break
        return out

    def _accept(self) -> int:
        accepted = 0
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return accepted
            except OSError:
                return accepted  # out of descriptors or memory: a later poll retries
            if len(self._peers) >= _MAX_CONNECTIONS:
                self.refused_connections += 1
                conn.close()
                continue
            conn.setblocking(False)
            self._peers[conn.fileno()] = (conn, LineDecoder(self.stats))
            self.connections += 1
            accepted += 1

    def _read(self, fd: int, out: list[Evidence | Event], budget: int) -> int:
        conn, decoder = self._peers[fd]
        used = 0
        while used < budget:
            try:
                data = conn.recv(_READ_BYTES)
            except (BlockingIOError, InterruptedError):
                return used
            except OSError:
                data = b""
            if not data:
                out.extend(decoder.finish())
                conn.close()
                del self._peers[fd]
                return used
            used += len(data)
            out.extend(decoder.feed(data))
        return used

    def close(self) -> None:
        """Close every connection and the socket; the process that opened it also removes
        the socket file and its directory."""
        self.closed = True
        for conn, _ in self._peers.values():
            with contextlib.suppress(OSError):
                conn.close()
        self._peers.clear()
        with contextlib.suppress(OSError):
            self._sock.close()
        if os.getpid() == self._owner:
            shutil.rmtree(self.directory, ignore_errors=True)
