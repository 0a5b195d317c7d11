"""The control plane inside another process: `denpex agent --control-plane embedded`.

For a small cluster with one head node: the head node's agent also serves the API, the UI
and ingest from one SQLite file, with no second daemon to install. The same Runtime as
`denpex server` (migrations, leader loop, retention) runs on a thread beside the agent, and
the agent ships its evidence to it over OTLP/HTTP like any other agent, with a bearer token
of its own (minted once, kept in a 0600 file beside the database, reused while it is valid).

It must never print or log the agent's token, and never start a second control plane on a
database another one already leads: one head node, one writer.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denpex.control.server import Runtime, ServerOptions
from denpex.control.store import Store
from denpex.enterprise import mint_token, parse_token

START_TIMEOUT_S = 60.0
AGENT_ROLE = "operator"  # ingests evidence and reports; reads what it sent
TOKEN_NOTE = "the embedded control plane's own agent"


@dataclass(frozen=True, slots=True)
class EmbeddedSettings:
    state_dir: Path  # <agent state dir>/control-plane: the database, the token, the KEK
    host: str = "127.0.0.1"
    port: int = 9479
    tenant: str = "default"
    url: str | None = None  # default: SQLite under state_dir

    @property
    def db_url(self) -> str:
        return self.url or f"sqlite:///{self.state_dir / 'control.db'}"

    @property
    def token_file(self) -> Path:
        return self.state_dir / "agent.token"


class EmbeddedControlPlane:
    """Runtime + uvicorn on a daemon thread; `start()` returns once it accepts requests."""

    def __init__(self, settings: EmbeddedSettings) -> None:
        self.settings = settings
        self.runtime: Runtime | None = None
        self._server: Any = None  # uvicorn.Server (imported lazily)
        self._thread: threading.Thread | None = None
        self.port = settings.port

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def start(self) -> None:
        import uvicorn

        from denpex.control.api import create_app

        self.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        options = ServerOptions(
            url=self.settings.db_url,
            host=self.settings.host,
            port=self.settings.port,
            kms_url=os.environ.get("DENPEX_KMS")
            or f"file://{self.settings.state_dir / 'kek.json'}",
            objects_url=os.environ.get("DENPEX_OBJECTS")
            or f"file://{self.settings.state_dir / 'objects'}",
        )
        self.runtime = Runtime(options)
        self._ensure_agent_token(self.runtime.store)
        config = uvicorn.Config(
            create_app(self.runtime),
            host=options.host,
            port=options.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
        )
        self._server = server = uvicorn.Server(config)
        # uvicorn installs no signal handlers off the main thread: the agent keeps its own
        self._thread = threading.Thread(target=server.run, name="denpex-control-plane", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.runtime.stop_loop()
                raise OSError(
                    f"the embedded control plane did not start on "
                    f"{self.settings.host}:{self.settings.port}"
                )
            time.sleep(0.02)
        self.port = server.servers[0].sockets[0].getsockname()[1]  # port 0: the one bound
        self.runtime.start_loop()

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self.runtime is not None:
            self.runtime.stop_loop(timeout)

    def _ensure_agent_token(self, store: Store) -> None:
        """The token file holds a live token of this database, or gets a fresh one."""
        path = self.settings.token_file
        try:
            parsed = parse_token(path.read_text())
        except OSError:
            parsed = None
        if parsed is not None:
            record = store.find_token(parsed[0])
            if record is not None and not record.revoked and record.tenant == self.settings.tenant:
                return
        minted = mint_token()
        store.add_token(
            minted.token_id,
            self.settings.tenant,
            AGENT_ROLE,
            minted.secret_hash,
            time.time_ns(),
            TOKEN_NOTE,
        )
        partial = path.with_name(path.name + ".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(minted.token + "\n")
        os.replace(partial, path)
