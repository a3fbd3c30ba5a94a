"""Half messages end to end: a real ``txlog serve`` (its checker running), the Python
``TransactionProducer`` with its real check-back endpoint, and the seed's CreateOrderService
example with its order table in PostgreSQL. The local transaction succeeds, fails, hangs; the
producer dies before deciding and the check-back decides; commits and rollbacks are repeated and
raced over HTTP."""

from __future__ import annotations

import importlib.util
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import psycopg
import pytest

from tests.conftest import fresh_database
from tests.half.endpoint import Endpoint, answer
from tests.support import ROOT, ServerProcess, wait_until
from txlog.rocketmq import CheckBackListener, Message, MessageExt, TransactionListener, TransactionProducer
from txlog.rocketmq import LocalTransactionState as S

CHECKER = {"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100", "TXLOG_HALF_CHECK_TIMEOUT_MS": "2000"}
KNOBS = {"check_interval_ms": 150, "check_immunity_ms": 300, "max_checks": 4}


@pytest.fixture(scope="module")
def half_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def server(half_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(half_db, env=CHECKER, log_path=tmp_path_factory.mktemp("half") / "server.log") as s:
        yield s


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def topic(api: httpx.Client, topic_name: str) -> str:
    assert api.post("/v1/topics", json={"name": topic_name, "partitions": 2}).status_code == 201
    return topic_name


def committed_values(api: httpx.Client, topic: str) -> list[str]:
    out = []
    for p in range(2):
        r = api.get(f"/v1/topics/{topic}/partitions/{p}/records", params={"isolation_level": "read_committed"})
        assert r.status_code == 200, r.text
        out += [rec["value"] for rec in r.json()["records"]]
    return sorted(out)


def half(api: httpx.Client, tid: str) -> dict:
    r = api.get(f"/v1/half-messages/{tid}")
    assert r.status_code == 200, r.text
    return r.json()


class Shop(TransactionListener):
    """A local "database" of orders; the message body says what the local transaction does."""

    def __init__(self) -> None:
        self.orders: set[str] = set()
        self.failed: set[str] = set()
        self.asked = threading.Event()
        self.release = threading.Event()

    def execute_local_transaction(self, msg: Message, arg: object) -> S:
        order = msg.get_user_property("orderId")
        if msg.body == "fails":
            self.failed.add(order)  # type: ignore[arg-type]
            raise RuntimeError("the local transaction failed")
        if msg.body == "refused":
            return S.ROLLBACK_MESSAGE
        if msg.body == "hangs":
            self.release.wait(30)  # until the server has asked about it
        self.orders.add(order)  # type: ignore[arg-type]
        return S.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> S:
        order = msg.get_user_property("orderId")
        if msg.body == b"hangs":
            self.asked.set()
        if order in self.orders:
            return S.COMMIT_MESSAGE
        return S.ROLLBACK_MESSAGE if order in self.failed else S.UNKNOW


def producer(server: ServerProcess, group: str, listener: TransactionListener) -> TransactionProducer:
    p = TransactionProducer(group, url=server.url, **KNOBS)
    p.set_transaction_listener(listener)
    p.start()
    return p


def order(topic: str, order_id: str, body: str) -> Message:
    m = Message(topic, body=body, key=order_id)
    m.put_user_property("orderId", order_id)
    return m


def test_local_transactions_that_succeed_refuse_or_fail(server, api, topic):
    shop = Shop()
    p = producer(server, "shop-a", shop)
    try:
        ok = p.send_message_in_transaction(order(topic, "o1", "ok"))
        refused = p.send_message_in_transaction(order(topic, "o2", "refused"))
        failed = p.send_message_in_transaction(order(topic, "o3", "fails"))
        assert ok.local_transaction_state is S.COMMIT_MESSAGE and ok.offset is not None
        assert refused.local_transaction_state is S.ROLLBACK_MESSAGE
        assert failed.local_transaction_state is S.UNKNOW  # an exception: the check-back decides
        assert half(api, ok.transaction_id)["state"] == "Committed"
        assert half(api, refused.transaction_id)["state"] == "RolledBack"
        wait_until(lambda: half(api, failed.transaction_id)["state"] != "Prepared", 20, 0.1, "the check-back to decide")
    finally:
        p.shutdown()
    decided = half(api, failed.transaction_id)
    assert (decided["state"], decided["decided_by"]) == ("RolledBack", "check_back")
    assert [c["answer"] for c in decided["checks"]] == ["ROLLBACK"]
    assert committed_values(api, topic) == ["ok"]


def test_a_hanging_local_transaction_is_asked_about_meanwhile_and_committed_once_it_ends(server, api, topic):
    shop = Shop()
    p = producer(server, "shop-b", shop)

    def release_when_asked() -> None:
        shop.asked.wait(30)
        shop.release.set()

    try:
        threading.Thread(target=release_when_asked, daemon=True).start()
        result = p.send_message_in_transaction(order(topic, "slow-1", "hangs"))
    finally:
        p.shutdown()
    assert result.local_transaction_state is S.COMMIT_MESSAGE
    h = half(api, result.transaction_id)
    assert (h["state"], h["decided_by"]) == ("Committed", "producer")
    assert h["checks"] and h["checks"][0]["answer"] == "UNKNOWN"  # asked while it ran: not known yet
    assert committed_values(api, topic) == ["hangs"]


def test_a_producer_that_dies_before_deciding_is_decided_by_the_check_back(server, api, topic):
    """The half message is sent, the local transaction commits, and the producer dies before its
    commit reaches the server: a restarted instance of the service serves the check-back."""
    shop = Shop()
    shop.orders.add("o9")  # the local transaction committed before the process died
    listener = CheckBackListener(shop).start()
    try:
        r = api.put("/v1/producer-groups/shop-c", json={"check_url": listener.url, **KNOBS})
        assert r.status_code == 200 and r.json()["registered"], r.text
        sent = api.post(
            "/v1/half-messages",
            json={"producer_group": "shop-c", "topic": topic, "key": "o9", "value": "paid", "headers": {"orderId": "o9"}},
        )
        assert sent.status_code == 200, sent.text
        tid = sent.json()["transaction_id"]
        assert sent.json()["state"] == "Prepared"
        wait_until(lambda: half(api, tid)["state"] == "Committed", 20, 0.1, "the check-back to commit")
    finally:
        listener.stop()
    h = half(api, tid)
    assert h["decided_by"] == "check_back" and [c["answer"] for c in h["checks"]] == ["COMMIT"]
    assert committed_values(api, topic) == ["paid"]
    # the producer's own commit arrives late: the same outcome, nothing appended again
    again = api.post(f"/v1/half-messages/{tid}/commit")
    assert again.status_code == 200 and again.json()["offset"] == h["offset"]
    assert committed_values(api, topic) == ["paid"]


def test_commits_and_rollbacks_over_http_are_safe_to_repeat_and_race(api, topic):
    tids = []
    for i in range(6):
        r = api.post("/v1/half-messages", json={"producer_group": "racers", "topic": topic, "partition": i % 2, "value": f"v{i}"})
        assert r.status_code == 200, r.text
        tids.append(r.json()["transaction_id"])
    barrier = threading.Barrier(6)

    def race(worker: int) -> list[tuple[str, int, str]]:
        barrier.wait()
        action = "commit" if worker % 2 == 0 else "rollback"
        out = []
        with httpx.Client(base_url=str(api.base_url), timeout=30) as c:
            for tid in tids:
                r = c.post(f"/v1/half-messages/{tid}/{action}")
                out.append((tid, r.status_code, r.json()["error"]["code"] if r.status_code != 200 else r.json()["state"]))
        return out

    with ThreadPoolExecutor(6) as pool:
        answers = [a for result in pool.map(race, range(6)) for a in result]
    expected = []
    for i, tid in enumerate(tids):
        final = half(api, tid)["state"]
        mine = sorted((status, what) for t, status, what in answers if t == tid)
        assert mine == sorted([(200, final)] * 3 + [(409, "INVALID_TXN_STATE")] * 3)
        if final == "Committed":
            expected.append(f"v{i}")
    assert committed_values(api, topic) == sorted(expected)


def test_errors_are_named_and_declared(api, topic):
    cases = [
        (api.post("/v1/half-messages/NO-SUCH/commit"), 404, "TRANSACTIONAL_ID_NOT_FOUND"),
        (
            api.post("/v1/half-messages", json={"producer_group": "g", "topic": "no-such-topic", "value": "v"}),
            404,
            "UNKNOWN_TOPIC_OR_PARTITION",
        ),
        (
            api.post("/v1/half-messages", json={"producer_group": "g", "topic": topic, "partition": 7, "value": "v"}),
            404,
            "UNKNOWN_TOPIC_OR_PARTITION",
        ),
        (
            api.post("/v1/half-messages", json={"producer_group": "g", "topic": topic, "value": "%%", "encoding": "base64"}),
            400,
            "INVALID_RECORD",
        ),
        (api.post("/v1/half-messages", json={"topic": topic}), 422, "INVALID_REQUEST"),
        (api.put("/v1/producer-groups/g", json={"check_url": "http://169.254.169.254/latest"}), 400, "INVALID_CONFIG"),
        (api.put("/v1/producer-groups/g", json={"check_url": "http://127.0.0.1/", "max_checks": 0}), 422, "INVALID_REQUEST"),
        (api.get("/v1/half-messages", params={"state": "Maybe"}), 400, "INVALID_REQUEST"),
    ]
    for r, status, code in cases:
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    spec = api.get("/openapi.json").json()["paths"]
    declared = {
        ("/v1/half-messages", "post"): {"400", "404", "409", "413", "422", "503"},
        ("/v1/half-messages/{transaction_id}/commit", "post"): {"400", "404", "409", "422", "503"},
        ("/v1/half-messages/{transaction_id}/rollback", "post"): {"400", "404", "409", "422", "503"},
        ("/v1/half-messages/{transaction_id}", "get"): {"400", "404", "422", "503"},
        ("/v1/producer-groups/{group}", "put"): {"400", "413", "422", "503"},
    }
    for (path, method), statuses in declared.items():
        assert statuses <= set(spec[path][method]["responses"]), (path, method)
    defaults = api.get("/v1/producer-groups/never-registered").json()
    assert defaults == {
        "producer_group": "never-registered",
        "check_url": None,
        "check_interval_ms": 60000,
        "check_immunity_ms": 6000,
        "max_checks": 15,
        "registered": False,
        "updated_at_ms": None,
    }


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("create_order_service", ROOT / "examples" / "create_order_service.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_seeds_create_order_service_creates_the_order_and_sends_it_or_neither(server, api, half_db):
    example = _example()
    requests = [
        example.CreateOrderRequest("order-1", "book", 1),
        example.CreateOrderRequest("order-2", "lamp", 2),
        example.CreateOrderRequest("order-1", "book", 1),  # a duplicate order: the insert fails
        example.CreateOrderRequest("order-3", "chair", 0),  # refused by the table's check
    ]
    assert example.run(server.url, half_db, requests) == [True, True, False, False]
    with psycopg.connect(half_db) as conn:
        assert conn.execute("SELECT order_id FROM orders ORDER BY order_id").fetchall() == [("order-1",), ("order-2",)]
        sent = conn.execute("SELECT key FROM txlog.committed_records WHERE topic = 'orders' ORDER BY key").fetchall()
        assert sent == [(b"order-1",), (b"order-2",)]
        assert conn.execute(
            "SELECT state, count(*) FROM txlog.half_messages WHERE producer_group = 'myGroup' GROUP BY state ORDER BY state"
        ).fetchall() == [("Committed", 2), ("RolledBack", 2)]


def test_admin_pages_and_views_show_pending_half_messages_with_their_checks_and_the_outbox_backlog(server, api, half_db, topic):
    with Endpoint(answer("UNKNOWN")) as endpoint:
        r = api.put(
            "/v1/producer-groups/watched",
            json={"check_url": endpoint.url, "check_interval_ms": 100, "check_immunity_ms": 0, "max_checks": 1000},
        )
        assert r.status_code == 200, r.text
        tid = api.post(
            "/v1/half-messages", json={"producer_group": "watched", "topic": topic, "partition": 1, "value": "pending"}
        ).json()["transaction_id"]
        # checks keep coming every 100 ms: wait until two have been answered and recorded
        wait_until(
            lambda: len([c for c in half(api, tid)["checks"] if c["answer"] == "UNKNOWN"]) >= 2, 20, 0.05, "two check-backs"
        )
        page = api.get("/admin/half-messages", params={"group": "watched"})
        assert page.status_code == 200 and tid in page.text and "UNKNOWN" in page.text and "Prepared" in page.text, page.text[
            :500
        ]
        detail = api.get(f"/admin/half-messages/id/{tid}")
        assert detail.status_code == 200 and endpoint.url in detail.text and "no decision; check 1 of 1000" in detail.text
        with psycopg.connect(half_db) as conn:
            (row,) = conn.execute(
                "SELECT producer_group, partition, check_count >= 2, last_check_at IS NOT NULL, check_url "
                "FROM txlog.pending_half_messages WHERE transaction_id = %s",
                (tid,),
            ).fetchall()
        assert row == ("watched", 1, True, True, endpoint.url)
        assert api.post(f"/v1/half-messages/{tid}/rollback").status_code == 200
    assert tid not in api.get("/admin/half-messages", params={"group": "watched"}).text
    assert tid in api.get("/admin/half-messages", params={"group": "watched", "state": "RolledBack"}).text
    assert api.get("/admin/half-messages/id/NO-SUCH").status_code == 404

    # The drainer skips a partition while its drain lock is held: the backlog stays for a moment.
    with psycopg.connect(half_db) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"txlog.outbox/{topic}/0",))
        with psycopg.connect(half_db) as app:
            for i in range(3):
                app.execute("SELECT txlog.send(%s, NULL, %s, NULL, 0)", (topic, f"o{i}".encode()))
        with psycopg.connect(half_db) as conn:
            assert conn.execute("SELECT rows FROM txlog.outbox_backlog WHERE topic = %s", (topic,)).fetchall() == [(3,)]
        page = api.get("/admin/outbox")
        assert page.status_code == 200 and f"{topic}-0" in page.text and "rows waiting" in page.text
    wait_until(lambda: "The outbox is empty" in api.get("/admin/outbox").text, 20, 0.05, "the outbox to drain")
    assert [v for v in committed_values(api, topic) if v.startswith("o")] == ["o0", "o1", "o2"]
