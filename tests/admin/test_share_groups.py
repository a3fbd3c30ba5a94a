"""The share groups pages of a real ``txlog serve``: the list with each group's records by state and
lock holders, a group's share partitions (SPSO/SPEO) and in-flight records with their lock holders
and delivery counts, sign-in required, and the pages in headless Chromium."""

from __future__ import annotations

import html as htmllib
import re
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import httpx
import pytest

from tests.admin.conftest import ADMIN_TOKEN
from tests.support import ServerProcess


def text(html: str) -> str:
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", html)))


@pytest.fixture(scope="module")
def shared(token_server: ServerProcess) -> Iterator[tuple[str, str]]:
    yield make_shared(token_server)


def make_shared(token_server: ServerProcess) -> tuple[str, str]:
    """A topic of five records and a share group in which worker-a holds offsets 0-1, worker-b holds
    offset 2 on its second delivery, offset 3 was rejected and offset 4 is not yet delivered. The
    locks last the default 30 s: a test that looks at them makes its own group."""
    topic, group = f"sq-{uuid.uuid4().hex[:8]}", f"workers-{uuid.uuid4().hex[:6]}"
    with token_server.client() as api:
        assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
        r = api.post(f"/v1/topics/{topic}/partitions/0/records", json={"records": [{"value": v} for v in "abcde"]})
        assert r.status_code == 200, r.text
        r = api.patch(f"/v1/share-groups/{group}/configs", json={"configs": {"share.auto.offset.reset": "earliest"}})
        assert r.status_code == 200, r.text

        def acquire(member: str, n: int) -> list[int]:
            r = api.post(f"/v1/share-groups/{group}/acquire", json={"member_id": member, "topic": topic, "max_records": n})
            assert r.status_code == 200, r.text
            return [rec["offset"] for rec in r.json()["records"]]

        def acknowledge(member: str, offset: int, kind: str) -> None:
            r = api.post(
                f"/v1/share-groups/{group}/acknowledge",
                json={
                    "member_id": member,
                    "acknowledgements": [{"topic": topic, "partition": 0, "offset": offset, "type": kind}],
                },
            )
            assert r.status_code == 200, r.text

        assert acquire("worker-a", 4) == [0, 1, 2, 3]
        acknowledge("worker-a", 2, "release")
        acknowledge("worker-a", 3, "reject")
        assert acquire("worker-b", 1) == [2]
    return topic, group


def test_share_group_pages_show_in_flight_records_holders_and_delivery_counts(
    admin: httpx.Client, shared: tuple[str, str]
) -> None:
    topic, group = shared
    listed = admin.get("/admin/share-groups")
    assert listed.status_code == 200, listed.text
    page = text(listed.text)
    # group, share partitions, available, acquired, acknowledged, archived, holders, max deliveries
    assert f"{group} 1 0 3 0 1 worker-a , worker-b 2" in page
    assert f'href="/admin/share-groups/{group}"' in listed.text
    assert 'href="/admin/share-groups"' in listed.text  # in the navigation

    detail = admin.get(f"/admin/share-groups/{group}")
    assert detail.status_code == 200, detail.text
    page = text(detail.text)
    assert f"{topic}-0 0 3 0 3 0 1" in page  # SPSO 0, SPEO 3, records by state
    assert f"{topic}-0 0 1 Acquired worker-a" in page
    assert f"{topic}-0 2 2 Acquired worker-b" in page
    assert re.search(rf"{topic}-0 2 2 Acquired worker-b \d+\.\d s 2", page)
    assert f"{topic}-0 3 3 Archived 1" in page
    assert "share.auto.offset.reset earliest set" in page and "share.delivery.count.limit 5 default" in page

    unknown = text(admin.get("/admin/share-groups/nobody-here").text)
    assert "The group has not read any partition." in unknown and "Nothing in flight." in unknown


def test_share_group_pages_require_sign_in(anonymous: httpx.Client, shared: tuple[str, str]) -> None:
    for path in ("/admin/share-groups", f"/admin/share-groups/{shared[1]}"):
        r = anonymous.get(path)
        assert r.status_code == 303
        assert r.headers["location"] == "/admin/sign-in?next=" + quote(path, safe="")


def test_share_group_pages_in_a_browser(token_server: ServerProcess, tmp_path: Path) -> None:
    """In headless Chromium without JavaScript: from the navigation to a share group, its in-flight
    records and on to a partition; no console error (the pages keep to the content security policy)."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_admin_browser import CHROMIUM, CHROMIUM_ARGS, Problems

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(
                base_url=token_server.url, java_script_enabled=False, viewport={"width": 1400, "height": 900}
            ).new_page()
            problems = Problems(page)
            page.goto("/admin/sign-in?next=/admin/")
            page.fill("input[name=token]", ADMIN_TOKEN)
            page.click("button[type=submit]")
            topic, group = make_shared(token_server)  # its locks held from here on, for 30 s
            page.get_by_role("link", name="Share groups", exact=True).first.click()
            assert page.url == token_server.url + "/admin/share-groups"
            assert page.locator("nav a.active").inner_text() == "Share groups"
            page.get_by_role("link", name=group).click()
            assert page.locator("table.in-flight td.member-id").all_inner_texts() == ["worker-a", "worker-b", ""]
            assert page.locator("table.in-flight td.record-state").all_inner_texts() == ["Acquired", "Acquired", "Archived"]
            assert page.locator("table.in-flight td.delivery-count").all_inner_texts() == ["1", "2", "1"]
            page.screenshot(path=str(tmp_path / "share-group.png"), full_page=True)
            page.locator("table.share-partitions").get_by_role("link", name=f"{topic}-0").click()
            assert page.url == f"{token_server.url}/admin/topics/{topic}/0?offset=0"
            assert problems.seen == []
        finally:
            browser.close()
