"""Fixtures of the control-plane tests: a real PostgreSQL cluster (session-wide, stopped at
the end), a fresh database per test on either engine, tokens, and a server in-process
(FastAPI's TestClient) or as a real `denpex server` process."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.control.pg import PgCluster, free_port, pg_bindir

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    bindir = pg_bindir()
    if bindir is None:
        pytest.fail(
            "PostgreSQL server binaries not found: apt-get install postgresql "
            "(listed in scripts/system-packages.txt)"
        )
    cluster = PgCluster(bindir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    return pg_cluster.create_database(f"t{os.getpid()}_{next(_names)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'control.db'}"
    return request.getfixturevalue("pg_url")


def mint(url: str, tenant: str, role: str) -> str:
    from denpex.control.db import Database
    from denpex.control.store import Store
    from denpex.enterprise import mint_token

    db = Database(url)
    try:
        db.migrate()
        minted = mint_token()
        Store(db).add_token(minted.token_id, tenant, role, minted.secret_hash, time.time_ns())
    finally:
        db.dispose()
    return minted.token


class ServerProcess:
    """`denpex server` as users start it, on a free loopback port."""

    def __init__(self, url: str, log: Path, *extra: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = url
        self.log = log
        self._args = [
            *(sys.executable, "-m", "denpex", "server", "--db", url),
            *("--listen", f"127.0.0.1:{self.port}", *extra),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> ServerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self._args, stdout=out, stderr=out)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"server did not answer: {self.log.read_text()[-2000:]}")

    def health(self) -> dict:
        import orjson

        with urllib.request.urlopen(self.base + "/healthz", timeout=5) as reply:
            return orjson.loads(reply.read())

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
                self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def server_processes(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


class Api:
    """The app in-process (TestClient) over a fresh store; `tick()` runs one leader pass."""

    def __init__(self, url: str, **options) -> None:
        from fastapi.testclient import TestClient

        from denpex.control.api import create_app
        from denpex.control.server import Runtime, ServerOptions

        self.url = url
        self.runtime = Runtime(ServerOptions(url=url, token_cache_s=0.0, **options))
        self.client = TestClient(create_app(self.runtime))
        self.tokens: dict[tuple[str, str], str] = {}

    def token(self, tenant: str = "acme", role: str = "operator") -> str:
        if (tenant, role) not in self.tokens:
            self.tokens[(tenant, role)] = mint(self.url, tenant, role)
        return self.tokens[(tenant, role)]

    def headers(self, tenant: str = "acme", role: str = "operator", **extra: str) -> dict:
        return {"Authorization": f"Bearer {self.token(tenant, role)}", **extra}

    def get(self, path: str, tenant: str = "acme", role: str = "viewer", **kw):
        return self.client.get(path, headers=self.headers(tenant, role), **kw)

    def post(self, path: str, tenant: str = "acme", role: str = "operator", **kw):
        headers = {**self.headers(tenant, role), **kw.pop("headers", {})}
        return self.client.post(path, headers=headers, **kw)

    def tick(self) -> None:
        self.runtime.tick(time.time_ns())

    def close(self) -> None:
        self.client.close()
        self.runtime.stop_loop()


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    app = Api(db_url)
    yield app
    app.close()
