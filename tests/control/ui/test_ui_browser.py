"""The web UI in a real browser: Debian's chromium driven by Playwright, against a real
`denpex server` on loopback (SQLite) seeded through its ingest API (tests/control/ui/seed.py).

It logs in, walks fleet → incident → evidence, acts on an incident, searches jobs, and checks
what is on screen; plus the guards: no page without login, another tenant's incident is a
404, a form without the CSRF token is refused, the CSP header is sent and the console shows
no CSP violation.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api as playwright_sync
from playwright.sync_api import expect

from tests.control.conftest import ServerProcess, mint
from tests.control.ui.seed import Seeded, seed

# ≈ 50 s on two shared cores (a server, a seeded fleet, one chromium): past the 30 s line.
# The same guards run without a browser in test_ui_pages.py.
pytestmark = pytest.mark.slow


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "chromium not found on PATH: apt-get install chromium (scripts/system-packages.txt)"
        )
    return found


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    root = tmp_path_factory.mktemp("ui")
    url = f"sqlite:///{root / 'control.db'}"
    tokens = {
        "acme": mint(url, "acme", "operator"),
        "acme_viewer": mint(url, "acme", "viewer"),
        "globex": mint(url, "globex", "operator"),
    }
    server = ServerProcess(url, root / "server.log").start()
    try:
        yield seed(server.base, tokens)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    with playwright_sync.sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


class Visit:
    """One browser context; every console message it sees is kept."""

    def __init__(self, browser: Any, base: str, **options: Any) -> None:
        self.context = browser.new_context(base_url=base, **options)
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def login(self, token: str) -> None:
        self.page.goto("/login")
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_url("**/")

    def csp_violations(self) -> list[str]:
        return [m for m in self.console if "Content Security Policy" in m or "pageerror" in m]

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def visit(browser: Any, fleet: Seeded) -> Iterator[Visit]:
    opened = Visit(browser, fleet.base, viewport={"width": 1280, "height": 800})
    yield opened
    opened.close()


def api(fleet: Seeded, path: str, token: str | None = None) -> Any:
    request = urllib.request.Request(
        fleet.base + path, headers={"Authorization": f"Bearer {token or fleet.acme_token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def suspect_hosts(fleet: Seeded) -> set[str]:
    hosts: set[str] = set()
    for job, incident_id in fleet.incidents.items():
        if job != "globex":
            hosts |= set(api(fleet, f"/api/v1/incidents/{incident_id}")["hosts"])
    return hosts


def test_no_page_without_login(visit: Visit, fleet: Seeded) -> None:
    for path in (
        "/",
        "/jobs",
        f"/incidents/{fleet.incidents['train-llama-70b']}",
        "/hosts/gpu-a07",
    ):
        visit.page.goto(path)
        assert "/login?next=" in visit.page.url, path
        assert visit.page.locator("h1").inner_text() == "Log in"
        assert visit.page.locator("text=Open incidents").count() == 0
    opener = urllib.request.build_opener(_NoRedirect())
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(fleet.base + "/jobs", timeout=10)
    assert refused.value.code == 303
    assert refused.value.headers["Location"].startswith("/login")


def test_a_wrong_token_is_refused(visit: Visit) -> None:
    visit.page.goto("/login")
    visit.page.fill("#token", "dpx_0123456789abcdef_" + "x" * 43)
    visit.page.click("button[type=submit]")
    assert visit.page.locator("[role=alert]").inner_text().startswith("That token was not accepted")
    assert "/login" in visit.page.url


def test_fleet_incident_evidence(visit: Visit, fleet: Seeded) -> None:
    visit.login(fleet.acme_token)
    page = visit.page
    hosts = {h["name"] for h in api(fleet, "/api/v1/hosts?limit=1000")["items"]}
    suspect = suspect_hosts(fleet)
    assert page.locator("#count-total").inner_text() == str(len(hosts))
    assert page.locator("#count-suspect").inner_text() == str(len(suspect))
    assert page.locator("#count-healthy").inner_text() == str(len(hosts - suspect))
    assert page.locator(".cell").count() == len(hosts)
    assert page.locator(".cell.state-suspect").count() == len(suspect)
    assert page.locator("#count-spare").inner_text() == "0"  # no warm spare in this pool
    assert page.locator("#count-cordoned").inner_text() == "0"  # no remediation ran here
    rows = page.locator("table.incidents tbody tr")
    open_incidents = [
        i for i in api(fleet, "/api/v1/incidents?limit=1000")["items"] if i["status"] == "open"
    ]
    assert len(open_incidents) >= 3  # one per failed job, and the fleet rules' own
    assert rows.count() == len(open_incidents)
    assert page.locator(".tenant").inner_text() == "acme"
    assert "globex" not in page.content()

    incident_id = fleet.incidents["train-llama-70b"]
    page.click("text=job train-llama-70b: gpu.fallen_off_bus on gpu-a07")
    page.wait_for_url(f"**/incidents/{incident_id}")
    assert "fell off the bus (Xid 79)" in page.locator(".lead").inner_text()
    assert page.locator("#root-category").inner_text() == "gpu.fallen_off_bus"
    assert page.locator("#diagnosis-rule").inner_text() == "hardware_before_software"
    assert page.locator("#rule").inner_text() == "job_root_cause"
    assert page.locator("#confidence").inner_text() == "0.94"
    graph = page.locator("svg.causal")
    assert graph.locator(".g-node.g-cause").get_attribute("data-category") == "gpu.fallen_off_bus"
    symptoms = graph.locator(".g-node.g-symptom")
    assert sorted(
        symptoms.nth(i).get_attribute("data-category") for i in range(symptoms.count())
    ) == [
        "cuda.launch_failure",
        "nccl.timeout",
    ]
    assert graph.locator(".g-edge").count() == 2
    lanes = page.locator(".timeline svg g.lane")
    assert lanes.count() == 5  # gpu-a07 rank 3 and the four ranks that timed out
    assert page.locator("#evidence-count").inner_text() == "6"
    cause_row = page.locator("#ev-e1")
    assert "/var/log/kern.log:88412" in cause_row.inner_text()
    assert "kmsg" in cause_row.inner_text() and "GPU" in cause_row.inner_text()
    assert "drain_node" in page.locator("#actions").inner_text()
    assert "train-llama-70b" in page.locator("#jobs-h + .scroll table").inner_text()

    page.click("svg.causal .g-cause")  # the cause node links to its evidence row
    assert page.url.endswith("#ev-e1")
    cause_row.locator("td a").first.click()
    page.wait_for_url("**/evidence/**")
    assert page.locator("#evidence-category").inner_text() == "gpu.fallen_off_bus"
    assert "GPU has fallen off the bus" in page.locator("#evidence-line").inner_text()

    page.go_back()
    page.go_back()
    page.click("#acknowledge")
    page.wait_for_url(f"**/incidents/{incident_id}")
    assert page.locator("#status").text_content() == "acknowledged"
    assert api(fleet, f"/api/v1/incidents/{incident_id}")["status"] == "acknowledged"
    assert visit.csp_violations() == []


def test_fleet_filters_and_jobs_search(visit: Visit, fleet: Seeded) -> None:
    visit.login(fleet.acme_token)
    page = visit.page
    suspect = suspect_hosts(fleet)
    page.select_option("select[name=state]", "suspect")  # htmx swaps the results in place
    page.wait_for_url("**/?*state=suspect*")
    expect(page.locator(".cell")).to_have_count(len(suspect))
    assert page.locator(".cell.state-healthy").count() == 0
    page.fill("input[name=q]", "gpu-a12")
    expect(page.locator(".cell")).to_have_count(1)
    assert page.locator(".cell-name").inner_text() == "gpu-a12"

    page.click("nav >> text=Jobs")
    page.wait_for_url("**/jobs")
    assert page.locator("#jobs-count").inner_text() == "4"
    page.fill("input[name=user]", "alice")
    expect(page.locator("#jobs-count")).to_have_text("2")
    page.fill("input[name=user]", "")
    page.fill("input[name=host]", "gpu-a12")
    expect(page.locator("#jobs-count")).to_have_text("1")
    assert "bert-finetune" in page.locator("table.jobs").inner_text()
    page.fill("input[name=host]", "no-such-host")
    page.wait_for_selector("#jobs-none")
    assert page.evaluate("typeof htmx") == "object"  # the vendored script ran under the CSP
    assert visit.csp_violations() == []


def test_another_tenants_incident_is_404(visit: Visit, fleet: Seeded) -> None:
    visit.login(fleet.acme_token)
    reply = visit.page.goto(f"/incidents/{fleet.incidents['globex']}")
    assert reply is not None and reply.status == 404
    assert "globex GPU" not in visit.page.content()
    assert visit.page.locator("h1").inner_text().startswith("404")
    other = visit.page.goto("/hosts/gx-01")
    assert other is not None and other.status == 404


def test_forms_without_csrf_are_refused(visit: Visit, fleet: Seeded) -> None:
    visit.login(fleet.acme_token)
    incident_id = fleet.incidents["bert-finetune"]
    for form in ({}, {"csrf": "forged"}):
        reply = visit.context.request.post(f"/incidents/{incident_id}/resolve", form=form)
        assert reply.status == 403
        assert "CSRF" in reply.text()
    assert api(fleet, f"/api/v1/incidents/{incident_id}")["status"] == "open"
    visit.page.goto(f"/incidents/{incident_id}")
    visit.page.click("#resolve")  # the page's own form carries the token
    assert visit.page.locator("#status").text_content() == "resolved"


def test_viewer_sees_no_buttons(visit: Visit, fleet: Seeded) -> None:
    visit.login(fleet.acme_viewer)
    visit.page.goto(f"/incidents/{fleet.incidents['resnet-sweep']}")
    assert visit.page.locator("#root-category").inner_text() == "cuda.oom"
    assert visit.page.locator("#acknowledge, #resolve").count() == 0
    reply = visit.context.request.post(
        f"/incidents/{fleet.incidents['resnet-sweep']}/acknowledge",
        form={"csrf": visit.page.locator("input[name=csrf]").first.input_value()},
    )
    assert reply.status == 403


def test_security_headers(visit: Visit, fleet: Seeded) -> None:
    reply = visit.page.goto("/login")
    assert reply is not None
    csp = reply.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp
    assert reply.headers["x-frame-options"] == "DENY"
    cookie = next(c for c in visit.context.cookies() if c["name"] == "denpex_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    visit.login(fleet.acme_token)
    cookie = next(c for c in visit.context.cookies() if c["name"] == "denpex_session")
    assert fleet.acme_token not in cookie["value"]  # sealed, not merely signed
    assert fleet.acme_token not in visit.page.content()
    for path in ("/", "/jobs", f"/incidents/{fleet.incidents['train-llama-70b']}"):
        visit.page.goto(path)
    assert visit.csp_violations() == []


def test_keyboard_and_phone_width(browser: Any, fleet: Seeded) -> None:
    phone = Visit(browser, fleet.base, viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        phone.login(fleet.acme_token)
        page = phone.page
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to content"
        page.keyboard.press("Enter")
        for _ in range(40):  # tab to the first incident link and follow it by keyboard
            page.keyboard.press("Tab")
            href = page.evaluate("document.activeElement.getAttribute('href') || ''")
            if href.startswith("/incidents/"):
                break
        page.keyboard.press("Enter")
        page.wait_for_url("**/incidents/*")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        phone.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_assets_ship_in_the_package() -> None:
    from importlib import resources

    static = resources.files("denpex.control.ui").joinpath("static")
    assert "2.0.11" in static.joinpath("htmx.min.js").read_text()
    assert "Zero-Clause BSD" in static.joinpath("htmx.LICENSE").read_text()
    assert Path(str(static.joinpath("denpex.css"))).stat().st_size > 0
