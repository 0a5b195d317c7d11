"""A real PostgreSQL cluster on loopback for tests and benchmarks: initdb into a temporary
folder (as the `postgres` user when we are root: initdb refuses root), pg_ctl start on a
free port with its socket in that folder, stopped (and removed) by `stop()`.

Databases are created owned by `denpex_owner`, a LOGIN CREATEROLE role that is not a
superuser: the server runs as it, as it would in production, so row-level security applies.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

OWNER = "denpex_owner"


def pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).parent if which else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgCluster:
    def __init__(self, bindir: Path, *, fsync: bool = False, settings: str = "") -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="denpex-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            f"-c fsync={'on' if fsync else 'off'} -c synchronous_commit=off "
            f"-c max_connections=200 -c shared_buffers=256MB {settings}"
        )
        self._options = options
        self.resume()
        self.admin(f"CREATE ROLE {OWNER} LOGIN CREATEROLE")

    def resume(self) -> None:
        """Start the server (again, after `pause`), on the same port and data."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            self._options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def pause(self) -> None:
        """Stop the server, keeping its data (`resume` brings it back)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self._as_user, str(self.bindir / tool), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.root,
        )

    def admin(self, sql: str, dbname: str = "postgres") -> list[tuple]:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True
        ) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str) -> str:
        """A fresh database owned by the non-superuser owner; returns its URL."""
        self.admin(f"CREATE DATABASE {name} OWNER {OWNER}")
        return self.url(name)

    def url(self, name: str, user: str = OWNER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
