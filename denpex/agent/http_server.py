"""The agent's HTTP/1.1 server, on asyncio in one background thread: TCP (optionally TLS,
optionally requiring a client certificate) and a Unix socket whose peers are known by their
credentials (SO_PEERCRED). One request per connection.

Bounded everywhere, so that no client can exhaust the agent: the request head must arrive
whole within a deadline and under a size cap, a body needs a Content-Length (no chunked
bodies) under 64 KiB and its own deadline, the connections held at once are capped (the
oldest still sending its request makes room for a new one), and handlers run in a small
worker pool, with `/healthz` on a worker of its own. An idle connection costs a descriptor,
never a thread. Handlers are plain functions; they never see a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import http.client
import io
import os
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from denpex.agent.config import is_loopback
from denpex.core import jsonio

BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))


@dataclass(frozen=True, slots=True)
class Limits:
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 64 * 1024
    head_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    max_connections: int = 128
    workers: int = 4


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is asking: over TCP its address (an IPv4-mapped one unwrapped) and whether it
    proved itself with a client certificate; over the Unix socket the kernel's word on its
    uid and pid."""

    transport: str  # "tcp" | "unix"
    address: str | None = None
    loopback: bool = False
    certificate: bool = False
    uid: int | None = None
    pid: int | None = None


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: http.client.HTTPMessage
    body: bytes
    peer: Peer


@dataclass(slots=True)
class Response:
    status: HTTPStatus
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def error(status: HTTPStatus, message: str, **headers: str) -> Response:
    return Response(status, jsonio.dumps({"error": message}), headers=dict(headers))


Handler = Callable[[Request], Response]


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


class HttpServer:
    """Listen with `listen_tcp` / `listen_unix` (errors surface there, in the caller),
    then `start()`; `stop()` closes everything and returns within a few seconds."""

    def __init__(
        self,
        handler: Handler,
        *,
        limits: Limits | None = None,
        own_worker: frozenset[str] = frozenset(("/healthz",)),
    ) -> None:
        self.handler = handler
        self.limits = limits or Limits()
        self.own_worker = own_worker
        self._listeners: list[tuple[socket.socket, ssl.SSLContext | None, str]] = []
        self._socket_files: list[str] = []  # removed by stop()
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="api")
        self._own_pool = ThreadPoolExecutor(1, thread_name_prefix="api-health")
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.StreamWriter, bool] = {}  # writer → still reading
        self.refused_total = 0  # connections closed to make room or for a bad request

    # -- listening ----------------------------------------------------------------------
    def listen_tcp(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> socket.socket:
        if ":" in host:
            # dual stack: IPv4 clients arrive as ::ffff:a.b.c.d (Peer unwraps them)
            sock = socket.create_server(
                (host, port), family=socket.AF_INET6, dualstack_ipv6=host == "::", reuse_port=False
            )
        else:
            sock = socket.create_server((host, port))
        self._listeners.append((sock, tls, "tcp"))
        return sock

    def listen_unix(self, path: str, mode: int, group: str | None = None) -> socket.socket:
        """A socket at `path` (mode and group set before anyone can connect), or an
        abstract one for `@name`. A stale socket file is replaced; a live one refused."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if path.startswith("@"):
                sock.bind("\0" + path[1:])
            else:
                _remove_stale_socket(path)
                previous = os.umask(0o177)  # nobody can connect before the chmod below
                try:
                    sock.bind(path)
                finally:
                    os.umask(previous)
                self._socket_files.append(path)
                if group:
                    os.chown(path, -1, grp.getgrnam(group).gr_gid)
                os.chmod(path, mode)
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        self._listeners.append((sock, None, "unix"))
        return sock

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop.run_forever, name="api", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open_servers(), self._loop).result(10)

    async def _open_servers(self) -> None:
        limit = self.limits.max_head_bytes
        for sock, tls, transport in self._listeners:
            if transport == "unix":
                server = await asyncio.start_unix_server(self._serve_unix, sock=sock, limit=limit)
            else:
                server = await asyncio.start_server(
                    self._serve_tcp,
                    sock=sock,
                    limit=limit,
                    ssl=tls,
                    ssl_handshake_timeout=self.limits.head_timeout_s if tls else None,
                )
            self._servers.append(server)

    def stop(self) -> None:
        if self._thread is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        for sock, _tls, _transport in self._listeners:
            sock.close()
        for path in self._socket_files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._own_pool.shutdown(wait=False, cancel_futures=True)

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._connections):
            writer.close()

    # -- one connection -----------------------------------------------------------------
    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        address = str((writer.get_extra_info("peername") or ("",))[0]).split("%")[0]
        if address.startswith("::ffff:") and "." in address:
            address = address.removeprefix("::ffff:")  # an IPv4 client of a dual-stack socket
        certificate = bool(writer.get_extra_info("peercert"))
        peer = Peer("tcp", address, is_loopback(address), certificate)
        await self._serve(reader, writer, peer)

    async def _serve_unix(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = writer.get_extra_info("socket")
        creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        await self._serve(reader, writer, Peer("unix", uid=uid, pid=pid))

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        if not self._make_room():
            self.refused_total += 1
            await self._send(writer, error(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections"))
            return
        self._connections[writer] = True
        try:
            try:
                request = await self._read(reader, peer)
            except _Refused as refused:
                self.refused_total += 1
                await self._send(writer, refused.response)
                return
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                return  # the client went away
            self._connections[writer] = False  # answered now, never evicted
            pool = self._own_pool if request.path in self.own_worker else self._pool
            loop = asyncio.get_running_loop()
            response = await loop.run_in_executor(pool, self._call, request)
            await self._send(writer, response, head_only=request.method == "HEAD")
        finally:
            self._connections.pop(writer, None)
            writer.close()

    def _make_room(self) -> bool:
        """At the cap, the oldest connection still sending its request is closed."""
        if len(self._connections) < self.limits.max_connections:
            return True
        for writer, reading in self._connections.items():
            if reading:
                self.refused_total += 1
                writer.close()
                self._connections.pop(writer)
                return True
        return False

    async def _read(self, reader: asyncio.StreamReader, peer: Peer) -> Request:
        limits = self.limits
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), limits.head_timeout_s)
        except TimeoutError:
            raise _Refused(
                error(HTTPStatus.REQUEST_TIMEOUT, "the request head took too long")
            ) from None
        except (asyncio.LimitOverrunError, ValueError):
            raise _Refused(
                error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")
            ) from None
        line, _, rest = head.partition(b"\r\n")
        parts = line.decode("latin-1").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Refused(error(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request line"))
        method, target, _version = parts
        try:
            headers = http.client.parse_headers(io.BytesIO(rest))
        except http.client.HTTPException:
            raise _Refused(
                error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
            ) from None
        body = await self._read_body(reader, method, headers)
        url = urlsplit(target)
        return Request(method, url.path, parse_qs(url.query), headers, body, peer)

    async def _read_body(
        self, reader: asyncio.StreamReader, method: str, headers: http.client.HTTPMessage
    ) -> bytes:
        if headers.get("Transfer-Encoding"):
            raise _Refused(
                error(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, not a chunked body")
            )
        lengths = headers.get_all("Content-Length") or []
        if not lengths:
            if method in BODY_METHODS:
                raise _Refused(error(HTTPStatus.LENGTH_REQUIRED, "a body needs a Content-Length"))
            return b""
        text = lengths[0].strip()
        if len(set(lengths)) != 1 or not text.isdigit():
            raise _Refused(
                error(HTTPStatus.BAD_REQUEST, "Content-Length must be one non-negative integer")
            )
        length = int(text)
        if length > self.limits.max_body_bytes:
            raise _Refused(
                error(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                    f"body over {self.limits.max_body_bytes} bytes",
                )
            )
        try:
            return await asyncio.wait_for(reader.readexactly(length), self.limits.body_timeout_s)
        except TimeoutError:
            raise _Refused(
                error(HTTPStatus.REQUEST_TIMEOUT, "the request body took too long")
            ) from None

    def _call(self, request: Request) -> Response:
        try:
            return self.handler(request)
        except Exception as exc:  # a handler bug answers 500, it does not end the server
            return error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    async def _send(
        self, writer: asyncio.StreamWriter, response: Response, *, head_only: bool = False
    ) -> None:
        status = response.status
        lines = [f"HTTP/1.1 {status.value} {status.phrase}", "Server: denpex-agent"]
        lines += [f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}"]
        lines += [f"{k}: {v}" for k, v in response.headers.items()] + ["Connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + (b"" if head_only else response.body))
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout_s)


def _remove_stale_socket(path: str) -> None:
    """A socket file left by an agent that died can go; one that answers cannot."""
    if not os.path.exists(path):
        return
    import stat as stat_module

    if not stat_module.S_ISSOCK(os.lstat(path).st_mode):
        raise FileExistsError(f"{path} exists and is not a socket: choose another api.socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody answers: stale
        return
    finally:
        probe.close()
    raise OSError(98, f"another agent answers on {path}")
