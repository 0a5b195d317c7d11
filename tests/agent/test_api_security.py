"""The agent API lets no stranger in and cannot be exhausted, tried for real: reads from
another network namespace (ip netns + veth) need the token, registration from another user
(setpriv --reuid=65534) is accepted only for that user's own processes, a dual-stack
listener counts ::ffff:127.0.0.1 as loopback, bodies without a sane Content-Length are
refused, idle connections cost no thread and never starve /healthz, and 20,000
registrations cost a bounded amount of /proc work each."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.agent.config import ConfigError, load_config
from denpex.agent.daemon import Agent
from denpex.agent.jobs import JobTable
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.lite.agent_link import AgentLink
from tests.agent import netns

TOKEN = "s3cret-token-for-tests"

GET = """
import sys, urllib.request, urllib.error
request = urllib.request.Request(sys.argv[1], method=sys.argv[3] if len(sys.argv) > 3 else "GET",
                                 data=b'{"pid": 1}' if len(sys.argv) > 3 else None)
if sys.argv[2]:
    request.add_header("Authorization", "Bearer " + sys.argv[2])
try:
    with urllib.request.urlopen(request, timeout=10) as reply:
        print(reply.status)
except urllib.error.HTTPError as refused:
    print(refused.code)
"""

# Runs a list of operations on the agent's Unix socket; SELF is this process's pid, CHILD a
# child of it (a process of the same user), ROOT the pid given as argv[3]
UNIX_OPS = """
import json, os, socket, subprocess, sys
path, ops, root_pid = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
children = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
def call(method, target, body=None):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {target} HTTP/1.1\\r\\nHost: agent\\r\\nContent-Length: {len(data)}\\r\\n\\r\\n"
    s.sendall(head.encode() + data)
    reply = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        reply += chunk
    return int(reply.split(b" ", 2)[1]), reply.split(b"\\r\\n\\r\\n", 1)[1].decode()
def fill(value):
    text = json.dumps(value).replace('"SELF"', str(os.getpid())).replace('"ROOT"', str(root_pid))
    for i, child in enumerate(children):
        text = text.replace(f'"CHILD{i}"', str(child.pid))
    return json.loads(text)
results = []
for method, target, body in ops:
    target = target.replace("SELF", str(os.getpid())).replace("ROOT", str(root_pid))
    results.append(call(method, target, fill(body) if body is not None else None))
for child in children:
    child.kill()
print(json.dumps(results))
"""


_SOCKET_DIRS: list[Path] = []


def socket_dir() -> Path:
    """A folder other users can reach (pytest's tmp_path is private to root); removed after
    the test that made it."""
    folder = Path(tempfile.mkdtemp(prefix="denpex-api-", dir="/tmp"))
    folder.chmod(0o755)
    _SOCKET_DIRS.append(folder)
    return folder


@pytest.fixture(autouse=True)
def _remove_socket_dirs() -> Iterator[None]:
    yield
    while _SOCKET_DIRS:
        shutil.rmtree(_SOCKET_DIRS.pop(), ignore_errors=True)


@pytest.fixture
def token_file(tmp_path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def start_agent(tmp_path: Path, listen: str, **api) -> Agent:
    folder = socket_dir()
    overrides = {
        "listen": listen,
        "state_dir": str(tmp_path / "state"),
        "api.socket": str(folder / "agent.sock"),
        "api.socket_mode": "0666",
    }
    overrides.update({f"api.{k}": v for k, v in api.items()})
    agent = Agent(load_config(overrides=overrides), collector_classes=())
    agent.start()
    return agent


def port_of(agent: Agent) -> int:
    assert agent.api is not None
    return int(agent.api.url.rsplit(":", 1)[1])


# --- another host ------------------------------------------------------------------------


def test_listening_off_loopback_without_a_token_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"api\.token_file"):
        load_config(overrides={"listen": "0.0.0.0:9478"})
    with pytest.raises(ConfigError, match=r"api\.token_file"):
        load_config(overrides={"listen": "[::]:9478"})
    load_config(overrides={"listen": "0.0.0.0:9478", "api.token_file": "/etc/denpex/token"})


@pytest.mark.parametrize("metrics", ["token", "open"])
def test_reads_from_another_host_need_the_token(tmp_path, token_file, metrics) -> None:
    why_not = netns.unavailable_reason()
    if why_not:
        pytest.skip(why_not)
    agent = start_agent(tmp_path, "0.0.0.0:0", token_file=str(token_file), metrics=metrics)
    try:
        with netns.other_host() as other:
            base = f"http://{other.host_address}:{port_of(agent)}"

            def status(path: str, token: str = "", *method: str) -> int:
                done = netns.run_python(GET, base + path, token, *method, netns=other.name)
                assert done.returncode == 0, done.stderr
                return int(done.stdout)

            assert status("/healthz") == 200
            assert status("/v1/evidence?since=0") == 401
            assert status("/v1/jobs") == 401
            assert status("/v1/evidence?since=0", "wrong-token") == 401
            assert status("/v1/evidence?since=0", TOKEN) == 200
            assert status("/v1/jobs", TOKEN) == 200
            assert status("/metrics") == (200 if metrics == "open" else 401)
            assert status("/metrics", TOKEN) == 200
            assert status("/v1/register", TOKEN, "POST") == 403  # never over TCP
        local = netns.run_python(GET, f"http://127.0.0.1:{port_of(agent)}/v1/jobs", "")
        assert local.stdout.strip() == "200"  # loopback reads need none
    finally:
        agent.stop()


# --- another user ------------------------------------------------------------------------


def test_another_user_registers_only_their_own_processes(tmp_path) -> None:
    why_not = netns.setpriv_reason()
    if why_not:
        pytest.skip(why_not)
    agent = start_agent(tmp_path, "127.0.0.1:0", max_registrations_per_user=3)
    try:
        mine = AgentLink(agent.config.socket, timeout_s=5)
        assert mine.register(Registration(pid=os.getpid(), job="root-job")), mine.reason
        ops = [
            ("POST", "/v1/register", {"pid": "ROOT", "job": "stolen"}),
            ("POST", "/v1/register", {"pid": 1, "job": "stolen"}),
            ("POST", "/v1/register", {"pid": "SELF", "job": "mine"}),
            ("POST", "/v1/register", {"pid": "CHILD0", "job": "mine", "cgroup": "/"}),
            ("POST", "/v1/register", {"pid": "CHILD0", "job": "mine"}),
            ("POST", "/v1/register", {"pid": "CHILD1", "job": "mine"}),
            ("POST", "/v1/register", {"pid": "CHILD2", "job": "mine"}),  # a fourth: over the cap
            ("DELETE", "/v1/register/ROOT", None),
            ("GET", "/v1/jobs", None),
            ("GET", "/v1/evidence?since=0&pid=ROOT", None),
            ("GET", "/v1/evidence?since=0&job=root-job", None),
            ("DELETE", "/v1/register/SELF", None),
        ]
        done = netns.run_python(
            UNIX_OPS, agent.config.socket, json.dumps(ops), str(os.getpid()), user=netns.NOBODY
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
        statuses = [status for status, _body in results]
        assert statuses == [403, 403, 201, 403, 201, 201, 429, 403, 200, 403, 403, 204], results
        listed = json.loads(results[8][1])["jobs"]
        assert {j["job"] for j in listed} == {"mine"}  # only their own
        assert "uid 0" in results[0][1] and "not to you" in results[0][1]
        owners = {r.pid: agent.jobs.owner(r.pid) for r in agent.jobs.snapshot()}
        assert owners[os.getpid()] == 0 and set(owners.values()) == {0, netns.NOBODY}
    finally:
        agent.stop()


# --- dual stack --------------------------------------------------------------------------


def test_ipv4_mapped_loopback_is_loopback_on_a_dual_stack_listener(tmp_path, token_file) -> None:
    from denpex.agent.config import is_loopback

    assert is_loopback("::ffff:127.0.0.1") and is_loopback("::1") and is_loopback("127.0.0.7")
    assert not is_loopback("::ffff:10.0.0.1") and not is_loopback("::")
    agent = start_agent(tmp_path, "[::]:0", token_file=str(token_file))
    try:
        port = port_of(agent)
        for address in ("127.0.0.1", "[::1]"):
            done = netns.run_python(GET, f"http://{address}:{port}/v1/evidence?since=0", "")
            assert done.stdout.strip() == "200", (address, done.stdout, done.stderr)
        link = AgentLink(agent.config.socket, timeout_s=5)  # what denpex run does
        assert link.register(Registration(pid=os.getpid(), job="dual")), link.reason
        reason = netns.unavailable_reason()
        if reason is None:
            with netns.other_host() as other:
                url = f"http://{other.host_address}:{port}/v1/evidence?since=0"
                done = netns.run_python(GET, url, "", netns=other.name)
                assert done.stdout.strip() == "401"  # an IPv4 stranger is no loopback
    finally:
        agent.stop()


# --- exhaustion --------------------------------------------------------------------------


def raw_request(address: tuple[str, int] | str, data: bytes, timeout: float = 10.0) -> bytes:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.sendall(data)
        reply = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return reply
            reply += chunk


@pytest.mark.parametrize(
    "head,status",
    [
        (b"POST /v1/register HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400"),
        (b"POST /v1/register HTTP/1.1\r\nContent-Length: 1e9\r\n\r\n", b"400"),
        (b"POST /v1/register HTTP/1.1\r\n\r\n", b"411"),
        (b"POST /v1/register HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
        (b"POST /v1/register HTTP/1.1\r\nContent-Length: 150000000\r\n\r\n", b"413"),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
    ],
    ids=["length-1", "length-1e9", "no-length", "chunked", "150MB", "20KB-header"],
)
def test_a_body_without_a_sane_length_is_refused_before_it_is_read(tmp_path, head, status):
    agent = start_agent(tmp_path, "127.0.0.1:0")
    try:
        for address in (agent.config.socket, ("127.0.0.1", port_of(agent))):
            reply = raw_request(address, head)
            assert reply.split(b" ", 2)[1] == status, reply[:200]
        reply = raw_request(("127.0.0.1", port_of(agent)), b"GET /healthz HTTP/1.1\r\n\r\n")
        assert reply.split(b" ", 2)[1] == b"200"
    finally:
        agent.stop()


def test_sixty_idle_connections_cost_no_thread_and_healthz_still_answers(tmp_path) -> None:
    agent = start_agent(tmp_path, "127.0.0.1:0")
    idle: list[socket.socket] = []
    try:
        address = ("127.0.0.1", port_of(agent))
        threads_before = threading.active_count()
        for i in range(60):
            sock = socket.create_connection(address, timeout=5)
            if i % 2:
                sock.sendall(b"GET /v1/evi")  # a request that never ends (slowloris)
            idle.append(sock)
        time.sleep(0.3)
        assert threading.active_count() - threads_before <= 2  # no thread per connection
        reply = raw_request(address, b"GET /healthz HTTP/1.1\r\n\r\n", timeout=5)
        assert reply.split(b" ", 2)[1] == b"200"
        flood = [socket.create_connection(address, timeout=5) for _ in range(200)]  # past the cap
        reply = raw_request(address, b"GET /healthz HTTP/1.1\r\n\r\n", timeout=5)
        assert reply.split(b" ", 2)[1] == b"200"  # the oldest idle ones made room
        for sock in flood:
            sock.close()
    finally:
        for sock in idle:
            sock.close()
        agent.stop()


class CountingRoots:
    """Roots that count every /proc path the job table asks for: its work, not its time."""

    def __init__(self) -> None:
        self.real = Roots()
        self.calls = 0

    def proc(self, *parts):
        self.calls += 1
        return self.real.proc(*parts)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def test_twenty_thousand_registrations_cost_bounded_work_each() -> None:
    roots = CountingRoots()
    table = JobTable(roots)  # type: ignore[arg-type]
    base = 3_900_000  # above any pid in use here (pid_max is 4194304)
    for i in range(20_000):
        table.register(Registration(pid=base + i, job=f"job-{i % 100}"))
    registering = roots.calls
    assert registering <= 20_000 + 10, registering  # one cgroup read each, nothing per table

    processes = len(os.listdir("/proc"))
    roots.calls = 0
    table.refresh()
    assert roots.calls <= 3 * processes + 10, (roots.calls, processes)  # not per registration

    roots.calls = 0
    assert table.lookup(cgroup="/nowhere/job") is None
    found = table.lookup(base + 19_999)
    assert found is not None and found.job == "job-99"
    assert roots.calls <= 10, roots.calls
