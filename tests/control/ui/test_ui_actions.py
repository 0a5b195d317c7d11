"""The Actions and Audit pages without a browser (TestClient over a fresh SQLite store): plans
the real leader derived under a policy (tests/control/ui/plans.py) grouped by what they need,
each step with the state its records give it; approve and reject through the page's forms
(CSRF, a name, the API's remediation:decide decision: a viewer's forged POST is a 403 in the
denial log); the audit chain verified on the page and a tampered record shown as broken."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from denpex.remediation.spares import Check
from tests.control.conftest import Api
from tests.control.ui.plans import (
    DONE_HOST,
    FAILED_HOST,
    POLICY,
    SiteBackend,
    remediation_jobs,
    topology,
)
from tests.control.ui.seed import gpu_job, ib_job, ok_job, oom_job
from tests.control.ui.test_ui_pages import csrf_of, login


def run_leader(ui: Api, passes: int = 12) -> None:
    ui.tick()
    for _ in range(passes):
        ui.runtime.remediation.once()


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Api]:
    app = Api(f"sqlite:///{tmp_path / 'control.db'}", topology=topology())
    app.runtime.remediation.remediation.backend = SiteBackend()
    put = app.client.put(
        "/api/v1/remediation/policy", json=POLICY, headers=app.headers(role="admin")
    )
    assert put.status_code == 200, put.text
    for report in (gpu_job(), ib_job(), oom_job(), ok_job(), *remediation_jobs()):
        reply = app.post(
            "/api/v1/reports",
            content=json.dumps(report),
            headers={"Content-Type": "application/json"},
        )
        assert reply.status_code == 201
    run_leader(app)
    yield app
    app.close()


def plans_by_host(ui: Api) -> dict[str, dict]:
    items = ui.get("/api/v1/remediation/plans").json()["items"]
    return {p["host"]: p for p in items}


def article(html: str, plan_id: int) -> str:
    found = re.search(rf'<article [^>]*id="plan-{plan_id}".*?</article>', html, re.S)
    assert found, f"plan {plan_id} is not on the page"
    return found.group(0)


def test_plans_are_grouped_with_their_steps(ui: Api) -> None:
    plans = plans_by_host(ui)
    assert {h: p["status"] for h, p in plans.items()} == {
        "gpu-a07": "waiting",
        DONE_HOST: "done",
        FAILED_HOST: "failed",
    }
    login(ui, role="approver")
    page = ui.client.get("/actions")
    assert page.status_code == 200
    html = page.text
    order = [html.index(f'id="group-{key}"') for key in ("pending", "done", "failed")]
    assert order == sorted(order)  # waiting for approval first, then done, then failed
    assert 'id="plans-total">3<' in html and 'id="plans-pending">1<' in html
    waiting = article(html, plans["gpu-a07"]["id"])
    assert f'href="/incidents/{plans["gpu-a07"]["incident"]}"' in waiting
    assert 'class="tier">approve<' in waiting
    assert re.search(r'ss-waiting".*?cordon', waiting, re.S)
    assert 'id="approve-' in waiting and 'id="reject-' in waiting
    done = article(html, plans[DONE_HOST]["id"])
    assert done.count("ss-done") >= 5 and "ss-failed" not in done
    assert 'id="approve-' not in done and 'id="reject-' not in done  # nothing left to decide
    failed = article(html, plans[FAILED_HOST]["id"])
    assert re.search(r'ss-failed"[^>]*>\s*<span class="step-name">drain', failed)
    assert "Invalid node state specified for gpu-a20" in failed


def test_approve_and_reject_through_the_forms(ui: Api) -> None:
    csrf = login(ui, role="approver")
    plan = plans_by_host(ui)["gpu-a07"]
    path = f"/actions/plans/{plan['id']}/approve"
    assert ui.client.post(path, data={"by": "dana"}).status_code == 403  # no CSRF token
    cross = ui.client.post(
        path, data={"csrf": csrf, "by": "dana"}, headers={"Origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    unnamed = ui.client.post(path, data={"csrf": csrf, "by": " "})
    assert unnamed.status_code == 400 and "type your name" in unnamed.text
    assert plans_by_host(ui)["gpu-a07"]["status"] == "waiting"
    done = ui.client.post(path, data={"csrf": csrf, "by": "dana"}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/actions#plan-{plan['id']}"
    approved = ui.get(f"/api/v1/remediation/plans/{plan['id']}").json()
    assert approved["decided_by"].startswith("dana via token:")
    run_leader(ui, 2)  # the approved step runs once, then the next one waits again
    after = ui.get(f"/api/v1/remediation/plans/{plan['id']}").json()
    assert (after["state"], after["status"]) == ("drain", "waiting")
    html = article(ui.client.get("/actions").text, plan["id"])
    assert re.search(r'ss-done"[^>]*>\s*<span class="step-name">cordon', html)
    assert "dana via token:" in html
    reject = f"/actions/plans/{plan['id']}/reject"
    ui.client.post(reject, data={"csrf": csrf, "by": "erin", "note": "host is being replaced"})
    rejected = ui.get(f"/api/v1/remediation/plans/{plan['id']}").json()
    assert rejected["status"] == "rejected" and rejected["note"] == "host is being replaced"
    again = ui.client.post(reject, data={"csrf": csrf, "by": "erin"})
    assert again.status_code == 409  # it has ended


def test_a_viewer_sees_no_buttons_and_a_forged_post_is_refused_and_logged(ui: Api) -> None:
    csrf = login(ui, role="viewer")
    page = ui.client.get("/actions").text
    assert 'id="approve-' not in page and 'id="reject-' not in page
    assert "an approver or admin decides" in page
    assert 'href="/audit"' not in page  # a viewer may not read the audit
    plan = plans_by_host(ui)["gpu-a07"]
    forged = ui.client.post(f"/actions/plans/{plan['id']}/approve", data={"csrf": csrf, "by": "v"})
    assert forged.status_code == 403
    assert plans_by_host(ui)["gpu-a07"]["status"] == "waiting"
    denials = ui.get("/api/v1/denials", role="admin").json()["items"]
    assert any(d["action"] == "remediation:decide" and d["role"] == "viewer" for d in denials)
    assert ui.client.get("/audit").status_code == 403


def test_the_incident_page_links_its_plan(ui: Api) -> None:
    login(ui, role="viewer")
    plan = plans_by_host(ui)["gpu-a07"]
    html = ui.client.get(f"/incidents/{plan['incident']}").text
    assert f'href="/actions#plan-{plan["id"]}"' in html
    assert re.search(r'data-status="waiting">waiting</span> at step <code>cordon', html)


def test_audit_page_verifies_the_chain_and_shows_a_broken_one(ui: Api) -> None:
    login(ui, role="auditor")
    page = ui.client.get("/audit")
    assert page.status_code == 200
    assert "Chain intact." in page.text and "BROKEN" not in page.text
    assert "plan.proposed" in page.text and "policy.changed" in page.text
    assert 'id="audit-count">' in page.text
    with ui.runtime.db.system_tx(write=True) as conn:  # someone edits a record in the store
        table = sa.table("audit", sa.column("seq"), sa.column("line"))
        line = conn.execute(sa.select(table.c.line).where(table.c.seq == 2)).scalar_one()
        edited = line.replace('"subject":"', '"subject":"x', 1)
        assert edited != line
        conn.execute(table.update().where(table.c.seq == 2).values(line=edited))
    broken = ui.client.get("/audit").text
    assert "THE AUDIT CHAIN IS BROKEN" in broken and 'role="alert"' in broken
    assert "line 2: record 2: hash does not match its content (changed)" in broken
    assert "suspect-record" in broken


def test_new_pages_have_no_inline_code(ui: Api) -> None:
    login(ui, role="admin")
    for path in ("/actions", "/audit"):
        reply = ui.client.get(path)
        assert reply.status_code == 200, path
        assert "default-src 'self'" in reply.headers["content-security-policy"]
        assert not re.search(r"<script(?![^>]*\bsrc=)", reply.text), path
        assert not re.search(r"<style|\sstyle=|\son[a-z]+=", reply.text), path
        assert ui.token(role="admin") not in reply.text
        assert csrf_of(reply.text)


def cells(html: str) -> dict[str, str]:
    """host → the state its cell shows."""
    return dict(re.findall(r'href="/hosts/([^"]+)" data-state="([^"]+)"', html))


def test_fleet_cells_show_where_remediation_left_each_host(ui: Api) -> None:
    csrf = login(ui, role="approver")
    shown = cells(ui.client.get("/").text)
    assert shown[FAILED_HOST] == "cordoned"  # cordon ran, drain failed: it stays cordoned
    assert shown[DONE_HOST] == "suspect"  # diagnostics passed and resume ran: back in service
    assert shown["gpu-a07"] == "suspect"  # its plan waits: nothing ran yet
    plan = plans_by_host(ui)["gpu-a07"]
    approve = f"/actions/plans/{plan['id']}/approve"
    assert ui.client.post(approve, data={"csrf": csrf, "by": "dana"}).status_code == 200
    run_leader(ui, 2)
    assert cells(ui.client.get("/").text)["gpu-a07"] == "cordoned"
    assert ui.client.post(approve, data={"csrf": csrf, "by": "dana"}).status_code == 200
    run_leader(ui, 2)
    html = ui.client.get("/").text
    assert cells(html)["gpu-a07"] == "draining"
    assert 'id="count-cordoned">1<' in html and 'id="count-draining">1<' in html
    assert 'id="count-spare">0<' in html and 'id="count-spare_failed">0<' in html
    only = cells(ui.client.get("/?state=draining").text)
    assert only == {"gpu-a07": "draining"}


def test_fleet_groups_by_rack_switch_and_pool_of_the_site_topology(ui: Api) -> None:
    login(ui, role="viewer")
    by_rack = ui.client.get("/").text
    names = re.findall(r'class="group-name">([^<]+)<', by_rack)
    assert names == ["rack rack-1", "rack rack-2", "rack rack-3"]
    rack3 = by_rack[by_rack.index("rack rack-3") :]
    assert re.search(r'data-state="cordoned"><span class="dot"[^>]*></span>1 cordoned', rack3)
    by_pool = ui.client.get("/?group=pool").text
    assert re.findall(r'class="group-name">([^<]+)<', by_pool) == ["pool batch", "pool train"]
    by_switch = ui.client.get("/?group=switch").text
    assert "switch leaf-2" in by_switch
    pool_batch = by_pool[by_pool.index("pool batch") : by_pool.index("pool train")]
    assert set(cells(pool_batch)) >= {DONE_HOST, FAILED_HOST} and "gpu-a07" not in pool_batch


def test_remediation_states_read_the_step_records() -> None:
    from denpex.control.ui.actions import remediation_states
    from denpex.control.ui.views import state_of_step

    def plan(pid: int, host: str, status: str, *records: tuple[str, str, str | None]) -> dict:
        steps = [
            {"seq": n, "state": s, "phase": ph, "event": ev, "result": {}, "ts_ns": pid * 100 + n}
            for n, (s, ph, ev) in enumerate(records, 1)
        ]
        return {"id": pid, "host": host, "status": status, "steps": steps}

    stored = [
        plan(1, "h-diag", "active", ("cordon", "started", None), ("cordon", "finished", "ok"),
             ("diagnostics", "started", None)),
        plan(2, "h-rma", "done", ("cordon", "finished", "ok"), ("rma", "finished", "ok")),
        plan(3, "h-back", "done", ("diagnostics", "finished", "ok"), ("resume", "finished", "ok")),
        plan(4, "h-fail", "failed", ("cordon", "finished", "ok"), ("drain", "started", None),
             ("drain", "finished", "error")),
        plan(5, "h-none", "recommended"),
    ]  # fmt: skip

    class Plans:
        def plans(self, limit: int) -> list[dict]:
            return sorted(stored, key=lambda p: -p["id"])

        def plan(self, plan_id: int) -> dict:
            return next(p for p in stored if p["id"] == plan_id)

    found = remediation_states(Plans(), state_of_step())  # type: ignore[arg-type]
    assert {h: v["state"] for h, v in found.items()} == {
        "h-diag": "diagnostics",
        "h-rma": "rma",
        "h-fail": "cordoned",
    }
    assert found["h-diag"] == {"state": "diagnostics", "plan": 1, "step": "diagnostics"}


def test_a_plan_whose_target_is_no_known_host_is_flagged(ui: Api) -> None:
    login(ui, role="approver")
    html = ui.client.get("/actions").text
    for host, plan in plans_by_host(ui).items():
        flagged = "unknown-host" in article(html, plan["id"])
        assert flagged == (host not in {"gpu-a07", DONE_HOST, FAILED_HOST}), host


SPARE_CHECKS = [
    Check("dcgm_diag", ("sh", "-c", "echo diag level 1 on {host}")),
    Check("ib_ports", ("sh", "-c", "echo {host}: port 1 Active; test {host} != gpu-a09")),
]


def test_fleet_shows_warm_spares_with_their_own_state_and_last_preflight(ui: Api) -> None:
    ui.runtime.remediation.remediation.spare_checks = SPARE_CHECKS
    for host, pool in (("gpu-a22", "train"), ("gpu-a09", None)):  # a09 never reported
        body = {"host": host, "pool": pool, "by": "dana"}
        added = ui.post("/api/v1/remediation/spares", role="approver", json=body)
        assert added.status_code == 201, added.text
    login(ui, role="viewer")
    html = ui.client.get("/").text
    assert cells(html)["gpu-a22"] == "spare"  # asked for: a spare already, not checked yet
    assert 'data-status="requested"' in html and "not run yet" in html
    run_leader(ui, 1)
    html = ui.client.get("/").text
    assert cells(html)["gpu-a22"] == "spare"
    # no host page for a host that never reported: its cell links to its row of the table
    assert 'href="#spare-gpu-a09" data-state="spare_failed"' in html
    assert 'id="count-spare">1<' in html and 'id="count-spare_failed">1<' in html
    row = re.search(r'<tr id="spare-gpu-a09".*?</tr>', html, re.S).group(0)
    assert 'data-status="failed"' in row and "· failed" in row
    assert re.search(r'class="check bad"[^>]*>ib_ports', row)
    assert "diagnostics" in row  # a failed spare goes to diagnostics
    row = re.search(r'<tr id="spare-gpu-a22".*?</tr>', html, re.S).group(0)
    assert 'data-status="validated"' in row and "· passed" in row
    assert "globex" not in html
    other = ui.get("/api/v1/remediation/spares", tenant="globex").json()
    assert other["items"] == []
