"""The admin pages in a real headless Chromium, without JavaScript: sign in, read the overview,
follow the hanging transaction to its timeline, abort it through the confirmation page and see it
become CompleteAbort — with no console errors on any page.

With TXLOG_WRITE_SCREENSHOTS=1 the screenshots also go to docs/screenshots/ (for the README)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from tests.admin.conftest import ADMIN_TOKEN, QUIET_SWEEPER
from tests.admin.scenario import Scenario
from tests.conftest import _with_database, drop_database, new_database
from tests.support import ROOT, ServerProcess, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "docs" / "screenshots"
README_SHOTS = {"overview.png", "transaction.png"}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def cluster(
    pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Scenario]]:
    """A token-protected server on its own database, with the realistic scenario in it."""
    name = new_database(pg_admin_url, template_db)
    log = tmp_path_factory.mktemp("e2e-server") / "server.log"
    try:
        with ServerProcess(
            _with_database(pg_admin_url, name), env={"TXLOG_ADMIN_TOKEN": ADMIN_TOKEN, **QUIET_SWEEPER}, log_path=log
        ) as server:
            with server.client() as client:
                yield server, Scenario(client, hanging_timeout_ms=1500).build()
    finally:
        drop_database(pg_admin_url, name)


class Problems:
    """Console errors and uncaught page errors, wherever they happen."""

    def __init__(self, page: Page) -> None:
        self.seen: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.seen.append(f"page error: {exc}"))

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.seen.append(f"console error at {msg.location.get('url')}: {msg.text}")


def shoot(page: Page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("TXLOG_WRITE_SCREENSHOTS") == "1" and name in README_SHOTS:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, SCREENSHOTS / name)
    return path


def test_abort_a_hanging_transaction_in_the_browser(
    browser: Browser, cluster: tuple[ServerProcess, Scenario], tmp_path: Path
) -> None:
    server, scenario = cluster
    context = browser.new_context(
        base_url=server.url, java_script_enabled=False, viewport={"width": 1400, "height": 900}, color_scheme="light"
    )
    page = context.new_page()
    problems = Problems(page)
    try:
        # Signing in: any page sends us to the form, and back after it.
        page.goto("/admin/")
        assert page.url.startswith(server.url + "/admin/sign-in")
        page.fill("input[name=token]", "not the token")
        page.click("button[type=submit]")
        assert page.locator("[role=alert]").inner_text() == "That token is not right."
        # The refused sign-in answers 401, which the browser reports once; nothing else is expected.
        assert len(problems.seen) == 1 and "status of 401" in problems.seen[0]
        problems.seen.clear()
        page.fill("input[name=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        assert page.url == server.url + "/admin/"

        # The overview: partitions, the rate chart, and (once its 1.5 s timeout passes) the hanging transaction.
        def hanging_shown() -> bool:
            # Chromium refuses a reload issued while the page that a click navigated to is still
            # loading ("Not attached to an active page"), so each reload waits for the load first.
            page.wait_for_load_state("load")
            page.reload()
            return page.locator(".alert-row").count() == 1

        wait_until(hanging_shown, timeout=30, interval=0.3, message="the hanging transaction on the overview")
        assert page.locator("svg.pbar").count() == 14
        assert page.locator("svg.chart rect.bar").count() == 15
        alert = page.locator(".alert-row")
        assert "past its 1.5 s timeout" in alert.inner_text()
        shoot(page, tmp_path, "overview.png")

        # Follow it to its timeline.
        alert.get_by_role("link", name=scenario.hanging).click()
        assert page.url == f"{server.url}/admin/transactions/id/{scenario.hanging}"
        assert page.locator("h1 .badge").inner_text() == "Ongoing"
        timeline = page.locator("svg.timeline")
        assert timeline.is_visible()
        assert timeline.locator("text.state").all_text_contents() == [
            "Empty",
            "Ongoing",
            "PrepareCommit",
            "CompleteCommit",
            "Ongoing",
        ]
        assert "timed out" in timeline.locator("text.deadline-label").text_content()
        shoot(page, tmp_path, "transaction-hanging.png")

        # Abort it: a confirmation page first, then the form.
        page.get_by_role("link", name="Abort…").click()
        assert page.url == f"{server.url}/admin/transactions/abort/{scenario.hanging}"
        assert "ABORT marker" in page.locator("ul.consequences").inner_text()
        shoot(page, tmp_path, "abort-confirm.png")
        page.get_by_role("button", name="Abort transaction").click()

        assert page.url == f"{server.url}/admin/transactions/id/{scenario.hanging}?aborted=1"
        assert "Aborted by operator" in page.locator("[role=status]").inner_text()
        assert page.locator("h1 .badge").inner_text() == "CompleteAbort"
        states = page.locator("svg.timeline text.state").all_text_contents()
        assert states[-3:] == ["Ongoing", "PrepareAbort", "CompleteAbort"]
        assert page.get_by_role("link", name="Abort…").count() == 0
        shoot(page, tmp_path, "transaction.png")

        # The read side agrees: no alert left, the records are marked aborted, the LSO moved on.
        page.get_by_role("link", name="Overview", exact=True).click()
        assert page.locator(".alert-row").count() == 0 and page.locator(".all-clear").is_visible()
        page.goto(f"/admin/topics/{scenario.inventory}/1?mode=all")
        assert page.locator("span.tag.abort", has_text="ABORT marker").count() == 1
        assert page.locator("tr.lso-line").count() == 0
        page.locator(".seg-switch").get_by_role("link", name="read_committed").click()
        assert page.locator("tr.aborted").count() == 0
        for path in (
            "/admin/transactions",
            "/admin/producers",
            "/admin/groups",
            f"/admin/groups/{scenario.payments_group}",
            f"/admin/topics/{scenario.orders}",
        ):
            page.goto(path)
            assert page.locator("main h1").count() == 1
    finally:
        context.close()
    assert problems.seen == []


def test_dark_scheme_renders_without_errors(browser: Browser, cluster: tuple[ServerProcess, Scenario], tmp_path: Path) -> None:
    server, scenario = cluster
    context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 800}, color_scheme="dark")
    page = context.new_page()
    problems = Problems(page)
    try:
        page.goto("/admin/sign-in")
        page.fill("input[name=token]", ADMIN_TOKEN)
        page.click("button[type=submit]")
        page.goto(f"/admin/transactions/id/{scenario.processor}")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(14, 17, 22)"
        shoot(page, tmp_path, "transaction-dark.png")
    finally:
        context.close()
    assert problems.seen == []
