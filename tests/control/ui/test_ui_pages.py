"""The web UI's guards and pages without a browser (FastAPI's TestClient over a fresh SQLite
store, seeded through the ingest API): login and the sealed session, CSRF and same-origin
checks, tenant scoping, security headers, no inline script or style in any page."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from denpex.control.ui.graph import causal_svg
from denpex.control.ui.routes import _safe_next
from denpex.enterprise.tokens import parse_token
from tests.control.conftest import Api
from tests.control.ui.seed import globex_job, gpu_job, ib_job, ok_job


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Api]:
    app = Api(f"sqlite:///{tmp_path / 'control.db'}")
    for report in (gpu_job(), ib_job(), ok_job()):
        assert app.post("/api/v1/reports", content=json.dumps(report),
                        headers={"Content-Type": "application/json"}).status_code == 201  # fmt: skip
    reply = app.post("/api/v1/reports", tenant="globex", content=json.dumps(globex_job()),
                     headers={"Content-Type": "application/json"})  # fmt: skip
    assert reply.status_code == 201
    app.tick()
    yield app
    app.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field in the page"
    return found.group(1)


def login(ui: Api, tenant: str = "acme", role: str = "operator") -> str:
    """Log the TestClient in; returns the session's CSRF token."""
    page = ui.client.get("/login")
    reply = ui.client.post(
        "/login",
        data={"token": ui.token(tenant, role), "csrf": csrf_of(page.text), "next": "/jobs"},
        follow_redirects=False,
    )
    assert reply.status_code == 303 and reply.headers["location"] == "/jobs"
    return csrf_of(ui.client.get("/jobs").text)


def incident_of(ui: Api, job: str, tenant: str = "acme") -> int:
    """The job's own incident (a fleet rule may open another one, for its GPU or host)."""
    items = ui.get(f"/api/v1/incidents?job={job}", tenant=tenant).json()["items"]
    own = [i for i in items if i["component"]["kind"] == "job"]
    assert len(own) == 1, items
    return int(own[0]["id"])


def test_pages_redirect_to_login_without_a_session(ui: Api) -> None:
    for path in ("/", "/jobs", "/incidents/1", "/hosts/gpu-a07", "/evidence/x"):
        reply = ui.client.get(path, follow_redirects=False)
        assert reply.status_code == 303, path
        assert reply.headers["location"].startswith("/login?next=")
    htmx = ui.client.get("/jobs?user=a", headers={"HX-Request": "true"}, follow_redirects=False)
    assert htmx.status_code == 401 and htmx.headers["HX-Redirect"].startswith("/login")


def test_login_needs_the_csrf_token_and_a_valid_token(ui: Api) -> None:
    page = ui.client.get("/login")
    assert ui.client.post("/login", data={"token": ui.token()}).status_code == 403
    bad = ui.client.post("/login", data={"token": "dpx_nope", "csrf": csrf_of(page.text)})
    assert bad.status_code == 401 and "not accepted" in bad.text
    assert ui.client.get("/", follow_redirects=False).status_code == 303


def test_session_is_sealed_and_ends_with_its_token(ui: Api) -> None:
    login(ui)
    cookie = ui.client.cookies["denpex_session"]
    token_id, secret = parse_token(ui.token()) or ("", "")
    assert secret and secret not in cookie and ui.token() not in cookie
    assert ui.client.get("/").status_code == 200
    ui.client.cookies.clear()
    ui.client.cookies.set("denpex_session", cookie[:40] + "A" * 8 + cookie[48:])  # tampered
    assert ui.client.get("/", follow_redirects=False).status_code == 303
    ui.client.cookies.clear()
    ui.client.cookies.set("denpex_session", cookie)
    assert ui.client.get("/").status_code == 200
    assert ui.runtime.store.revoke_token(token_id, time.time_ns())
    assert ui.client.get("/", follow_redirects=False).status_code == 303


def test_fleet_and_incident_show_the_tenants_own_data(ui: Api) -> None:
    login(ui)
    fleet = ui.client.get("/")
    assert fleet.status_code == 200
    assert 'id="count-total">20<' in fleet.text  # 8 + 4 + 8 hosts in three reports (acme)
    assert 'id="count-suspect">12<' in fleet.text
    assert "gx-01" not in fleet.text
    assert "no site topology given" in fleet.text  # one group, and it says why
    incident = ui.client.get(f"/incidents/{incident_of(ui, 'train-llama-70b')}")
    assert incident.status_code == 200
    assert 'data-category="gpu.fallen_off_bus"' in incident.text
    assert "/var/log/kern.log:88412" in incident.text
    foreign = ui.client.get(f"/incidents/{incident_of(ui, 'globex-train', 'globex')}")
    assert foreign.status_code == 404 and "globex GPU" not in foreign.text
    assert ui.client.get("/hosts/gx-01").status_code == 404
    assert ui.client.get("/evidence/r-globex-1/e1").status_code == 404
    jobs = ui.client.get("/jobs?job=bert-finetune").text
    assert f'href="/incidents/{incident_of(ui, "bert-finetune")}"' in jobs
    assert "alice" in ui.client.get("/jobs?user=alice").text
    assert "jobs-none" in ui.client.get("/jobs?user=nobody").text


def test_incident_forms_need_csrf_same_origin_and_the_write_role(ui: Api) -> None:
    csrf = login(ui)
    incident_id = incident_of(ui, "bert-finetune")
    path = f"/incidents/{incident_id}/acknowledge"
    assert ui.client.post(path, data={}).status_code == 403
    assert ui.client.post(path, data={"csrf": "forged"}).status_code == 403
    cross = ui.client.post(path, data={"csrf": csrf}, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert ui.get(f"/api/v1/incidents/{incident_id}").json()["status"] == "open"
    done = ui.client.post(path, data={"csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303
    assert ui.get(f"/api/v1/incidents/{incident_id}").json()["status"] == "acknowledged"
    assert ui.client.post(path, data={"csrf": csrf}).status_code == 409  # already acknowledged


def test_a_viewer_may_not_act(ui: Api) -> None:
    csrf = login(ui, role="viewer")
    incident_id = incident_of(ui, "bert-finetune")
    page = ui.client.get(f"/incidents/{incident_id}")
    assert 'id="acknowledge"' not in page.text
    refused = ui.client.post(f"/incidents/{incident_id}/resolve", data={"csrf": csrf})
    assert refused.status_code == 403


def test_every_page_has_the_security_headers_and_no_inline_code(ui: Api) -> None:
    login(ui)
    incident = incident_of(ui, "train-llama-70b")
    for path in ("/login", "/", "/jobs", f"/incidents/{incident}", "/hosts/gpu-a07",
                 "/evidence/r-llama-0142/e1", "/incidents/999999"):  # fmt: skip
        reply = ui.client.get(path)
        csp = reply.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert "unsafe" not in csp
        assert reply.headers["x-frame-options"] == "DENY"
        assert not re.search(r"<script(?![^>]*\bsrc=)", reply.text), path
        assert not re.search(r"<style|\sstyle=|\son[a-z]+=", reply.text), path
        assert "http://" not in reply.text and "https://" not in reply.text, path  # no CDN
        assert ui.token() not in reply.text
    assert ui.client.get("/static/htmx.min.js").status_code == 200


def test_next_never_leaves_the_server() -> None:
    for target in ("//evil.example/x", "https://evil.example", "evil", ""):
        assert _safe_next(target) == "/"
    assert _safe_next("/incidents/3?x=1") == "/incidents/3?x=1"


def test_causal_graph_escapes_and_links() -> None:
    incident = {"category": "gpu.fallen_off_bus"}
    rows = [
        {"category": "gpu.fallen_off_bus", "layer": "GPU", "role": "cause", "host": "h<1>",
         "rank": 3, "anchor": "ev-e1"},
        {"category": "nccl.timeout", "layer": "log", "role": "symptom", "host": "h2", "rank": 0,
         "anchor": "ev-e2"},
        {"category": "net.ib_error", "layer": "fabric", "role": "related", "host": "h3",
         "rank": None, "anchor": "ev-e3"},
    ]  # fmt: skip
    svg = causal_svg(incident, rows)
    assert svg.count('class="g-node') == 3 and svg.count('class="g-edge"') == 2
    assert "h&lt;1&gt;" in svg and "h<1>" not in svg
    assert 'href="#ev-e1"' in svg and " style=" not in svg
    # symptoms ordered by layer: log before fabric
    assert svg.index('data-category="nccl.timeout"') < svg.index('data-category="net.ib_error"')
