"""The control plane served over HTTP on loopback from inside the test process (the same
Runtime, app and uvicorn server `denpex server` runs), so a browser test can give the leader a
remediation backend of its own (tests/control/ui/plans.py): `denpex server` itself only
knows the real schedulers' backends."""

from __future__ import annotations

import threading
import time
import urllib.request
from typing import Any

from tests.control.pg import free_port


class LiveServer:
    def __init__(self, url: str, *, backend: Any = None, **options: Any) -> None:
        from denpex.control.server import Runtime, ServerOptions

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.runtime = Runtime(
            ServerOptions(
                url=url, port=self.port, token_cache_s=0.0, loop_interval_s=0.2, **options
            )
        )
        if backend is not None:
            self.runtime.remediation.remediation.backend = backend
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> LiveServer:
        import uvicorn

        from denpex.control.api import create_app

        config = uvicorn.Config(
            create_app(self.runtime),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="live-server", daemon=True)
        self._thread.start()
        self.runtime.start_loop()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError("the in-process server did not answer")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(20)
        self.runtime.stop_loop()
