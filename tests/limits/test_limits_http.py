"""Each limit hit through the HTTP API of a real server started with small limits, and answered
with its Kafka name; and a database pool that is all in use answered 503 with Retry-After rather
than a hang."""

from __future__ import annotations

import base64
import threading
from typing import Iterator

import httpx
import psycopg
import pytest

from tests.conftest import fresh_database
from tests.support import ServerProcess, wait_until

LIMITS = {
    "TXLOG_MAX_BATCH_RECORDS": "3",
    "TXLOG_MAX_KEY_BYTES": "8",
    "TXLOG_MAX_VALUE_BYTES": "16",
    "TXLOG_MAX_HEADER_BYTES": "12",
    "TXLOG_MAX_PARTITIONS_PER_TOPIC": "4",
    "TXLOG_MAX_PARTITIONS_PER_TRANSACTION": "2",
    "TXLOG_MAX_FETCH_WAIT_MS": "300",
}


def server_on_own_database(pg_admin_url: str, template_db: str, env: dict[str, str]) -> Iterator[ServerProcess]:
    with fresh_database(pg_admin_url, template_db) as url, ServerProcess(url, env=env) as server:
        yield server


@pytest.fixture(scope="module")
def limited(pg_admin_url: str, template_db: str) -> Iterator[httpx.Client]:
    for server in server_on_own_database(pg_admin_url, template_db, LIMITS):
        with server.client(timeout=20) as c:
            assert c.post("/v1/topics", json={"name": "t", "partitions": 4}).status_code == 201
            yield c


def error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    return err


def retried(send) -> httpx.Response:  # type: ignore[no-untyped-def]
    """An answer other than a retriable 503, sending again as a client does: with one connection
    per process, the server's own background work may hold it for a moment."""
    while (r := send()).status_code == 503:
        pass
    return r


def records_of(n: int, **record: object) -> dict:
    return {"records": [{"key": "k", "value": "v", **record}] * n}


def test_records_per_batch(limited: httpx.Client) -> None:
    assert limited.post("/v1/topics/t/partitions/0/records", json=records_of(3)).status_code == 200
    err = error(limited.post("/v1/topics/t/partitions/0/records", json=records_of(4)), 413, "RECORD_LIST_TOO_LARGE")
    assert err["kafka_code"] == 18 and "at most 3" in err["message"]
    error(limited.post("/v1/topics/t/records", json=records_of(4)), 413, "RECORD_LIST_TOO_LARGE")


@pytest.mark.parametrize(
    "record, ok",
    [
        ({"key": "k" * 8, "value": "v" * 16, "headers": [{"key": "h", "value": "v" * 11}]}, True),
        ({"key": "k" * 9}, False),
        ({"value": "v" * 17}, False),
        ({"key": None, "value": base64.b64encode(b"\x00" * 17).decode(), "encoding": "base64"}, False),
        ({"headers": {"h": "v" * 12}}, False),
        ({"headers": [{"key": "h", "value": "12345"}, {"key": "h", "value": "1234"}, {"key": "h", "value": None}]}, True),
        ({"headers": [{"key": "h", "value": "123456"}, {"key": "h", "value": "123456"}]}, False),
    ],
)
def test_key_value_and_header_sizes(limited: httpx.Client, record: dict, ok: bool) -> None:
    encoding = record.pop("encoding", "utf8")
    body = {"encoding": encoding, "records": [{"key": None, "value": None}, {"key": None, "value": None, **record}]}
    r = limited.post("/v1/topics/t/partitions/1/records", json=body)
    if ok:
        assert r.status_code == 200, r.text
    else:
        assert "of record 1: " in error(r, 413, "MESSAGE_TOO_LARGE")["message"]


def test_half_messages_take_the_same_record_limits(limited: httpx.Client) -> None:
    body = {"producer_group": "g", "topic": "t", "partition": 0, "key": "k", "value": "v"}
    assert limited.post("/v1/half-messages", json=body).status_code == 200
    err = error(limited.post("/v1/half-messages", json={**body, "value": "v" * 17}), 413, "MESSAGE_TOO_LARGE")
    assert "The value of the message: 17 bytes" in err["message"]
    error(limited.post("/v1/half-messages", json={**body, "key": "k" * 9}), 413, "MESSAGE_TOO_LARGE")


def test_partitions_per_topic(limited: httpx.Client) -> None:
    assert limited.post("/v1/topics", json={"name": "four", "partitions": 4}).status_code == 201
    err = error(limited.post("/v1/topics", json={"name": "five", "partitions": 5}), 400, "INVALID_PARTITIONS")
    assert "between 1 and 4" in err["message"]


def test_partitions_per_transaction(limited: httpx.Client) -> None:
    ids = limited.post("/v1/producers", json={"transactional_id": "ppt"}).json()
    add = lambda *ps: limited.post(  # noqa: E731
        "/v1/transactions/ppt/partitions", json={**ids, "partitions": [{"topic": "t", "partition": p} for p in ps]}
    )
    error(add(0, 1, 2), 400, "POLICY_VIOLATION")  # more than any transaction may have, in one request
    assert add(0, 1).status_code == 200
    err = error(add(2), 400, "POLICY_VIOLATION")
    assert err["limit"] == "max_partitions_per_transaction" and "it has 2" in err["message"]
    produce = {**ids, "transactional_id": "ppt", "base_sequence": 0, "records": [{"value": "v"}]}
    error(limited.post("/v1/topics/t/partitions/3/records", json=produce), 400, "POLICY_VIOLATION")
    assert limited.post("/v1/topics/t/partitions/1/records", json=produce).status_code == 200
    described = limited.get("/v1/transactions/ppt").json()
    assert described["partitions"] == [{"topic": "t", "partition": 0}, {"topic": "t", "partition": 1}]


def test_a_fetch_waits_at_most_the_servers_bound(limited: httpx.Client) -> None:
    # Asked to wait a minute on a partition nobody writes: answered (empty) after the server's
    # bound, long before the client gives up.
    r = limited.get("/v1/topics/t/partitions/2/records", params={"offset": 0, "wait_ms": 60_000})
    assert r.status_code == 200 and r.json()["records"] == []


@pytest.fixture(scope="module")
def small_pool(pg_admin_url: str, template_db: str) -> Iterator[ServerProcess]:
    env = {
        "TXLOG_DB_POOL_SIZE": "1",
        "TXLOG_DB_POOL_MAX_OVERFLOW": "0",
        "TXLOG_DB_POOL_TIMEOUT_MS": "1000",
        "TXLOG_DB_LOCK_TIMEOUT_MS": "0",  # a request waits for a row lock as long as it is held
        "TXLOG_OUTBOX_POLL_INTERVAL_MS": "1000",
        "TXLOG_MAX_LONG_POLLS": "1",
    }
    for server in server_on_own_database(pg_admin_url, template_db, env):
        with server.client() as c:
            assert retried(lambda: c.post("/v1/topics", json={"name": "held", "partitions": 2})).status_code == 201
        yield server


def test_a_pool_all_in_use_is_answered_503_with_retry_after(small_pool: ServerProcess) -> None:
    # Hold the partition's row from outside: a produce takes the server's only connection and waits.
    with psycopg.connect(small_pool.database_url) as outside, small_pool.client() as c:
        outside.execute("SELECT 1 FROM txlog.partitions WHERE topic = 'held' AND partition = 0 FOR UPDATE")
        answers: list[httpx.Response] = []
        producer = threading.Thread(
            target=lambda: answers.append(retried(lambda: c.post("/v1/topics/held/partitions/0/records", json=records_of(1))))
        )
        producer.start()
        wait_until(
            lambda: outside.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'txlog' AND wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchone()[0],  # type: ignore[index]
            message="the produce to wait for the row lock",
        )
        r = c.get("/v1/topics")
        err = error(r, 503, "REQUEST_TIMED_OUT")
        assert err["retriable"] and r.headers["Retry-After"] == "1"
        assert "TXLOG_DB_POOL_TIMEOUT_MS" in err["message"]
        outside.rollback()  # the produce goes on, and the connection is free again
        producer.join(30)
        assert [a.status_code for a in answers] == [200]
        assert retried(lambda: c.get("/v1/topics")).status_code == 200


def test_long_polls_beyond_the_bound_answer_at_once(small_pool: ServerProcess) -> None:
    with small_pool.client() as c:
        answers: list[httpx.Response] = []
        params = {"offset": 0, "wait_ms": 60_000}
        waiter = threading.Thread(
            target=lambda: answers.append(retried(lambda: c.get("/v1/topics/held/partitions/1/records", params=params)))
        )
        waiter.start()
        # It waits once its process listens on the partition.
        with psycopg.connect(small_pool.database_url) as outside:
            wait_until(
                lambda: outside.execute("SELECT count(*) FROM txlog.fetch_listeners WHERE topic = 'held'").fetchone()[0],  # type: ignore[index]
                message="the first long poll to wait",
            )
        # The server's one long poll is taken: this one is answered at once, as with wait_ms=0
        # (were it to wait, the client would give up first).
        with small_pool.client(timeout=10) as quick:
            r = retried(lambda: quick.get("/v1/topics/held/partitions/1/records", params=params))
        assert r.status_code == 200 and r.json()["records"] == []
        # The first one still waits, and an append wakes it.
        assert retried(lambda: c.post("/v1/topics/held/partitions/1/records", json=records_of(1))).status_code == 200
        waiter.join(30)
        assert [[rec["value"] for rec in a.json()["records"]] for a in answers] == [["v"]]
