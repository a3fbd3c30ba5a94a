"""Every admin page over HTTP against a real ``txlog serve``: what each shows, sign-in with the
admin token, the anti-forgery check, the operator's abort, and refusals without a token."""

from __future__ import annotations

import html as htmllib
import re
import time
import uuid
from urllib.parse import quote

import httpx
import pytest

from app.services.inspect.rates import bucket_bounds
from tests.admin.conftest import ADMIN_TOKEN, csrf_of
from tests.admin.scenario import Producer, Scenario
from tests.support import ServerProcess, wait_until

PAGES = [
    "/admin/",
    "/admin/topics/orders",
    "/admin/topics/orders/3",
    "/admin/transactions",
    "/admin/transactions/id/payments-processor-0",
    "/admin/transactions/abort/order-enricher-2",
    "/admin/producers",
    "/admin/groups",
    "/admin/groups/payments-processor",
]


def text(html: str) -> str:
    """The page's text, tags removed and whitespace collapsed, for content checks."""
    no_tags = re.sub(r"<[^>]+>", " ", html)
    return re.sub(r"\s+", " ", htmllib.unescape(no_tags))


def offsets(html: str) -> list[int]:
    return [int(o) for o in re.findall(r'<td class="num off">(\d+)</td>', html)]


def ok(r: httpx.Response) -> str:
    assert r.status_code == 200, f"{r.request.url}: {r.status_code} {r.text[:2000]}"
    assert r.headers["content-type"].startswith("text/html")
    return r.text


def error_page(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, f"{r.request.url}: {r.status_code} {r.text[:2000]}"
    assert r.headers["content-type"].startswith("text/html")
    assert code in r.text
    return r.text


def txn_state(client: httpx.Client, tid: str) -> str:
    r = client.get(f"/v1/transactions/{quote(tid, safe='')}")
    assert r.status_code == 200, r.text
    return r.json()["state"]


# --- access ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES)
def test_every_page_requires_sign_in_with_a_token(anonymous: httpx.Client, scenario: Scenario, path: str) -> None:
    r = anonymous.get(path)
    assert r.status_code == 303
    assert r.headers["location"] == "/admin/sign-in?next=" + quote(path, safe="")


def test_actions_require_sign_in_with_a_token(anonymous: httpx.Client, scenario: Scenario) -> None:
    form = anonymous.get("/admin/sign-in")
    r = anonymous.post(f"/admin/transactions/abort/{scenario.enricher}", data={"csrf_token": csrf_of(form.text)})
    error_page(r, 401, "SASL_AUTHENTICATION_FAILED")
    assert txn_state(anonymous, scenario.enricher) == "Ongoing"


def test_sign_in_sets_a_strict_http_only_session_and_returns_to_the_page(anonymous: httpx.Client, scenario: Scenario) -> None:
    form = anonymous.get("/admin/sign-in", params={"next": "/admin/producers"})
    page = ok(form)
    assert 'type="password"' in page and 'value="/admin/producers"' in page
    csrf_cookie = form.headers["set-cookie"]
    assert "HttpOnly" in csrf_cookie and "SameSite=strict" in csrf_cookie and "Path=/admin" in csrf_cookie
    r = anonymous.post("/admin/sign-in", data={"token": ADMIN_TOKEN, "csrf_token": csrf_of(page), "next": "/admin/producers"})
    assert r.status_code == 303 and r.headers["location"] == "/admin/producers"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("txlog_admin_session=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/admin" in cookie
    assert "Producers" in ok(anonymous.get("/admin/producers"))


def test_sign_in_refuses_a_wrong_token_a_missing_csrf_token_and_foreign_redirects(anonymous: httpx.Client) -> None:
    csrf = csrf_of(anonymous.get("/admin/sign-in").text)
    r = anonymous.post("/admin/sign-in", data={"token": "guess", "csrf_token": csrf})
    assert r.status_code == 401 and "not right" in r.text and "txlog_admin_session" not in r.headers.get("set-cookie", "")
    r = anonymous.post("/admin/sign-in", data={"token": ADMIN_TOKEN})
    error_page(r, 403, "CLUSTER_AUTHORIZATION_FAILED")
    assert "anti-forgery" in r.text
    r = anonymous.post("/admin/sign-in", data={"token": ADMIN_TOKEN, "csrf_token": "x" * 32})
    error_page(r, 403, "CLUSTER_AUTHORIZATION_FAILED")
    r = anonymous.post("/admin/sign-in", data={"token": ADMIN_TOKEN, "csrf_token": csrf, "next": "https://evil.example/"})
    assert r.status_code == 303 and r.headers["location"] == "/admin/"
    assert anonymous.get("/admin/sign-in", params={"next": "//evil.example"}).headers["location"] == "/admin/"


def test_a_tampered_session_cookie_is_not_a_session(token_server: ServerProcess, admin: httpx.Client) -> None:
    session = admin.cookies.get("txlog_admin_session")
    assert session and ok(admin.get("/admin/"))
    payload, signature = session.split(".")
    for forged in (f"{payload}x.{signature}", f"{payload}.{signature[:-2]}", "admin", f"{payload}.{'A' * len(signature)}"):
        with token_server.client() as other:
            other.cookies.set("txlog_admin_session", forged, path="/admin")
            assert other.get("/admin/").status_code == 303


def test_sign_out_ends_the_session(admin: httpx.Client) -> None:
    page = ok(admin.get("/admin/"))
    assert "Sign out" in page
    r = admin.post("/admin/sign-out", data={"csrf_token": csrf_of(page)})
    assert r.status_code == 303 and 'txlog_admin_session=""' in r.headers["set-cookie"]
    assert admin.get("/admin/").status_code == 303


def test_pages_carry_security_headers_and_static_files_are_cached(admin: httpx.Client) -> None:
    r = admin.get("/admin/")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "script" not in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    css = admin.get("/admin/static/admin.css")
    assert css.status_code == 200 and "prefers-color-scheme: dark" in css.text
    assert css.headers["cache-control"].startswith("public")
    assert "<script" not in r.text


def test_no_openapi_for_the_admin_app(admin: httpx.Client) -> None:
    assert admin.get("/admin/openapi.json").status_code == 404
    assert admin.get("/admin/docs").status_code == 404
    assert "/admin" not in str(admin.get("/openapi.json").json()["paths"])


# --- pages ----------------------------------------------------------------------------------------


def test_overview(admin: httpx.Client, scenario: Scenario) -> None:
    # The hanging transaction passes its 1.5 s timeout; the sweeper does not run again.
    page = wait_until(lambda: (p := ok(admin.get("/admin/"))) and "past its" in p and p, message="the hanging alert")
    body = text(page)
    for topic in (scenario.orders, scenario.payments, scenario.inventory, scenario.audit):
        assert f'href="/admin/topics/{topic}"' in page
    assert "Hanging transactions 1" in body
    assert scenario.hanging in body and "past its 1.5 s timeout" in body
    assert f'href="/admin/transactions/abort/{scenario.hanging}"' in page
    assert page.count('class="pbar"') == 14  # one bar per partition
    # orders-3: log start 0, LSO at the hanging transaction's first offset, HW above it
    topics = admin.get(f"/v1/topics/{scenario.orders}").json()["partitions"]
    p3 = topics[3]
    assert p3["last_stable_offset"] < p3["high_watermark"]
    assert (
        f'aria-label="log start 0, last stable offset {p3["last_stable_offset"]}, high watermark {p3["high_watermark"]}"' in page
    )
    # The chart counts the records stamped since the start of its first whole-minute bucket: every
    # record of the scenario but the oldest history, depending on the minute the page is drawn in.
    while True:
        window_start = bucket_bounds(int(time.time() * 1000))[0]
        page = ok(admin.get("/admin/"))
        if bucket_bounds(int(time.time() * 1000))[0] == window_start:
            break  # drawn within one minute: the window is known
    counted = 0
    for t in (scenario.orders, scenario.payments, scenario.inventory, scenario.audit):
        for p in admin.get(f"/v1/topics/{t}").json()["partitions"]:
            records = admin.get(
                f"/v1/topics/{t}/partitions/{p['partition']}/records", params={"offset": 0, "max_records": 10_000}
            ).json()["records"]
            # control records have no entry in a fetch; they are stamped when appended, inside the window
            counted += p["high_watermark"] - sum(1 for r in records if r["timestamp_ms"] < window_start)
    assert re.search(rf"<b>{counted:,}</b>\s*records, 15 min", page)
    # Transactions by state: 2 Ongoing, 2 CompleteCommit (the refunds id committed after its abort)
    states = dict(
        re.findall(
            r'<span class="badge state-\w+">(\w+)</span>\s*<svg class="meter".*?<span class="n[^"]*">(\d+)</span>', page, re.S
        )
    )
    assert states == {
        "Empty": "0",
        "Ongoing": "2",
        "PrepareCommit": "0",
        "PrepareAbort": "0",
        "CompleteCommit": "2",
        "CompleteAbort": "0",
        "Dead": "0",
    }


def test_topic_page(admin: httpx.Client, scenario: Scenario) -> None:
    page = ok(admin.get(f"/admin/topics/{scenario.inventory}"))
    for p in range(4):
        assert f'href="/admin/topics/{scenario.inventory}/{p}"' in page
    assert "Holding the LSO" in page and f'href="/admin/transactions/id/{scenario.hanging}"' in page
    error_page(admin.get("/admin/topics/no-such-topic"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_topic_page_shows_every_config_with_where_it_comes_from(admin: httpx.Client, topic_name: str) -> None:
    created = admin.post(
        "/v1/topics", json={"name": topic_name, "partitions": 1, "config": {"retention.ms": 86_400_000, "segment.ms": 60_000}}
    )
    assert created.status_code == 201, created.text
    configs = text(ok(admin.get(f"/admin/topics/{topic_name}")).split('id="configs"')[1])
    assert "retention.ms 86400000 this topic applied" in configs
    assert "segment.ms 60000 this topic kept, no effect" in configs
    assert "retention.bytes -1 default applied" in configs  # the server's default: keep everything
    assert "cleanup.policy delete default applied" in configs


def test_record_browser_modes(admin: httpx.Client, scenario: Scenario) -> None:
    base = f"/admin/topics/{scenario.payments}/1"
    everything = ok(admin.get(base, params={"mode": "all"}))
    log = admin.get(f"/v1/topics/{scenario.payments}/partitions/1/records", params={"offset": 0}).json()["records"]
    hw = admin.get(f"/v1/topics/{scenario.payments}").json()["partitions"][1]["high_watermark"]
    assert offsets(everything) == list(range(hw))
    assert everything.count('<span class="tag commit">COMMIT marker</span>') == 3
    assert everything.count('<span class="tag abort">ABORT marker</span>') == 1
    assert everything.count('<span class="tag aborted">aborted</span>') == 3  # the refunds batch
    assert "payment_id" in everything and "source=" in text(everything)

    uncommitted = ok(admin.get(base, params={"mode": "read_uncommitted"}))
    assert "marker</span>" not in uncommitted
    assert offsets(uncommitted) == [r["offset"] for r in log]  # aborted records included, as in the API
    assert uncommitted.count('<span class="tag aborted">aborted</span>') == 3

    committed = ok(admin.get(base, params={"mode": "read_committed"}))
    committed_log = admin.get(
        f"/v1/topics/{scenario.payments}/partitions/1/records", params={"offset": 0, "isolation_level": "read_committed"}
    ).json()["records"]
    assert offsets(committed) == [r["offset"] for r in committed_log] and "aborted</span>" not in committed


def test_record_browser_shows_the_last_stable_offset_and_open_records(admin: httpx.Client, scenario: Scenario) -> None:
    p3 = admin.get(f"/v1/topics/{scenario.orders}").json()["partitions"][3]
    page = ok(admin.get(f"/admin/topics/{scenario.orders}/3"))
    assert f"last stable offset {p3['last_stable_offset']}" in text(page)
    assert page.count('<span class="tag open">open txn</span>') == 1
    assert offsets(page)[-1] == p3["high_watermark"] - 1  # the tail by default


def test_record_browser_paging(admin: httpx.Client, scenario: Scenario) -> None:
    base = f"/admin/topics/{scenario.orders}/0"
    first = ok(admin.get(base, params={"offset": 0, "limit": 25}))
    assert offsets(first) == list(range(25))
    assert f'href="{base}?mode=all&amp;offset=25&amp;limit=25"' in first  # newer
    second = ok(admin.get(base, params={"offset": 25, "limit": 25}))
    assert offsets(second) == list(range(25, 50))
    back = ok(admin.get(base, params={"before": 25, "limit": 25}))
    assert offsets(back) == list(range(25))
    error_page(admin.get(base, params={"mode": "sideways"}), 400, "INVALID_REQUEST")
    error_page(admin.get(base, params={"offset": -1}), 400, "INVALID_REQUEST")
    error_page(admin.get(f"/admin/topics/{scenario.orders}/99"), 404, "UNKNOWN_TOPIC_OR_PARTITION")


def test_transaction_list_filters(admin: httpx.Client, scenario: Scenario) -> None:
    everything = ok(admin.get("/admin/transactions"))
    for tid in (scenario.processor, scenario.refunds, scenario.hanging, scenario.enricher):
        assert f'href="/admin/transactions/id/{tid}"' in everything
    ongoing = ok(admin.get("/admin/transactions", params={"state": "Ongoing"}))
    assert scenario.hanging in ongoing and scenario.enricher in ongoing and scenario.processor not in ongoing
    opened = ok(admin.get("/admin/transactions", params={"state": "open"}))
    assert scenario.hanging in opened and scenario.refunds not in opened
    by_prefix = ok(admin.get("/admin/transactions", params={"prefix": "payments-"}))
    assert scenario.processor in by_prefix and scenario.refunds not in by_prefix
    assert "No transactions match" in ok(admin.get("/admin/transactions", params={"older_than": "1d"}))
    error_page(admin.get("/admin/transactions", params={"state": "Sleeping"}), 400, "INVALID_REQUEST")
    error_page(admin.get("/admin/transactions", params={"older_than": "soon"}), 400, "INVALID_REQUEST")


def test_transaction_detail_and_timeline(admin: httpx.Client, scenario: Scenario) -> None:
    page = ok(admin.get(f"/admin/transactions/id/{scenario.processor}"))
    body = text(page)
    assert '<svg class="timeline"' in page
    states = re.findall(r'<text class="state"[^>]*>(\w+)</text>', page)
    assert states == ["Empty"] + ["Ongoing", "PrepareCommit", "CompleteCommit"] * 3
    assert "pid " in body and "CompleteCommit" in body
    history = re.search(r"Producer id and epoch history(.*?)</table>", page, re.S).group(1)  # type: ignore[union-attr]
    assert len(re.findall(r"<tr>", history)) == 1 + 4  # header + epochs 0..3
    assert "after a commit" in history
    events = admin.get(f"/v1/transactions/{scenario.processor}/events").json()["events"]
    assert body.count(" → ") >= len(events) - 1

    hanging = ok(admin.get(f"/admin/transactions/id/{scenario.hanging}"))
    assert "Hanging." in hanging and "times out" not in hanging and "timed out" in hanging
    assert f'href="/admin/groups/{scenario.payments_group}"' in hanging  # its pending offset
    assert hanging.count('<span class="tag open">yes') == 2  # holds the LSO of both its partitions
    error_page(admin.get("/admin/transactions/id/nobody-here"), 404, "TRANSACTIONAL_ID_NOT_FOUND")


def test_transactional_ids_with_any_characters_have_pages(admin: httpx.Client, scenario: Scenario) -> None:
    tid = f"odd/id with space?&%#{uuid.uuid4().hex[:4]}"
    p = Producer(admin, tid, 900_000).init()
    p.send(scenario.audit, 0, [{"key": "k", "value": "v"}])
    listing = ok(admin.get("/admin/transactions", params={"prefix": "odd/"}))
    link = "/admin/transactions/id/" + quote(tid, safe="")
    assert f'href="{link}"' in listing
    assert htmllib.escape(tid) in ok(admin.get(link))


def test_producers_page(admin: httpx.Client, scenario: Scenario) -> None:
    page = ok(admin.get("/admin/producers"))
    body = text(page)
    assert scenario.hanging in body and "idempotent" in body and "open transaction" in body
    state = admin.get("/v1/transactions/" + scenario.hanging).json()
    mine = ok(admin.get("/admin/producers", params={"producer_id": state["producer_id"]}))
    # its committed transaction's partition, and the two of its open one
    assert mine.count(f'href="/admin/transactions/id/{scenario.hanging}"') == 3
    opened = ok(admin.get("/admin/producers", params={"open_only": "true"}))
    assert text(opened).count("open transaction") >= 4  # hanging (2) + enricher (2), plus the filter label
    assert scenario.processor not in opened
    assert "a number" in ok(admin.get("/admin/producers", params={"producer_id": "abc"}))


def test_consumer_group_pages(admin: httpx.Client, scenario: Scenario) -> None:
    listing = ok(admin.get("/admin/groups"))
    assert scenario.payments_group in listing and scenario.analytics_group in listing
    page = ok(admin.get(f"/admin/groups/{scenario.analytics_group}"))
    statuses = admin.get(f"/v1/topics/{scenario.orders}").json()["partitions"]
    offsets_committed = {
        o["partition"]: o["offset"] for o in admin.get(f"/v1/groups/{scenario.analytics_group}/offsets").json()["offsets"]
    }
    lag = sum(max(statuses[p]["last_stable_offset"] - o, 0) for p, o in offsets_committed.items())
    assert f"lag {lag:,}" in text(page)
    pending = ok(admin.get(f"/admin/groups/{scenario.payments_group}"))
    assert f'href="/admin/transactions/id/{scenario.hanging}"' in pending
    assert "No committed offsets" in ok(admin.get("/admin/groups/nobody"))


def test_unknown_page_is_an_html_404(admin: httpx.Client) -> None:
    r = admin.get("/admin/nowhere")
    assert r.status_code == 404 and "No such page" in r.text


# --- the operator's abort -------------------------------------------------------------------------


def test_abort_needs_confirmation_and_the_session_csrf_token(admin: httpx.Client, scenario: Scenario) -> None:
    tid = f"abort-me-{uuid.uuid4().hex[:6]}"
    p = Producer(admin, tid, 900_000).init()
    p.send(scenario.payments, 0, [{"key": "k", "value": "v"}])
    p.commit_offsets(scenario.analytics_group, [(scenario.orders, 0, 1)])

    confirm = ok(admin.get(f"/admin/transactions/abort/{tid}"))
    assert "ABORT marker" in confirm and "PRODUCER_FENCED" in confirm and "pending group offset" in confirm
    token = csrf_of(confirm)
    session_token = csrf_of(ok(admin.get("/admin/")))
    assert token == session_token  # per session, not per page

    error_page(admin.post(f"/admin/transactions/abort/{tid}"), 403, "CLUSTER_AUTHORIZATION_FAILED")
    error_page(
        admin.post(f"/admin/transactions/abort/{tid}", data={"csrf_token": "forged" * 5}), 403, "CLUSTER_AUTHORIZATION_FAILED"
    )
    r = admin.post(f"/admin/transactions/abort/{tid}", data={"csrf_token": token}, headers={"Origin": "https://evil.example"})
    error_page(r, 403, "CLUSTER_AUTHORIZATION_FAILED")
    assert txn_state(admin, tid) == "Ongoing"

    r = admin.post(
        f"/admin/transactions/abort/{tid}", data={"csrf_token": token}, headers={"Origin": str(admin.base_url).rstrip("/")}
    )
    assert r.status_code == 303 and r.headers["location"] == f"/admin/transactions/id/{tid}?aborted=1"
    after = ok(admin.get(r.headers["location"]))
    assert "Aborted by operator" in after and 'class="badge state-completeabort big"' in after
    got = admin.get(f"/v1/transactions/{tid}").json()
    assert got["state"] == "CompleteAbort" and got["fence_reason"] == "aborted_by_operator"
    fenced = admin.post(
        f"/v1/topics/{scenario.payments}/partitions/0/records",
        json={
            "producer_id": p.producer_id,
            "producer_epoch": p.producer_epoch,
            "base_sequence": 1,
            "transactional_id": tid,
            "records": [{"key": "late", "value": "x"}],
        },
    )
    assert fenced.status_code == 409 and fenced.json()["error"]["reason"] == "aborted_by_operator"
    # Aborting again: nothing to abort.
    error_page(admin.post(f"/admin/transactions/abort/{tid}", data={"csrf_token": token}), 409, "INVALID_TXN_STATE")


# --- without a token ------------------------------------------------------------------------------


def _open_txn(api: httpx.Client, topic: str) -> str:
    assert api.post("/v1/topics", json={"name": topic, "partitions": 1}).status_code == 201
    tid = f"{topic}-txn"
    Producer(api, tid, 900_000).init().send(topic, 0, [{"key": "k", "value": "v"}])
    return tid


def test_without_a_token_pages_are_open_and_loopback_operators_may_abort(api: httpx.Client, topic_name: str) -> None:
    tid = _open_txn(api, topic_name)
    page = ok(api.get("/admin/"))
    assert "local operator" in page and "Sign out" not in page
    assert api.get("/admin/sign-in").status_code == 303  # nothing to sign in to
    detail = ok(api.get(f"/admin/transactions/id/{tid}"))
    assert f'href="/admin/transactions/abort/{tid}"' in detail
    confirm = ok(api.get(f"/admin/transactions/abort/{tid}"))
    error_page(api.post(f"/admin/transactions/abort/{tid}"), 403, "CLUSTER_AUTHORIZATION_FAILED")  # no CSRF token
    assert txn_state(api, tid) == "Ongoing"
    r = api.post(f"/admin/transactions/abort/{tid}", data={"csrf_token": csrf_of(confirm)})
    assert r.status_code == 303
    assert txn_state(api, tid) == "CompleteAbort"


def test_without_a_token_a_relayed_request_is_read_only(api: httpx.Client, topic_name: str) -> None:
    tid = _open_txn(api, topic_name)
    relayed = {"X-Forwarded-For": "203.0.113.9"}
    page = ok(api.get(f"/admin/transactions/id/{tid}", headers=relayed))
    assert "read-only" in page and f'href="/admin/transactions/abort/{tid}"' not in page
    assert 'aria-disabled="true"' in page
    error_page(api.get(f"/admin/transactions/abort/{tid}", headers=relayed), 403, "CLUSTER_AUTHORIZATION_FAILED")
    csrf = csrf_of(ok(api.get(f"/admin/transactions/abort/{tid}")))  # a valid token, taken over loopback
    r = api.post(f"/admin/transactions/abort/{tid}", data={"csrf_token": csrf}, headers=relayed)
    assert "read-only" in error_page(r, 403, "CLUSTER_AUTHORIZATION_FAILED")
    assert txn_state(api, tid) == "Ongoing"
    api.post(f"/v1/transactions/{tid}/abort")  # tidy up through the API
