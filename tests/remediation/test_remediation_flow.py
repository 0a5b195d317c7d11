"""Remediation end to end on a real Slurm cluster, through the control plane's API in-process:
a failed job report → incident → plan under the tenant's policy → the leader's executor →
Slurm. Observe only records; AutoSafe runs the reversible steps and waits at eviction;
Approve waits at every step for a named human; the guards hold the second host of a small
pool; every decision and step lands in an intact audit chain."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.control import audit_log
from denpex.core import audit
from tests.control.conftest import Api
from tests.control.helpers import report
from tests.remediation.test_slurm import wait_for

LOOP_JOB = (
    "#!/bin/sh\ntrap 'echo ckpt >> ckpt-$SLURM_JOB_ID; scontrol update jobid=$SLURM_JOB_ID "
    '"Comment=denpex:checkpoint saved=1@$(date +%s%N)"\' USR1\nwhile true; do sleep 1; done\n'
)


@pytest.fixture
def api(slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    app = Api(
        f"sqlite:///{tmp_path / 'cp.db'}",
        remediation_backend="slurm",
        diagnostics_command=("sh", "-c", "echo diag {host} level {level}"),
    )
    yield app
    app.close()
    slurm.run("scancel", "--user=root")
    for node in slurm.nodes:
        slurm.scontrol("update", f"nodename={node}", "state=resume")
    wait_for(slurm._all_idle, 60)


def set_policy(api: Api, policy: dict) -> None:
    reply = api.client.put(
        "/api/v1/remediation/policy", json=policy, headers=api.headers(role="admin")
    )
    assert reply.status_code == 200, reply.text


def running_job(slurm) -> tuple[str, str]:
    job = slurm.sbatch(LOOP_JOB, "--requeue", "--comment=denpex:checkpoint")
    host = wait_for(
        lambda: slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip()
    )
    return job, host


def fail_on(api: Api, host: str, job: str) -> None:
    body = report(host=host, job=job)
    body["diagnosis"]["actions"] = [{"action": "drain_node", "target": host, "reason": "Xid 79"}]
    assert api.post("/api/v1/reports", json=body).status_code == 201
    api.tick()  # correlation: the incident
    api.runtime.remediation.once()  # remediation: plan, then the executor


def plans(api: Api) -> list[dict]:
    return api.get("/api/v1/remediation/plans").json()["items"]


def node(slurm, host: str) -> str:
    return slurm.run("sinfo", "-h", "-n", host, "-o", "%T %E").stdout.strip()


def chain(api: Api) -> list[dict]:
    lines = list(audit_log.export_lines(api.runtime.db))
    head = audit.head_of(audit.loads_record(lines[-1]))
    assert audit.verify_lines([*lines, audit.anchor_line(head, None)]).ok
    return [audit.loads_record(line) for line in lines]


def test_observe_is_the_default_and_only_records(api, slurm) -> None:
    job, host = running_job(slurm)
    fail_on(api, host, job)
    [plan] = plans(api)
    assert plan["status"] == "observed" and plan["tier"] == "observe"
    assert node(slurm, host).startswith(("idle", "allocated", "mixed"))  # untouched
    approve = api.post(f"/api/v1/remediation/plans/{plan['id']}/approve", json={"by": "bob"})
    assert approve.status_code == 409 and "raise the policy" in approve.text


def test_autosafe_runs_reversible_steps_then_waits_for_a_human(api, slurm) -> None:
    set_policy(api, {"categories": {"gpu.fallen_off_bus": "autosafe"}})
    job, host = running_job(slurm)
    t0 = time.monotonic()
    fail_on(api, host, job)
    detect_to_cordon = time.monotonic() - t0
    print(f"report -> incident -> plan -> Slurm drain: {detect_to_cordon:.2f} s")
    [plan] = plans(api)
    assert (plan["status"], plan["state"]) == ("waiting", "evict"), plan
    assert "drain" in node(slurm, host) and "denpex: incident" in node(slurm, host)
    wait_for(lambda: (slurm.root / f"ckpt-{job}").exists())  # the pre-stop signal arrived

    # the viewer may read but not decide; the operator approves, naming the human
    pid = plan["id"]
    denied = api.post(f"/api/v1/remediation/plans/{pid}/approve", role="viewer", json={})
    assert denied.status_code == 403
    done = api.post(f"/api/v1/remediation/plans/{pid}/approve", json={"by": "alice"})
    assert done.status_code == 200 and done.json()["status"] == "active"
    api.runtime.remediation.once()
    final = api.get(f"/api/v1/remediation/plans/{pid}").json()
    assert (final["status"], final["state"]) == ("done", "done"), final
    started = [s["state"] for s in final["steps"] if s["phase"] == "started"]
    assert started == ["cordon", "drain", "checkpoint", "evict", "reroute", "diagnostics", "resume"]
    assert node(slurm, host).startswith("idle")  # back in service after diagnostics passed
    moved = wait_for(
        lambda: slurm.run("squeue", "-h", "-j", job, "-t", "running", "-o", "%N").stdout.strip(),
        60,
    )
    assert moved != host
    records = chain(api)
    approved = [r for r in records if r["kind"] == "plan.approved"]
    assert approved and approved[0]["actor"].startswith("alice via token:")
    evict = [r for r in records if r["kind"] == "step.started" and r["subject"].endswith("evict")]
    assert evict[0]["actor"].startswith("alice via token:")  # the human, not the policy
    assert {"plan.proposed", "plan.waiting", "step.finished", "policy.changed"} <= {
        r["kind"] for r in records
    }


def test_approve_waits_at_every_step_and_reject_stops(api, slurm) -> None:
    set_policy(api, {"tier": "approve"})
    job, host = running_job(slurm)
    fail_on(api, host, job)
    [plan] = plans(api)
    assert (plan["status"], plan["state"]) == ("waiting", "cordon")
    pid = plan["id"]
    assert api.post(f"/api/v1/remediation/plans/{pid}/approve", json={"by": "carol"}).is_success
    api.runtime.remediation.once()
    after = api.get(f"/api/v1/remediation/plans/{pid}").json()
    assert (after["status"], after["state"]) == ("waiting", "drain")  # one step per approval
    rejected = api.post(
        f"/api/v1/remediation/plans/{pid}/reject", json={"by": "carol", "note": "x"}
    )
    assert rejected.json()["status"] == "rejected"
    api.runtime.remediation.once()
    assert api.get(f"/api/v1/remediation/plans/{pid}").json()["state"] == "rejected"
    again = api.post(f"/api/v1/remediation/plans/{pid}/approve", json={"by": "carol"})
    assert again.status_code == 409


def test_guards_hold_the_second_host_of_a_small_pool(api, slurm) -> None:
    set_policy(api, {"tier": "autoremediate"})
    slow = ("sh", "-c", "exit 0")
    api.runtime.remediation.remediation.backend.diagnostics_command = slow
    first_job, first = running_job(slurm)
    second_job, second = running_job(slurm)
    assert first != second
    fail_on(api, first, first_job)
    # diagnostics of the first host ran and it returned to service; its cordon still counts
    fail_on(api, second, second_job)
    by_host = {p["host"]: p for p in plans(api)}
    assert by_host[first]["status"] == "done"
    held = by_host[second]
    assert held["status"] == "held" and held["state"] == "cordon"
    assert "blast radius: 1 of 3" in held["note"]
    assert "drain" not in node(slurm, second)
    ok = api.post(f"/api/v1/remediation/plans/{held['id']}/approve", json={"by": "dave"})
    assert ok.status_code == 200
    api.runtime.remediation.once()
    assert api.get(f"/api/v1/remediation/plans/{held['id']}").json()["status"] == "done"
