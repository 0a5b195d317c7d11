"""The Actions and Audit pages in a real browser (Debian's chromium through Playwright) against
the control plane on loopback whose leader runs plans on a site backend (plans.py), seeded
through the ingest API: an approver approves a step by clicking and sees it run, a viewer sees
no button and a forged POST is refused, an auditor reads the verified chain; every page at
1280×800 and at phone width."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.control.conftest import mint
from tests.control.ui.live import LiveServer
from tests.control.ui.plans import DONE_HOST, FAILED_HOST, POLICY, SiteBackend, remediation_jobs
from tests.control.ui.plans import topology as site_topology
from tests.control.ui.seed import Seeded, seed
from tests.control.ui.test_ui_actions import SPARE_CHECKS
from tests.control.ui.test_ui_browser import Visit, browser  # noqa: F401  (a fixture)

SPARES = {"gpu-a22": "train", "gpu-a09": None}  # gpu-a09 never reported; it fails its preflight
pytestmark = pytest.mark.slow  # a server, a seeded fleet, one chromium: ≈ 40 s


def call(base: str, method: str, path: str, token: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read() or b"{}")


class Fleet:
    def __init__(self, seeded: Seeded, tokens: dict[str, str]) -> None:
        self.seeded = seeded
        self.base = seeded.base
        self.tokens = tokens

    def all_plans(self) -> list[dict]:
        return call(self.base, "GET", "/api/v1/remediation/plans", self.tokens["viewer"])["items"]

    def plans(self) -> dict[str, dict]:
        """host → its oldest plan (a host may have one per incident)."""
        return {p["host"]: p for p in reversed(self.all_plans())}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("ui-actions")
    url = f"sqlite:///{root / 'control.db'}"
    roles = ("operator", "viewer", "approver", "auditor", "admin")
    tokens = {role: mint(url, "acme", role) for role in roles}
    tokens["globex"] = mint(url, "globex", "operator")
    server = LiveServer(url, backend=SiteBackend(), topology=site_topology())
    server.runtime.remediation.remediation.spare_checks = SPARE_CHECKS
    server.start()
    try:
        call(server.base, "PUT", "/api/v1/remediation/policy", tokens["admin"], POLICY)
        seeded = seed(
            server.base,
            {
                "acme": tokens["operator"],
                "acme_viewer": tokens["viewer"],
                "globex": tokens["globex"],
            },
        )
        for report in remediation_jobs():
            call(server.base, "POST", "/api/v1/reports", tokens["operator"], report)
        found = Fleet(seeded, tokens)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses = {h: p["status"] for h, p in found.plans().items()}
            wanted = {"gpu-a07": "waiting", DONE_HOST: "done", FAILED_HOST: "failed"}
            if wanted.items() <= statuses.items():
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the leader did not derive and run the plans: {statuses}")
        # two warm spares once the plans ran (no reroute takes them): one fails its preflight
        for host, pool in SPARES.items():
            body = {"host": host, "pool": pool, "by": "dana"}
            call(server.base, "POST", "/api/v1/remediation/spares", tokens["approver"], body)
        while time.monotonic() < deadline + 30:
            listed = call(server.base, "GET", "/api/v1/remediation/spares", tokens["viewer"])
            if all(sp["checked_ns"] for sp in listed["items"]):
                break
            time.sleep(0.2)
        yield found
    finally:
        server.stop()


@pytest.fixture
def visit(browser: Any, fleet: Fleet) -> Iterator[Visit]:  # noqa: F811
    opened = Visit(browser, fleet.base, viewport={"width": 1280, "height": 800})
    yield opened
    opened.close()


def test_an_approver_approves_a_step_and_sees_it_run(visit: Visit, fleet: Fleet) -> None:
    visit.login(fleet.tokens["approver"])
    page = visit.page
    plan = fleet.plans()["gpu-a07"]
    page.goto(f"/incidents/{plan['incident']}")
    page.click(f"#plans >> text=plan #{plan['id']}")
    page.wait_for_url(f"**/actions#plan-{plan['id']}")
    statuses = [p["status"] for p in fleet.all_plans()]
    waiting = sum(s in ("waiting", "held") for s in statuses)
    assert page.locator("#plans-total").inner_text() == str(len(statuses))
    assert page.locator("#plans-pending").inner_text() == str(waiting)
    assert page.locator("#plans-done").inner_text() == str(statuses.count("done"))
    assert page.locator("#plans-failed").inner_text() == str(statuses.count("failed"))
    headings = page.locator("section.plans h2").all_inner_texts()
    assert [h.split(" ")[0].lower() for h in headings] == ["waiting", "done", "failed"]
    card = page.locator(f"#plan-{plan['id']}")
    assert card.locator(".step.ss-waiting .step-name").inner_text() == "cordon"
    failed = page.locator(f"#plan-{fleet.plans()[FAILED_HOST]['id']}")
    assert "Invalid node state" in failed.locator(".step.ss-failed").inner_text()
    card.locator("input[name=by]").first.fill("dana")
    card.locator(f"#approve-{plan['id']}").click()
    page.wait_for_url(f"**/actions#plan-{plan['id']}")
    for _ in range(50):  # the leader runs the approved step at its next pass
        shown = page.locator(f"#plan-{plan['id']} .step.ss-waiting .step-name").all_inner_texts()
        if shown == ["drain"]:  # cordon ran, and the next step waits for a human again
            break
        time.sleep(0.2)
        page.reload()
    expect(page.locator(f"#plan-{plan['id']} .step.ss-done .step-name")).to_have_text("cordon")
    expect(page.locator(f"#plan-{plan['id']} .step.ss-waiting .step-name")).to_have_text("drain")
    assert "dana via token:" in page.locator(f"#plan-{plan['id']} .decided-by").inner_text()
    assert visit.csp_violations() == []


def test_a_viewer_sees_no_buttons_and_cannot_forge_one(visit: Visit, fleet: Fleet) -> None:
    visit.login(fleet.tokens["viewer"])
    page = visit.page
    page.click("nav >> text=Actions")
    page.wait_for_url("**/actions")
    assert page.locator("article.plan").count() == len(fleet.all_plans())
    assert page.locator("button.approve, button.reject").count() == 0
    assert page.locator("nav >> text=Audit").count() == 0
    plan = fleet.plans()["gpu-a07"]
    before = plan["status"], plan["state"]
    csrf = page.locator("input[name=csrf]").first.input_value()
    reply = visit.context.request.post(
        f"/actions/plans/{plan['id']}/reject", form={"csrf": csrf, "by": "mallory"}
    )
    assert reply.status == 403
    after = fleet.plans()["gpu-a07"]
    assert (after["status"], after["state"]) == before
    denials = call(fleet.base, "GET", "/api/v1/denials", fleet.tokens["admin"])["items"]
    assert any(d["action"] == "remediation:decide" and d["role"] == "viewer" for d in denials)


def test_an_auditor_reads_the_verified_chain(visit: Visit, fleet: Fleet) -> None:
    visit.login(fleet.tokens["auditor"])
    page = visit.page
    page.click("nav >> text=Audit")
    page.wait_for_url("**/audit")
    assert page.locator("#audit-verdict").inner_text().startswith("Chain intact.")
    kinds = page.locator("table.audit tbody td:nth-child(3)").all_inner_texts()
    assert "plan.proposed" in kinds and "step.finished" in kinds
    assert "globex" not in page.content()
    assert visit.csp_violations() == []


def test_fleet_cells_show_remediation_states_by_group(visit: Visit, fleet: Fleet) -> None:
    visit.login(fleet.tokens["viewer"])
    page = visit.page
    assert page.locator(f".cell[href='/hosts/{FAILED_HOST}']").get_attribute("data-state") == (
        "cordoned"
    )
    names = page.locator(".group-name").all_inner_texts()
    assert names == ["rack rack-1", "rack rack-2", "rack rack-3"]
    page.select_option("select[name=group]", "pool")  # htmx swaps the groups in place
    expect(page.locator(".group-name")).to_have_text(["pool batch", "pool train"])
    page.select_option("select[name=state]", "cordoned")
    page.wait_for_url("**state=cordoned**")
    cordoned = page.locator(".cell")
    expect(cordoned.first).to_have_attribute("data-state", "cordoned")
    assert cordoned.count() == int(page.locator("#count-cordoned").inner_text())
    assert FAILED_HOST in " ".join(cordoned.all_inner_texts())
    assert visit.csp_violations() == []


def test_fleet_shows_warm_spares_in_their_own_colour_with_the_last_preflight(
    visit: Visit, fleet: Fleet
) -> None:
    visit.login(fleet.tokens["viewer"])
    page = visit.page
    spare = page.locator(".cell[href='/hosts/gpu-a22']")
    failed = page.locator(".cell[href='#spare-gpu-a09']")
    healthy = page.locator(".cell.state-healthy").first
    expect(spare).to_have_attribute("data-state", "spare")
    expect(failed).to_have_attribute("data-state", "spare_failed")

    def colour(cell: Any) -> str:
        return cell.evaluate("e => getComputedStyle(e).getPropertyValue('--c').trim()")

    assert len({colour(spare), colour(failed), colour(healthy)}) == 3  # each its own colour
    expect(page.locator("#count-spare")).to_have_text("1")
    expect(page.locator("#count-spare_failed")).to_have_text("1")
    rows = page.locator("table.spares tbody tr")
    expect(rows).to_have_count(2)
    a22 = page.locator("#spare-gpu-a22")
    expect(a22.locator(".pill")).to_have_text("validated")
    expect(a22.locator(".preflight")).to_contain_text("passed")
    a09 = page.locator("#spare-gpu-a09")
    expect(a09.locator(".pill")).to_have_text("failed")
    expect(a09.locator(".check.bad").first).to_contain_text("ib_ports")
    expect(a09.locator(".checks")).to_contain_text("diagnostics")
    failed.click()  # a spare that never reported links to its row
    page.wait_for_url("**/#spare-gpu-a09")
    page.select_option("select[name=state]", "spare_failed")  # the filter knows the state
    page.wait_for_url("**state=spare_failed**")
    expect(page.locator(".cell")).to_have_count(1)
    assert visit.csp_violations() == []


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_every_page_reads_at_desktop_and_phone_width(
    browser: Any,  # noqa: F811
    fleet: Fleet,
    width: int,
    height: int,
) -> None:
    opened = Visit(browser, fleet.base, viewport={"width": width, "height": height})
    try:
        opened.login(fleet.tokens["admin"])
        plan = fleet.plans()["gpu-a07"]
        for path in ("/", "/jobs", "/actions", "/audit", f"/incidents/{plan['incident']}"):
            opened.page.goto(path)
            assert opened.page.locator("h1").count() == 1, path
            assert opened.page.evaluate("document.documentElement.scrollWidth") <= width, path
        assert opened.csp_violations() == []
    finally:
        opened.close()
