#!/usr/bin/env python3
"""Screenshots of the control plane's web UI for the README: serves the control plane on
loopback (SQLite in a temporary folder; the browser tests' in-process server, whose leader
runs remediation plans on the tests' site backend and reads their site topology), seeds it
through its ingest API with the browser tests' fleet (tests/control/ui/seed.py and plans.py),
and writes one PNG per page, light and dark at 1280×800 and light at phone width, with
Debian's chromium driven by Playwright.

    python scripts/ui_screenshots.py docs/screenshots/

Run from the repository root with the test extra installed (`pip install -e .[test]`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import sync_playwright

from tests.control.conftest import mint
from tests.control.ui.live import LiveServer
from tests.control.ui.plans import POLICY, SiteBackend, remediation_jobs, topology
from tests.control.ui.seed import seed
from tests.control.ui.test_ui_actions_browser import call

SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}


def pages(incidents: dict[str, int]) -> dict[str, str]:
    return {
        "fleet": "/",
        "incident": f"/incidents/{incidents['train-llama-70b']}",
        "evidence": "/evidence/r-llama-0142/e1",
        "jobs": "/jobs",
        "host": "/hosts/gpu-a07",
        "actions": "/actions",
        "audit": "/audit",
        "login": "/login",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the PNGs (docs/screenshots/)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("ui_screenshots: chromium not found: apt-get install chromium", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'control.db'}"
        tokens = {
            "acme": mint(url, "acme", "operator"),
            "acme_viewer": mint(url, "acme", "viewer"),
            "globex": mint(url, "globex", "operator"),
        }
        admin = mint(url, "acme", "admin")
        server = LiveServer(url, backend=SiteBackend(), topology=topology()).start()
        try:
            call(server.base, "PUT", "/api/v1/remediation/policy", admin, POLICY)
            fleet = seed(server.base, tokens)
            for report in remediation_jobs():
                call(server.base, "POST", "/api/v1/reports", tokens["acme"], report)
            wait_for_plans(server.base, admin)
            shots = [
                ("light", "desktop"),
                ("dark", "desktop"),
                ("light", "phone"),
            ]
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"]
                )
                for scheme, size in shots:
                    context = browser.new_context(
                        base_url=fleet.base,
                        viewport=SIZES[size],
                        color_scheme=scheme,
                        device_scale_factor=1,
                    )
                    page = context.new_page()
                    page.goto("/login")
                    if size == "desktop" and scheme == "light":
                        page.screenshot(path=str(args.out / "login-light.png"))
                    page.fill("#token", admin)
                    page.click("button[type=submit]")
                    page.wait_for_url("**/")
                    for name, path in pages(fleet.incidents).items():
                        if name == "login" or (
                            size == "phone" and name not in ("fleet", "incident", "actions")
                        ):
                            continue
                        page.goto(path)
                        target = (
                            args.out / f"{name}-{scheme}{'-phone' if size == 'phone' else ''}.png"
                        )
                        page.screenshot(path=str(target))
                        print(target)
                    context.close()
                browser.close()
        finally:
            server.stop()
    return 0


def wait_for_plans(base: str, token: str, timeout_s: float = 60.0) -> None:
    """Until the leader has proposed and run the seeded plans (one waits, one is done, one
    failed)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = call(base, "GET", "/api/v1/remediation/plans", token)["items"]
        if {"waiting", "done", "failed"} <= {p["status"] for p in items}:
            return
        time.sleep(0.3)
    raise SystemExit("ui_screenshots: the leader did not run the seeded plans in time")


if __name__ == "__main__":
    raise SystemExit(main())
