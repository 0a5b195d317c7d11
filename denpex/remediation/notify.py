"""Notifications of remediation as outgoing webhooks in each receiver's own payload shape:
a Slack incoming webhook (text + Block Kit), PagerDuty Events API v2 (trigger / acknowledge /
resolve, dedup_key = the incident), a generic signed JSON notice, and the RMA hand-off
(rma.py). Notices are queued and sent by one worker thread, retried with backoff
(delivery.py), each delivered once, failures counted.

"Once" is kept by a SentMemory: the control plane's is its store (control/notice_store.py),
so a restarted or failed-over leader remembers too. A notice is claimed there before its first
try and marked sent after the receiver accepted it; a refused or unanswered one is released so
a later submission tries again. A claim that was never marked (the sender died between the
receiver's answer and the record) is not sent again: a receiver such as Slack drops no
duplicates, so at most once is the only promise that holds for all of them.

It must never block or fail a plan: submit() only queues; a receiver that is down costs
retries and a counted failure, nothing else. The payload builders are pure.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Protocol

import yaml

from denpex.core.audit import canonical
from denpex.remediation import delivery, rma

log = logging.getLogger("denpex.remediation.notify")
CHANNEL_TYPES = ("slack", "pagerduty", "webhook", "jira", "rma_webhook")


@cache
def settings() -> Mapping[str, Any]:
    text = resources.files("denpex.remediation").joinpath("notify.yaml").read_text()
    return dict(yaml.safe_load(text))


@dataclass(frozen=True)
class Notice:
    """One thing a person may want to hear about a plan."""

    kind: str  # a key of notify.yaml `kinds`
    tenant: str
    incident_id: int | None
    plan_id: int | None
    host: str
    category: str
    summary: str  # one line
    severity: str = "error"  # denpex's word (notify.yaml maps it per receiver)
    state: str | None = None  # the plan's step
    details: Mapping[str, Any] = field(default_factory=dict)
    link: str | None = None  # the plan in the UI
    ts_ns: int = field(default_factory=time.time_ns)
    serials: Sequence[str] = ()  # for RMA: the failing parts' serial numbers
    evidence: Mapping[str, str] = field(default_factory=dict)  # for RMA: file name → text
    # for RMA: file name → the object (kind/name) in the tenant's object store, read at send
    attachments: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in settings()["kinds"]:
            raise ValueError(f"unknown notice kind {self.kind!r} (notify.yaml kinds)")

    def key(self) -> str:
        """The same notice has the same key however often it is submitted."""
        body = asdict(self)
        body.pop("ts_ns")
        return hashlib.sha256(canonical(body)).hexdigest()[:32]

    def dedup_key(self) -> str:
        """PagerDuty's alert key: one alert per incident (or per plan without one)."""
        ref = (
            f"incident-{self.incident_id}"
            if self.incident_id is not None
            else f"plan-{self.plan_id}"
        )
        return f"denpex-{self.tenant}-{ref}"[:255]


def _iso(ts_ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts_ns / 1e9))


def slack_payload(notice: Notice) -> dict[str, Any]:
    """A Slack incoming-webhook message: `text` (the fallback) and Block Kit blocks."""
    facts = f"*host* `{notice.host}` · *category* `{notice.category}` · *tenant* {notice.tenant}"
    if notice.state:
        facts += f" · *step* {notice.state}"
    context = f"denpex {notice.kind} · incident {notice.incident_id} · plan {notice.plan_id}"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": notice.summary[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": facts[:3000]}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
    ]
    if notice.link:
        blocks.insert(
            2,
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": f"<{notice.link}|Open the plan>"},
            },
        )
    return {"text": f"{notice.summary} ({notice.host})"[:3000], "blocks": blocks}


def pagerduty_payload(notice: Notice, routing_key: str) -> dict[str, Any]:
    """A PagerDuty Events API v2 event; trigger carries the payload, the others only the key."""
    conf = settings()
    action = conf["pagerduty_actions"][notice.kind]
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": action,
        "dedup_key": notice.dedup_key(),
    }
    if action == "trigger":
        event["payload"] = {
            "summary": f"{notice.summary} ({notice.host})"[:1024],
            "source": notice.host,
            "severity": conf["pagerduty_severity"].get(notice.severity, "error"),
            "timestamp": _iso(notice.ts_ns),
            "component": notice.category,
            "group": notice.tenant,
            "class": notice.kind,
            "custom_details": {
                "plan": notice.plan_id,
                "incident": notice.incident_id,
                "step": notice.state,
                **dict(notice.details),
            },
        }
        event["client"] = "denpex"
        if notice.link:
            event["client_url"] = notice.link
            event["links"] = [{"href": notice.link, "text": "the plan in denpex"}]
    return event


def generic_payload(notice: Notice) -> dict[str, Any]:
    body = asdict(notice)
    body["serials"] = list(notice.serials)
    return {"schema": "denpex.notice/v1", **body}


@dataclass
class Channel:
    """One receiver, from the --notify YAML: type, url, secret_env, routing_key_env, kinds."""

    name: str
    type: str
    url: str
    kinds: tuple[str, ...]
    secret: bytes | None = None  # the HMAC key (webhook, rma_webhook) or the API token (jira)
    routing_key: str | None = None  # pagerduty
    options: Mapping[str, Any] = field(default_factory=dict)  # jira: project, issue_type

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> Channel:
        kind = str(data.get("type", ""))
        if kind not in CHANNEL_TYPES:
            raise ValueError(f"notify channel {name}: type must be one of {CHANNEL_TYPES}")
        url = str(data.get("url") or (settings()["pagerduty_url"] if kind == "pagerduty" else ""))
        if not url:
            raise ValueError(f"notify channel {name}: no url")
        kinds = tuple(
            data.get("kinds")
            or (["rma"] if kind in ("jira", "rma_webhook") else settings()["default_kinds"])
        )
        unknown = set(kinds) - set(settings()["kinds"])
        if unknown:
            raise ValueError(f"notify channel {name}: unknown kinds {sorted(unknown)}")

        def env(key: str) -> str | None:
            var = data.get(key)
            if var and var not in os.environ:
                raise ValueError(f"notify channel {name}: ${var} is not set")
            return os.environ[var] if var else None

        secret = env("secret_env")
        routing = env("routing_key_env")
        if kind == "pagerduty" and not routing:
            raise ValueError(f"notify channel {name}: pagerduty needs routing_key_env")
        extra = {k: v for k, v in data.items() if k in ("project", "issue_type", "user")}
        return cls(name, kind, url, kinds, secret.encode() if secret else None, routing, extra)


def load_channels(data: Mapping[str, Any]) -> list[Channel]:
    return [Channel.from_dict(str(n), c) for n, c in (data.get("channels") or {}).items()]


def send(
    channel: Channel,
    notice: Notice,
    *,
    sleep: Callable[[float], None] = time.sleep,
    read: rma.AttachmentReader | None = None,
) -> Any:
    """Deliver one notice to one channel; the Delivery (or the RMA ticket's record)."""
    key = f"{channel.name}-{notice.key()}"
    if channel.type == "slack":
        return delivery.post(channel.url, slack_payload(notice), delivery=key, sleep=sleep)
    if channel.type == "pagerduty":
        assert channel.routing_key is not None
        payload = pagerduty_payload(notice, channel.routing_key)
        return delivery.post(channel.url, payload, delivery=key, sleep=sleep)
    if channel.type in ("webhook", "rma_webhook"):
        payload = generic_payload(notice)
        return delivery.post(channel.url, payload, delivery=key, secret=channel.secret, sleep=sleep)
    return rma.open_jira_ticket(channel, notice, sleep=sleep, read=read)


class SentMemory(Protocol):
    """Which notices were handed to which receiver (keys: the channel's name + Notice.key())."""

    def claim(self, key: str, channel: str, notice: Notice, now_ns: int) -> bool:
        """True when nobody claimed `key` before: the caller sends it; False: never again."""
        ...

    def sent(self, key: str, record: Mapping[str, Any], now_ns: int) -> None:
        """The receiver accepted the notice claimed as `key`."""
        ...

    def release(self, key: str) -> None:
        """The notice claimed as `key` was not accepted: a later submission may try again."""
        ...


class MemoryOfSent:
    """A SentMemory of this process alone (a notifier without a store, the tests)."""

    def __init__(self) -> None:
        self._claims: dict[str, bool] = {}  # key → accepted
        self._lock = threading.Lock()

    def claim(self, key: str, channel: str, notice: Notice, now_ns: int) -> bool:
        with self._lock:
            if key in self._claims:
                return False
            self._claims[key] = False
            return True

    def sent(self, key: str, record: Mapping[str, Any], now_ns: int) -> None:
        with self._lock:
            self._claims[key] = True

    def release(self, key: str) -> None:
        with self._lock:
            if self._claims.get(key) is False:
                del self._claims[key]


class Notifier:
    """Queues notices and sends them from one worker thread; counts what happened."""

    def __init__(
        self,
        channels: Sequence[Channel],
        *,
        memory: SentMemory | None = None,
        sleep: Callable[[float], None] = time.sleep,
        attachments: rma.AttachmentReader | None = None,
    ) -> None:
        self.channels = list(channels)
        self.sleep = sleep
        self.attachments = attachments  # reads a notice's attachments from the object store
        self.counts = {"submitted": 0, "sent": 0, "failed": 0, "retries": 0, "duplicates": 0}
        self.last: dict[str, Any] = {}  # channel name → the last delivery's record
        self.memory: SentMemory = memory if memory is not None else MemoryOfSent()
        self._queue: queue.Queue[Notice | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="denpex-notify", daemon=True)
        self._thread.start()

    def submit(self, notice: Notice) -> None:
        """Queue `notice` for every channel that wants its kind; never blocks, never raises."""
        self.counts["submitted"] += 1
        self._queue.put(notice)

    def _work(self) -> None:
        while (notice := self._queue.get()) is not None:
            try:
                for channel in self.channels:
                    if notice.kind in channel.kinds:
                        self._deliver(channel, notice)
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _deliver(self, channel: Channel, notice: Notice) -> None:
        key = f"{channel.name}-{notice.key()}"
        try:
            mine = self.memory.claim(key, channel.name, notice, time.time_ns())
        except Exception as exc:  # the store is away: sending unclaimed could send twice
            log.warning("notify %s: %s not sent, no claim recorded: %s", channel.name, key, exc)
            self.counts["failed"] += 1
            return
        if not mine:
            self.counts["duplicates"] += 1
            return
        try:
            out = send(channel, notice, sleep=self.sleep, read=self.attachments)
        except Exception as exc:  # a broken receiver must not stop the others
            log.warning("notify %s: %s failed: %s", channel.name, notice.kind, exc)
            self.counts["failed"] += 1
            self.last[channel.name] = {"error": str(exc)}
            self._remember(self.memory.release, key)
            return
        record = out.to_dict() if hasattr(out, "to_dict") else dict(out)
        self.last[channel.name] = record
        self.counts["retries"] += max(0, len(record.get("attempts", [])) - 1)
        if getattr(out, "ok", record.get("ok")):
            self._remember(self.memory.sent, key, record, time.time_ns())
            self.counts["sent"] += 1
        else:
            self.counts["failed"] += 1
            self._remember(self.memory.release, key)
            log.warning("notify %s: %s not delivered: %s", channel.name, notice.kind, record)

    @staticmethod
    def _remember(call: Callable[..., None], *args: Any) -> None:
        """Record an outcome; a store that is away leaves the claim as it was (not resent)."""
        try:
            call(*args)
        except Exception as exc:
            log.warning("notify: the outcome of %s was not recorded: %s", args[0], exc)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued notice was handled (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)
