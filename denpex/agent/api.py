"""The agent's local API: `/healthz`, `/metrics`, `/v1/evidence`, `/v1/jobs` over HTTP, and
registration (`/v1/register`, what `denpex run` uses) on a Unix socket.

Who may do what: `/healthz` answers anyone. Over TCP, a loopback client reads freely; any
other needs the bearer token of `api.token_file` (or a client certificate the `api.tls`
client CA signed), and so does `/metrics` unless `api.metrics: open`. Registration is
refused over TCP: on the socket the kernel names the caller (SO_PEERCRED), who may register
only processes of their own uid and remove only their own registrations, and reads only the
evidence of their own jobs; root may do all of it. Handlers only read snapshots: a slow
client never holds a lock a collector needs.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from denpex.agent.config import AgentConfig, parse_listen
from denpex.agent.exposition import AgentView, render
from denpex.agent.http_server import HttpServer, Peer, Request, Response, error
from denpex.agent.jobs import RegistrationRefused, process_uid
from denpex.core import jsonio
from denpex.core.wire import Registration, WireError, evidence_to_dict

FRESH_TIMEOUT_S = 2.0  # `fresh=1`: the longest a caller waits for every collector to poll
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
REALM = 'Bearer realm="denpex-agent"'


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def read_token(path: str | None) -> bytes | None:
    """The bearer token from `api.token_file` (surrounding whitespace ignored)."""
    if not path:
        return None
    token = Path(path).read_bytes().strip()
    if not token:
        raise ValueError(f"api.token_file {path} is empty")
    return token


def tls_context(settings: dict[str, Any] | None) -> ssl.SSLContext | None:
    """HTTPS from `api.tls`; with a client_ca_file every client must show a certificate it
    signed (mTLS), which then stands for the token."""
    if not settings:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings["cert_file"], settings["key_file"])
    if settings.get("client_ca_file"):
        context.load_verify_locations(settings["client_ca_file"])
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class AgentApi:
    """Serves `config.listen` and the registration socket until `stop()`."""

    def __init__(
        self,
        config: AgentConfig,
        view: AgentView,
        health: Callable[[], dict[str, Any]],
        refresh: Callable[[float], list[str]] | None = None,
        requeue: Callable[[], int] | None = None,
    ) -> None:
        self.view = view
        self.health = health
        self.refresh = refresh
        self.requeue = requeue
        self.token = read_token(config.api.get("token_file"))
        self.metrics_open = config.api.get("metrics") == "open"
        self.server = HttpServer(self.handle)
        host, port = parse_listen(config.listen)
        self._tcp = self.server.listen_tcp(host, port, tls_context(config.api.get("tls")))
        self.https = bool(config.api.get("tls"))
        self.socket_path = config.socket
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.server.listen_unix(
            self.socket_path, int(config.api["socket_mode"]), config.api.get("socket_group")
        )

    @property
    def url(self) -> str:
        address, port = self._tcp.getsockname()[:2]
        host = str(address)
        scheme = "https" if self.https else "http"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    # -- dispatch -----------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        try:
            return self._route(request)
        except ApiError as exc:
            extra = {"WWW-Authenticate": REALM} if exc.status == HTTPStatus.UNAUTHORIZED else {}
            return error(exc.status, str(exc), **extra)

    def _route(self, request: Request) -> Response:
        path, peer = request.path, request.peer
        if request.method in ("GET", "HEAD"):
            if path == "/healthz":
                report = self.health()
                ok = report["status"] == "ok"
                status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
                return Response(status, jsonio.dumps(report))
            if path == "/metrics":
                if not (self.metrics_open or peer.transport == "unix"):
                    self._authenticate(request)
                return Response(HTTPStatus.OK, render(self.view), PROMETHEUS_TEXT)
            if path in ("/v1/evidence", "/v1/jobs"):
                if peer.transport == "tcp":
                    self._authenticate(request)
                return self._evidence(request) if path == "/v1/evidence" else self._jobs(peer)
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        if path == "/v1/register" or path.startswith(("/v1/register/", "/v1/spool/")):
            if peer.transport != "unix":
                raise ApiError(
                    HTTPStatus.FORBIDDEN,
                    "registration is accepted on the agent's Unix socket only (api.socket), "
                    "where the kernel names the caller; denpex run uses it",
                )
            if request.method == "POST" and path == "/v1/register":
                return self._register(request)
            if request.method == "DELETE" and path.startswith("/v1/register/"):
                return self._unregister(path, peer)
            if request.method == "POST" and path == "/v1/spool/requeue":
                return self._requeue(peer)
        raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {request.method} {path}")

    def _authenticate(self, request: Request) -> None:
        peer = request.peer
        if peer.loopback or peer.certificate:
            return
        offered = request.headers.get("Authorization", "")
        scheme, _, credential = offered.partition(" ")
        if (
            self.token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(credential.strip().encode(), self.token)
        ):
            return
        raise ApiError(HTTPStatus.UNAUTHORIZED, "a bearer token is needed (api.token_file)")

    # -- reads ----------------------------------------------------------------------------
    def _evidence(self, request: Request) -> Response:
        query, peer = request.query, request.peer
        since = _int_param(query, "since") or 0
        pid = _int_param(query, "pid")
        job = query.get("job", [None])[0]
        own: set[int] | None = None  # the peer's registered pids; None: everything
        jobs = self.view.pipeline.jobs
        if peer.transport == "unix" and peer.uid != 0:
            owned = jobs.owned_by(peer.uid if peer.uid is not None else -1)
            own = {r.pid for r in owned}
            if pid is not None:
                registration = jobs.lookup(pid)
                if registration is None or registration.pid not in own:
                    raise ApiError(HTTPStatus.FORBIDDEN, f"pid {pid} is not a job of yours")
            if job is not None and job not in {r.job for r in owned}:
                raise ApiError(HTTPStatus.FORBIDDEN, f"job {job} is not yours")
        late: list[str] = []
        if query.get("fresh", ["0"])[0] == "1" and self.refresh is not None:
            late = self.refresh(FRESH_TIMEOUT_S)  # poll everything now: nothing in flight
        found = self.view.pipeline.evidence_since(since, pid=pid, job=job)
        if own is not None:
            # by the registration the evidence is attributed to, never by a job's name
            # (a name is whatever the registrant said)
            found = [e for e in found if _registered_pid(jobs, e) in own]
        body = {
            "host": self.view.host,
            "evidence": [evidence_to_dict(e) for e in found],
            "not_refreshed": late,
        }
        return Response(HTTPStatus.OK, jsonio.dumps(body))

    def _jobs(self, peer: Peer) -> Response:
        jobs = self.view.pipeline.jobs
        mine = peer.transport == "unix" and peer.uid != 0
        listed = jobs.owned_by(peer.uid or -1) if mine else jobs.snapshot()
        return Response(HTTPStatus.OK, jsonio.dumps({"jobs": [r.to_dict() for r in listed]}))

    # -- registration (Unix socket only) --------------------------------------------------
    def _register(self, request: Request) -> Response:
        try:
            registration = Registration.from_dict(jsonio.loads(request.body))
        except WireError as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, str(exc)) from None
        except ValueError:
            raise ApiError(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        jobs = self.view.pipeline.jobs
        uid = request.peer.uid
        owner = process_uid(jobs.roots, registration.pid)
        # a short job is often gone by the time denpex's analyzer registers it: root may still
        # claim its evidence (the pid cannot be checked any more, root is trusted anyway)
        if owner is None and uid != 0:
            raise ApiError(HTTPStatus.NOT_FOUND, f"no process {registration.pid} here")
        if uid != 0 and owner != uid:
            raise ApiError(
                HTTPStatus.FORBIDDEN,
                f"process {registration.pid} belongs to uid {owner}, not to you (uid {uid})",
            )
        try:
            stored = jobs.register(registration, owner=uid)
        except RegistrationRefused as exc:
            raise ApiError(HTTPStatus(exc.status), str(exc)) from None
        return Response(HTTPStatus.CREATED, jsonio.dumps(stored.to_dict()))

    def _unregister(self, path: str, peer: Peer) -> Response:
        pid = path.rpartition("/")[2]
        if not pid.isdigit():
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {path}")
        try:
            found = self.view.pipeline.jobs.unregister(int(pid), owner=peer.uid)
        except RegistrationRefused as exc:
            raise ApiError(HTTPStatus(exc.status), str(exc)) from None
        if not found:
            raise ApiError(HTTPStatus.NOT_FOUND, f"pid {pid} is not registered")
        return Response(HTTPStatus.NO_CONTENT)

    def _requeue(self, peer: Peer) -> Response:
        if peer.uid != 0:
            raise ApiError(HTTPStatus.FORBIDDEN, "only root may requeue the dead-letter segment")
        if self.requeue is None:
            raise ApiError(HTTPStatus.CONFLICT, "this agent has no spool (no otlp.endpoint)")
        return Response(HTTPStatus.OK, jsonio.dumps({"requeued": self.requeue()}))


def _registered_pid(jobs: Any, evidence: Any) -> int | None:
    event = evidence.event
    cgroup = event.attrs.get("cgroup")
    if event.pid is None and not isinstance(cgroup, str):
        return None
    registration = jobs.lookup(event.pid, cgroup if isinstance(cgroup, str) else None)
    return registration.pid if registration is not None else None


def _int_param(query: dict[str, list[str]], name: str) -> int | None:
    values = query.get(name)
    if not values:
        return None
    try:
        return int(values[0])
    except ValueError:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"{name} must be an integer") from None
