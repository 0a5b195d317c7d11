"""A local OpenAI-compatible chat-completions server that can also misbehave.

`mode` picks the answer: `good` rewrites faithfully (every citation it was asked to keep),
`drop` leaves one out, `invent` adds one it was never given, `recause` drops the root
cause's name, `http500`, `garbage` (not JSON), `empty` (no choices) and `slow` (answers
after the client gave up). Every request body is kept in `requests` for the test to read.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, mode: str = "good", delay_s: float = 3.0) -> None:
        self.mode = mode
        self.delay_s = delay_s
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "body": body})
                status, payload = fake.answer(body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # `slow`: the client has gone

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def answer(self, body: dict) -> tuple[int, object]:
        user = body["messages"][-1]["content"]
        keep = re.findall(r"\[([^\]]+)\]", user.rsplit("Citations to keep:", 1)[-1])
        summary = user.splitlines()[1]
        root = re.search(r"^Root cause \(name it word for word\): (\S+)$", user, re.M)
        cause = f"Root cause: {root.group(1)}. " if root else ""
        text = f"{cause}In short: {summary} See " + ", ".join(f"[{c}]" for c in keep) + "."
        if self.mode == "drop":
            text = text.replace(f"[{keep[-1]}]", "")
        elif self.mode == "invent":
            text += " Also like [incident:999]."
        elif self.mode == "recause":
            text = "Probably a cosmic ray. See " + ", ".join(f"[{c}]" for c in keep) + "."
        elif self.mode == "http500":
            return 500, {"error": {"message": "model not loaded"}}
        elif self.mode == "garbage":
            return 200, b"<html>not json</html>"
        elif self.mode == "empty":
            return 200, {"choices": []}
        elif self.mode == "slow":
            time.sleep(self.delay_s)
        return 200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
