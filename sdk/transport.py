"""How SDK evidence leaves the training process: to the `denpex run` wrapper's Unix socket
(path in DENPEX_SDK_SOCKET), else to stderr as `denpex-sdk: {json}` lines `denpex scan` reads.
Metrics travel over the socket only: on stderr the job's log gets findings (and coverage and
drop notices), one line each, never the SDK's numbers.

It never raises into the training loop and never blocks it: emit() only encodes and appends to
a bounded queue (full: the message is dropped and counted); a daemon thread does all I/O.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import socket
import threading
import time
from collections.abc import Mapping

from denpex.core.events import Event, Evidence, metric
from denpex.core.sdk_wire import SOCKET_ENV, STDERR_PREFIX, SdkWireError, encode_message

QUEUE_CAPACITY = 10_000
CLOSE_DEADLINE_S = 2.0  # at exit: how long pending messages may take to leave
_SEND_TIMEOUT_S = 2.0  # a wrapper that stops reading costs the writer thread this, never the loop
_RETRY_S = 1.0  # between attempts to reach a socket that is gone
_IDLE_WAIT_S = 0.5
DROPPED_METRIC = "sdk_dropped_messages"


class Transport:
    """One process's link to the local denpex; after fork() the child gets its own (by pid)."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        capacity: int = QUEUE_CAPACITY,
        stderr_fd: int = 2,
        rank: int | None = None,
    ) -> None:
        self.socket_path = socket_path or None
        self.capacity = capacity
        self.stderr_fd = stderr_fd
        self.rank = rank
        self.host = socket.gethostname()
        self.sent = 0  # messages written (socket or stderr)
        self.dropped = 0  # messages lost: queue full, or could not be written
        self.encode_errors = 0
        self.suppressed = 0  # metrics not written: the log gets findings only
        self._reported_dropped = 0
        self._pid = -1
        self._closed = False
        self._reset_for_this_process()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Transport:
        """The wrapper's socket when `denpex run` set DENPEX_SDK_SOCKET, else stderr lines."""
        env = os.environ if environ is None else environ
        rank_text = env.get("RANK", "")
        rank = int(rank_text) if rank_text.isdigit() else None
        return cls(env.get(SOCKET_ENV) or None, rank=rank)

    @property
    def mode(self) -> str:
        return "socket" if self.socket_path else "stderr"

    # -- the training thread's side: cheap, never raises, never blocks ---------------------
    def emit(self, item: Evidence | Event) -> None:
        """Queue one message; dropped (and counted) when the queue is full or closed."""
        try:
            if self._pid != os.getpid():
                self._reset_for_this_process()
            if self._closed:
                self.dropped += 1
                return
            is_metric = isinstance(item, Event) and item.kind == "metric"
            if is_metric and not self.socket_path:
                self.suppressed += 1
                return
            line = encode_message(self._stamped(item))
            if len(self._queue) >= self.capacity:
                self.dropped += 1
                return
            self._queue.append((line, is_metric))
            self._start_writer()
            self._wake.set()
        except SdkWireError:
            self.encode_errors += 1
        except Exception:  # whatever happens here must not reach the training loop
            self.dropped += 1

    def flush(self, timeout: float = CLOSE_DEADLINE_S) -> bool:
        """Wait up to `timeout` for queued messages to be written; True when all were."""
        if self._pid != os.getpid():
            return not self._queue
        deadline = time.monotonic() + timeout
        self._wake.set()
        while (self._queue or self._busy) and time.monotonic() < deadline:
            if self._writer is None or not self._writer.is_alive():
                self._write_pending()  # no writer thread (not started, or the process is exiting)
                break
            time.sleep(0.005)
        return not self._queue and not self._busy

    def close(self, timeout: float = CLOSE_DEADLINE_S) -> None:
        """Flush (up to `timeout`), report drops, disconnect. Later emits are dropped."""
        with contextlib.suppress(Exception):
            if self._pid != os.getpid() or self._closed:
                return
            self.flush(timeout)
            self._closed = True
            self._stop = True
            self._wake.set()
            if self._writer is not None:
                self._writer.join(max(0.1, timeout / 4))
            if self._queue and self.socket_path:
                # the wrapper is unreachable: the log is the last place these can still be read
                self.socket_path = None
                self._write_pending()
            self._report_drops(final=True)
            self._disconnect()

    # -- internals -------------------------------------------------------------------------
    def _reset_for_this_process(self) -> None:
        """Fresh queue, lock, writer and connection: nothing of the parent's is reused."""
        self._pid = os.getpid()
        self._queue: collections.deque[tuple[bytes, bool]] = collections.deque()  # (line, metric)
        self._wake = threading.Event()
        self._start_lock = threading.Lock()
        self._writer: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._next_connect = 0.0
        self._stop = False
        self._busy = False
        self.sent = self.dropped = self.encode_errors = self._reported_dropped = 0
        self.suppressed = 0

    def _stamped(self, item: Evidence | Event) -> Evidence | Event:
        """Fill host, pid and rank the producer left empty (on the item's own event)."""
        event = item.event if isinstance(item, Evidence) else item
        if not isinstance(event, Event):
            return item  # the encoder refuses it, with a reason
        if event.host is None:
            event.host = self.host
        if event.pid is None:
            event.pid = self._pid
        if event.rank is None and self.rank is not None:
            event.rank = self.rank
        if event.ts_ns is None:
            event.ts_ns = time.time_ns()
        return item

    def _start_writer(self) -> None:
        if self._writer is not None:
            return
        with self._start_lock:
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._writer_loop, name="denpex-sdk-transport", daemon=True
                )
                self._writer.start()

    def _writer_loop(self) -> None:
        while not self._stop:
            self._wake.wait(_IDLE_WAIT_S)
            self._wake.clear()
            with contextlib.suppress(Exception):
                self._write_pending()

    def _write_pending(self) -> None:
        queue = self._queue
        while queue:
            if self.socket_path and not self._connected():
                return  # kept queued (bounded) until the socket is back
            self._busy = True  # before popleft: flush() must never see "empty and idle" early
            try:
                try:
                    line, is_metric = queue.popleft()
                except IndexError:
                    return
                if is_metric and not self.socket_path:
                    self.suppressed += 1  # the socket went away: metrics stay out of the log
                elif self._write_line(line):
                    self.sent += 1
                    self._report_drops()
                elif self.socket_path:
                    queue.appendleft((line, is_metric))  # resent once reconnected
                    return
                else:
                    self.dropped += 1
            finally:
                self._busy = False

    def _write_line(self, line: bytes) -> bool:
        if not self.socket_path:
            try:
                os.write(self.stderr_fd, STDERR_PREFIX + line)  # one write(2): one whole line
            except OSError:
                return False
            return True
        sock = self._sock
        if sock is None:
            return False
        try:
            sock.sendall(line)
        except OSError:
            self._disconnect()
            self._next_connect = time.monotonic() + _RETRY_S
            return False
        return True

    def _connected(self) -> bool:
        if self._sock is not None:
            return True
        if time.monotonic() < self._next_connect or not self.socket_path:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(_SEND_TIMEOUT_S)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            self._next_connect = time.monotonic() + _RETRY_S
            return False
        self._sock = sock
        return True

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _report_drops(self, final: bool = False) -> None:
        """Once the link works again (or at close): one metric event with the drop count."""
        lost = self.dropped - self._reported_dropped
        if lost <= 0:
            return
        self._reported_dropped = self.dropped
        event = metric(
            DROPPED_METRIC,
            self.dropped,
            source="sdk",
            counter=True,
            labels={"transport": self.mode},
        )
        try:
            line = encode_message(self._stamped(event))
        except SdkWireError:
            return
        if final or not self._queue:
            if self._write_line(line):
                self.sent += 1
        else:
            self._queue.append((line, False))


# --- the process-wide transport ---------------------------------------------------------------
_default: Transport | None = None
_default_lock = threading.Lock()


def default_transport() -> Transport:
    """The process-wide transport, created on first use from the environment."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Transport.from_env()
                atexit.register(_close_default)
    return _default


def default_emit(item: Evidence | Event) -> None:
    """Send one Evidence or Event to the local denpex; never raises, never blocks."""
    try:
        default_transport().emit(item)
    except Exception:  # the training loop must never see an SDK failure
        pass


def _close_default() -> None:
    transport = _default
    if transport is not None:
        transport.close(CLOSE_DEADLINE_S)


def _forget_default_in_child() -> None:
    """After fork: the parent's lock may be held by a thread that does not exist here."""
    global _default_lock
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_default_in_child)
