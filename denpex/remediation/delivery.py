"""Delivering one outgoing webhook (a remediation step, a notification, an RMA ticket): POST
JSON, signed when a secret is configured, retried with exponential backoff on the answers
worth retrying (webhook.yaml), with the same idempotency key on every try so the receiver can
drop duplicates. Every try is recorded: what was answered, after how long.

It must never retry a refusal (a 4xx other than the retryable ones), never change the body
between tries, and never hide the last answer: the caller gets it whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.core import jsonio, webhook_signature


@cache
def settings() -> Mapping[str, Any]:
    text = resources.files("denpex.remediation").joinpath("webhook.yaml").read_text()
    return dict(yaml.safe_load(text))


@dataclass
class Delivery:
    """What happened to one message."""

    url: str
    delivery: str  # the idempotency key
    status: int | None = None  # the last HTTP status (None: no answer at all)
    answer: Any = None  # the last answer's body (JSON when it was JSON, else text)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # why no answer came (the last try's error)

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "delivery": self.delivery,
            "status": self.status,
            "answer": self.answer,
            "attempts": self.attempts,
            "error": self.error,
        }


def _answer(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:4000]


def _retry_after(response: Any, default: float) -> float:
    value = response.headers.get("Retry-After", "")
    return float(value) if value.replace(".", "", 1).isdigit() else default


def post(
    url: str,
    payload: Any,
    *,
    delivery: str,
    secret: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    attempts: int | None = None,
    timeout_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> Delivery:
    """POST `payload` as JSON to `url` until it is accepted, refused, or out of tries."""
    try:
        import httpx
    except ImportError:
        raise RuntimeError("outgoing webhooks need httpx (pip install 'denpex[server]')") from None
    conf = settings()["delivery"]
    tries = int(attempts if attempts is not None else conf["attempts"])
    timeout = float(timeout_s if timeout_s is not None else conf["timeout_s"])
    backoff, cap = float(conf["backoff_s"]), float(conf["backoff_max_s"])
    retryable = {int(s) for s in conf["retry_statuses"]}
    body = jsonio.dumps(payload)
    out = Delivery(url, delivery)
    with httpx.Client(timeout=timeout) as http:
        for attempt in range(1, tries + 1):
            sent = {"Content-Type": "application/json", **(headers or {})}
            sent[webhook_signature.DELIVERY_HEADER] = delivery
            if secret is not None:  # signed per try: the timestamp is the time of sending
                sent.update(webhook_signature.sign(secret, body, clock(), delivery))
            started = time.monotonic()
            wait = min(cap, backoff * 2 ** (attempt - 1))
            try:
                response = http.post(url, content=body, headers=sent)
            except httpx.HTTPError as exc:
                out.error = f"{type(exc).__name__}: {exc}"
                out.attempts.append({"attempt": attempt, "error": out.error})
            else:
                out.status, out.answer, out.error = response.status_code, _answer(response), None
                out.attempts.append(
                    {
                        "attempt": attempt,
                        "status": response.status_code,
                        "seconds": round(time.monotonic() - started, 3),
                    }
                )
                if out.ok or response.status_code not in retryable:
                    return out
                wait = min(cap, max(wait, _retry_after(response, wait)))
            if attempt < tries:
                sleep(wait)
    return out
