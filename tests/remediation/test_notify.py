"""Notifications and the RMA hand-off against local receivers: Slack and PagerDuty receivers
that validate each payload against the receiver's published shape (schemas/) and answer as
the service does, a signed generic receiver, and Jira Data Center's REST v2 as jira820 serves
it. Failures are retried and counted and never block the caller; nothing is sent twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from denpex.core import jsonio, webhook_signature
from denpex.remediation.notify import (
    Channel,
    Notice,
    Notifier,
    load_channels,
    pagerduty_payload,
    slack_payload,
)
from tests.remediation.webhook_receiver import Received, Receiver

SCHEMAS = Path(__file__).parent / "schemas"
ROUTING_KEY = "R0123456789abcdef0123456789abcde"  # 32 characters, as PagerDuty's are
SECRET = b"notify-secret"


def schema(name: str) -> jsonschema.Validator:
    data = jsonio.loads((SCHEMAS / name).read_bytes())
    cls = jsonschema.validators.validator_for(data)
    return cls(data, format_checker=cls.FORMAT_CHECKER)


SLACK, PAGERDUTY = schema("slack_incoming_webhook.json"), schema("pagerduty_events_v2.json")


def notice(kind: str = "plan.waiting", **kw) -> Notice:
    base = dict(
        tenant="acme",
        incident_id=7,
        plan_id=3,
        host="gpu-n17",
        category="gpu.fallen_off_bus",
        summary="GPU 3 fell off the bus; the plan waits for approval",
        severity="critical",
        state="evict",
        link="https://denpex.example/ui/plans/3",
    )
    return Notice(kind, **{**base, **kw})


class Slack:
    """Answers as Slack's incoming webhooks do: 200 `ok`, 400 `invalid_payload`."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first

    def __call__(self, got: Received):
        if self.fail_first:
            self.fail_first -= 1
            return 503, {}, b"service_unavailable"
        errors = list(SLACK.iter_errors(jsonio.loads(got.body)))
        if errors:
            return 400, {}, b"invalid_payload"
        return 200, {"Content-Type": "text/html"}, b"ok"


def pagerduty(got: Received):
    """Answers as the Events API v2 does: 202 with the dedup key, 400 `invalid event`."""
    event = jsonio.loads(got.body)
    errors = [e.message for e in PAGERDUTY.iter_errors(event)]
    if errors:
        body = {"status": "invalid event", "message": "Event object is invalid", "errors": errors}
        return 400, {}, jsonio.dumps(body)
    answer = {"status": "success", "message": "Event processed", "dedup_key": event["dedup_key"]}
    return 202, {}, jsonio.dumps(answer)


def test_payloads_match_the_receivers_shapes():
    for kind in ("plan.proposed", "plan.waiting", "step.finished", "plan.done", "plan.failed"):
        SLACK.validate(slack_payload(notice(kind)))
        PAGERDUTY.validate(pagerduty_payload(notice(kind), ROUTING_KEY))
    long = notice(summary="x" * 5000)
    SLACK.validate(slack_payload(long))
    PAGERDUTY.validate(pagerduty_payload(long, ROUTING_KEY))
    # the validators do reject what the services reject
    assert list(PAGERDUTY.iter_errors({"routing_key": ROUTING_KEY, "event_action": "trigger"}))
    assert list(
        SLACK.iter_errors({"blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}]})
    )


def test_pagerduty_triggers_acknowledges_and_resolves_one_alert_per_incident():
    actions = {
        k: pagerduty_payload(notice(k), ROUTING_KEY)
        for k in ("plan.waiting", "step.finished", "plan.done")
    }
    assert [a["event_action"] for a in actions.values()] == ["trigger", "acknowledge", "resolve"]
    assert {a["dedup_key"] for a in actions.values()} == {"denpex-acme-incident-7"}
    assert "payload" not in actions["plan.done"]


def test_notifier_delivers_retries_counts_and_never_duplicates(monkeypatch):
    monkeypatch.setenv("PD_KEY", ROUTING_KEY)
    monkeypatch.setenv("HOOK_SECRET", SECRET.decode())
    seen_generic: list[dict] = []

    def generic(got: Received):
        webhook_signature.verify(SECRET, got.body, got.headers, time.time())
        seen_generic.append(jsonio.loads(got.body))
        return 204, {}, b""

    with (
        Receiver(Slack(fail_first=2)) as slack,
        Receiver(pagerduty) as pd,
        Receiver(generic) as hook,
    ):
        channels = load_channels(
            {
                "channels": {
                    "ops-slack": {"type": "slack", "url": slack.url},
                    "oncall": {
                        "type": "pagerduty",
                        "url": pd.url,
                        "routing_key_env": "PD_KEY",
                        "kinds": ["plan.waiting", "step.finished", "plan.done"],
                    },
                    "site": {"type": "webhook", "url": hook.url, "secret_env": "HOOK_SECRET"},
                }
            }
        )
        notifier = Notifier(channels, sleep=lambda s: None)
        started = time.monotonic()
        for kind in ("plan.waiting", "step.finished", "plan.done"):
            notifier.submit(notice(kind))
        notifier.submit(notice("plan.waiting"))  # the same notice again: not sent twice
        assert time.monotonic() - started < 0.5  # submit() only queues
        assert notifier.flush(30)
        notifier.close()
    assert [jsonio.loads(r.body)["event_action"] for r in pd.received] == [
        "trigger",
        "acknowledge",
        "resolve",
    ]
    assert len(slack.received) == 2 + 2  # two 503s retried, then plan.waiting and plan.done
    assert [g["kind"] for g in seen_generic] == ["plan.waiting", "plan.done"]
    assert notifier.counts["sent"] == 2 + 3 + 2
    assert notifier.counts["retries"] == 2 and notifier.counts["duplicates"] == 3
    assert notifier.counts["failed"] == 0


def test_a_receiver_that_is_down_is_counted_and_blocks_nothing():
    down = Channel("gone", "slack", "http://127.0.0.1:9", ("plan.failed",))
    notifier = Notifier([down], sleep=lambda s: None)
    notifier.submit(notice("plan.failed"))
    assert notifier.flush(60)
    notifier.close()
    assert notifier.counts["failed"] == 1 and notifier.counts["sent"] == 0
    assert len(notifier.last["gone"]["attempts"]) == 5  # webhook.yaml: five tries


def test_bad_channel_config_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="routing_key_env"):
        load_channels({"channels": {"p": {"type": "pagerduty"}}})
    with pytest.raises(ValueError, match="is not set"):
        load_channels(
            {
                "channels": {
                    "w": {"type": "webhook", "url": "http://x", "secret_env": "DENPEX_NO_SUCH_VAR"}
                }
            }
        )
    with pytest.raises(ValueError, match="unknown notice kind"):
        notice("plan.exploded")


@pytest.fixture(scope="module")
def jira(tmp_path_factory) -> Iterator[str]:
    with Receiver(lambda got: (200, {}, b"")) as probe:  # a free port, released at once
        port = probe.server.server_address[1]
    env = {
        **os.environ,
        "JIRA820_PORT": str(port),
        "JIRA820_HOST": "127.0.0.1",
        "JIRA820_PROJECT_KEY": "OPS",
    }
    log = (tmp_path_factory.mktemp("jira") / "jira820.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jira820"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/rest/api/2/serverInfo", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("jira820 did not answer in 30 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_rma_ticket_in_jira_with_serials_and_evidence_opened_once(jira):
    rma = notice(
        "rma",
        summary="gpu-n17 failed diagnostics twice: RMA",
        serials=["1652021021517"],
        evidence={"incident.json": '{"id": 7}', "nvidia-smi-q.txt": "Serial Number : 16520"},
    )
    channel = Channel("rma", "jira", jira, ("rma",), options={"project": "OPS"})
    notifier = Notifier([channel], sleep=lambda s: None)
    notifier.submit(rma)
    assert notifier.flush(30)
    first = notifier.last["rma"]
    assert first["ok"] and first["created"], first
    assert first["attached"] == ["incident.json", "nvidia-smi-q.txt"]
    # a new leader (a fresh notifier) hands the same incident off again: the ticket is found
    again = Notifier([channel], sleep=lambda s: None)
    again.submit(rma)
    assert again.flush(30)
    second = again.last["rma"]
    assert second["ok"] and not second["created"] and second["key"] == first["key"]
    assert second["attached"] == []
    issue = httpx.get(f"{jira}/rest/api/2/issue/{first['key']}").json()
    assert "1652021021517" in issue["fields"]["description"]
    assert "denpex-acme-incident-7" in issue["fields"]["labels"]
    names = sorted(a["filename"] for a in issue["fields"]["attachment"])
    assert names == ["incident.json", "nvidia-smi-q.txt"]
    notifier.close()
    again.close()


def test_the_executor_notifies_each_step_and_the_end_of_the_plan():
    from denpex.remediation.backend import Target, TargetKind
    from denpex.remediation.executor import ACTIVE, Executor, PlanRecord
    from denpex.remediation.machine import State, plan_steps
    from denpex.remediation.notify_log import NotifyingLog
    from denpex.remediation.plan import Plan
    from denpex.remediation.policy import Tier, parse_policy
    from denpex.remediation.webhook import WebhookBackend
    from tests.remediation.test_executor import MemoryLog
    from tests.remediation.test_webhook import SECRET as SITE_SECRET
    from tests.remediation.test_webhook import SiteTool

    kinds: list[str] = []

    def hook(got: Received):
        kinds.append(jsonio.loads(got.body)["kind"])
        return 200, {}, b""

    target = Target(TargetKind.HOST, "bm7", None, "rack3")
    plan = Plan(
        9,
        "gpu.fallen_off_bus",
        "job_root_cause",
        target,
        ("retry_job",),
        plan_steps(["retry_job"]),
        "",
    )
    with Receiver(SiteTool()) as site, Receiver(hook) as rx:
        every = tuple(sorted({"step.finished", "plan.done", "plan.waiting"}))
        notifier = Notifier([Channel("all", "webhook", rx.url, every)], sleep=lambda s: None)
        log = NotifyingLog(MemoryLog(), notifier, link="https://denpex.example/ui")
        backend = WebhookBackend(site.url, secret=SITE_SECRET, sleep=lambda s: None)
        approve = PlanRecord(1, "t", plan, Tier.APPROVE, State.REROUTE, ACTIVE, None, None)
        Executor(backend, log, parse_policy({"tier": "approve"})).run(approve, time.time_ns())
        auto = PlanRecord(2, "t", plan, Tier.AUTOREMEDIATE, State.REROUTE, ACTIVE, None, None)
        Executor(backend, log, parse_policy({"tier": "autoremediate"})).run(auto, time.time_ns())
        assert notifier.flush(30)
        notifier.close()
    assert kinds == ["plan.waiting", "step.finished", "plan.done"]
