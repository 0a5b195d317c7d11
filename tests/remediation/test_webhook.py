"""The webhook backend against a real HTTP receiver on loopback that plays a site's tool: it
verifies the HMAC signature and the replay window, drops duplicate deliveries by their key,
keeps a node table; denpex retries 503s with backoff, does not retry a 4xx, records the
receiver's answer, and a whole plan runs through the executor on it."""

from __future__ import annotations

import time

import pytest

from denpex.core import jsonio, webhook_signature
from denpex.remediation.backend import BackendError, Operation, Target, TargetKind
from denpex.remediation.executor import ACTIVE, DONE, Executor, PlanRecord
from denpex.remediation.machine import State, plan_steps
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Tier, parse_policy
from denpex.remediation.webhook import SCHEMA, WebhookBackend
from tests.remediation.test_executor import MemoryLog
from tests.remediation.webhook_receiver import Received, Receiver

SECRET = b"site-shared-secret"
T = Target(TargetKind.HOST, "bm7", None, "rack3")


class SiteTool:
    """What a site's tool does with denpex's steps (a node table, duplicates dropped)."""

    def __init__(self, *, fail_first: int = 0, refuse: bool = False) -> None:
        self.fail_first, self.refuse = fail_first, refuse
        self.nodes = {"bm7": {"schedulable": True, "reason": None}}
        self.done: list[str] = []  # deliveries acted on, once each
        self.rejected: list[str] = []

    def __call__(self, got: Received) -> tuple[int, dict[str, str], bytes]:
        try:
            webhook_signature.verify(SECRET, got.body, got.headers, time.time())
        except webhook_signature.SignatureError as exc:
            self.rejected.append(str(exc))
            return 401, {}, jsonio.dumps({"error": str(exc)})
        if self.fail_first > 0:
            self.fail_first -= 1
            return 503, {"Retry-After": "0"}, b"busy"
        if self.refuse:
            return 422, {}, jsonio.dumps({"error": "bm7 is not ours to touch"})
        step = jsonio.loads(got.body)
        assert step["schema"] == SCHEMA
        op, key = step["op"], got.headers[webhook_signature.DELIVERY_HEADER]
        if op == "pool_hosts":
            return 200, {}, jsonio.dumps({"hosts": sorted(self.nodes)})
        node = self.nodes[step["target"]["host"]]
        if op == "state":
            answer = {**node, "drained": not node["schedulable"], "jobs": []}
            return 200, {}, jsonio.dumps(answer)
        duplicate = key in self.done
        if not duplicate:
            self.done.append(key)
            if op in ("cordon", "drain", "rma"):
                node.update(schedulable=False, reason=step["params"]["reason"])
            elif op == "resume":
                node.update(schedulable=True, reason=None)
        answer = {"ok": True, "changed": not duplicate, "detail": f"{op} done by the site tool"}
        return 200, {}, jsonio.dumps({**answer, "ticket": f"OPS-{len(self.done)}"})


def backend(url: str, **kw) -> WebhookBackend:
    return WebhookBackend(url, secret=SECRET, sleep=lambda s: None, **kw)


def test_a_signed_step_is_acted_on_once_and_read_back():
    tool = SiteTool()
    with Receiver(tool) as rx:
        wb = backend(rx.url)
        assert wb.available() is None
        out = wb.cordon(T, reason="denpex: incident 9 gpu.fallen_off_bus", timeout_s=5)
        assert out.ok and out.changed
        assert out.record["answer"]["ticket"] == "OPS-1"  # the receiver's own answer, kept
        again = wb.cordon(T, reason="denpex: incident 9 gpu.fallen_off_bus", timeout_s=5)
        assert again.ok and not again.changed  # same delivery key: dropped as a duplicate
        state = wb.state(T, timeout_s=5)
        assert not state.schedulable and state.reason.startswith("denpex: incident 9")
        assert wb.pool_hosts("rack3", timeout_s=5) == ("bm7",)
    keys = {r.headers[webhook_signature.DELIVERY_HEADER] for r in rx.received[:2]}
    assert len(keys) == 1 and tool.rejected == []


def test_retries_with_backoff_then_succeeds_and_counts_every_try():
    waits: list[float] = []
    with Receiver(SiteTool(fail_first=3)) as rx:
        wb = WebhookBackend(rx.url, secret=SECRET, sleep=waits.append, attempts=5)
        out = wb.drain(T, reason="denpex: incident 9 x", timeout_s=5)
    assert out.ok
    assert [a.get("status") for a in out.record["delivery"]["attempts"]] == [503, 503, 503, 200]
    assert waits == [0.5, 1.0, 2.0]  # webhook.yaml: 0.5 s doubled (Retry-After: 0 is shorter)


def test_a_refusal_is_not_retried_and_fails_the_step():
    tool = SiteTool(refuse=True)
    with Receiver(tool) as rx, pytest.raises(BackendError, match="answered 422"):
        backend(rx.url).evict(T, reason="denpex: incident 9 x", timeout_s=5)
    assert len(rx.received) == 1


def test_the_receiver_refuses_a_bad_signature_and_a_replay():
    tool = SiteTool()
    with Receiver(tool) as rx:
        with pytest.raises(BackendError, match="401"):
            WebhookBackend(rx.url, secret=b"wrong", sleep=lambda s: None).cordon(
                T, reason="r", timeout_s=5
            )
        # a captured request sent again ten minutes later is outside the replay window
        body = b'{"op":"resume"}'
        old = webhook_signature.sign(SECRET, body, time.time() - 600, "replayed")
        with pytest.raises(webhook_signature.SignatureError, match="replay window"):
            webhook_signature.verify(SECRET, body, old, time.time())
        fresh = webhook_signature.sign(SECRET, body, time.time(), "fresh")
        with pytest.raises(webhook_signature.SignatureError, match="does not match"):
            webhook_signature.verify(SECRET, body + b" ", fresh, time.time())
    assert tool.rejected and tool.done == []


def test_no_receiver_is_an_error_not_a_success():
    wb = backend("http://127.0.0.1:9", attempts=2)
    with pytest.raises(BackendError, match="no answer"):
        wb.perform(Operation.CORDON, T, {"reason": "r", "timeout_s": 2})


def test_a_whole_plan_runs_on_the_webhook_backend():
    tool = SiteTool()
    plan = Plan(
        9,
        "gpu.fallen_off_bus",
        "job_root_cause",
        T,
        ("drain_node",),
        plan_steps(["drain_node"]),
        "",
    )
    policy = parse_policy({"tier": "autoremediate"})
    with Receiver(tool) as rx:
        log = MemoryLog()
        record = PlanRecord(1, "t", plan, Tier.AUTOREMEDIATE, State.CORDON, ACTIVE, None, None)
        final = Executor(backend(rx.url), log, policy).run(record, time.time_ns())
    assert final.status == DONE and final.state is State.DONE
    ops = [jsonio.loads(r.body)["op"] for r in rx.received]
    assert ops[0] == "pool_hosts"  # the blast-radius guard asked for the pool first
    assert [o for o in ops if o != "pool_hosts"] == [
        "cordon",
        "drain",
        "checkpoint",
        "evict",
        "requeue",
        "diagnostics",
        "resume",
    ]
    assert tool.nodes["bm7"]["schedulable"] is True
