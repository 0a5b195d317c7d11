"""The RMA hand-off carries the incident's evidence bundle from the object store: the leader's
bundler stores it under the tenant's prefix, the notice names it, and the Jira ticket (a real
jira820 on loopback) gets its bytes, identical to the stored object. A bundle that cannot be
stored does not stop the hand-off: the notice says so instead."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from denpex.control.objects import ObjectError
from denpex.control.objects.bundle import read_members
from denpex.control.remediation_loop import RemediationPass
from denpex.core import jsonio
from denpex.remediation.backend import Target, TargetKind
from denpex.remediation.executor import ACTIVE, DONE, PlanRecord
from denpex.remediation.machine import Event, State, plan_steps
from denpex.remediation.notify import Channel, Notifier
from denpex.remediation.notify_log import NotifyingLog
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Tier
from tests.control.conftest import Api
from tests.control.helpers import report
from tests.remediation.test_executor import MemoryLog
from tests.remediation.test_notify import jira  # noqa: F401  (the jira820 fixture)


def rma_record(incident_id: int) -> PlanRecord:
    target = Target(TargetKind.HOST, "node1", None, "rack3")
    steps = plan_steps(["rma"])
    plan = Plan(incident_id, "gpu.fallen_off_bus", "job_root_cause", target, ("rma",), steps, "")
    return PlanRecord(1, "acme", plan, Tier.APPROVE, State.RMA, ACTIVE, None, None)


def an_incident(api: Api) -> int:
    api.post("/api/v1/reports", json=report(job="job-rma", report_id="r-rma-1"))
    api.tick()
    items = api.get("/api/v1/incidents").json()["items"]
    return next(i["id"] for i in items if i["component"]["kind"] == "job")


def test_the_jira_rma_ticket_attaches_the_bundle_read_from_the_object_store(jira, tmp_path):  # noqa: F811
    api = Api(f"sqlite:///{tmp_path / 'cp.db'}", objects_url=f"file://{tmp_path / 'objects'}")
    notifier = None
    try:
        incident_id = an_incident(api)
        fence = api.runtime._leading_fence()
        assert fence is not None, "the in-process runtime leads after its pass"
        objects = api.runtime.objects
        bundler = RemediationPass(api.runtime.db, api.runtime.store, None, objects=objects)
        channel = Channel("rma", "jira", jira, ("rma",), options={"project": "OPS"})
        notifier = Notifier([channel], sleep=lambda s: None, attachments=objects.read_for)
        log = NotifyingLog(MemoryLog(), notifier, bundle=bundler._bundler("acme", fence))
        result = {"detail": "handed to the vendor"}
        log.finish_step(
            rma_record(incident_id), State.RMA, Event.OK, result, State.DONE, DONE, time.time_ns()
        )
        assert notifier.flush(30)
        sent = notifier.last["rma"]
        name = f"incident-{incident_id}-evidence.tar.gz"
        assert sent["ok"] and sent["attached"] == ["step.json", name], sent
        issue = httpx.get(f"{jira}/rest/api/2/issue/{sent['key']}").json()
        [attachment] = [a for a in issue["fields"]["attachment"] if a["filename"] == name]
        content = httpx.get(attachment["content"]).content
        [(stored_name, _)] = objects.for_leader("acme").list("bundles")
        assert content == objects.for_leader("acme").get("bundles", stored_name)[0]
        members = read_members(content)
        assert jsonio.loads(members["incident.json"])["id"] == incident_id
        assert "reports/r-rma-1.json" in members
        assert f"[^{name}]" in issue["fields"]["description"]
    finally:
        if notifier is not None:
            notifier.close()
        api.close()


class Queued:
    """A notifier that only keeps what was submitted."""

    def __init__(self) -> None:
        self.notices: list = []

    def submit(self, notice) -> None:
        self.notices.append(notice)


def test_a_bundle_that_cannot_be_stored_is_noted_and_the_hand_off_goes_on(tmp_path: Path):
    def broken(record):
        raise ObjectError(
            "object store s3://denpex at http://127.0.0.1:9: the endpoint does not answer"
        )

    queued = Queued()
    log = NotifyingLog(MemoryLog(), queued, bundle=broken)  # type: ignore[arg-type]
    log.finish_step(rma_record(5), State.RMA, Event.OK, {"detail": "x"}, State.DONE, DONE, 1)
    [rma] = [n for n in queued.notices if n.kind == "rma"]
    assert rma.attachments == {}
    assert "does not answer" in rma.evidence["bundle-error.txt"]
