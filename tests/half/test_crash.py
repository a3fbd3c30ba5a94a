"""Real servers that die as with ``kill -9`` at the worst lines of half messages and the outbox:
between a decision and its append (from the producer's commit and from a check-back), after the
commit before its answer, and while draining the outbox — before and after its database commit.
A new server on the same database finishes the work, and every message reaches the log once."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from tests.half.endpoint import Endpoint, answer
from tests.support import ServerProcess, wait_until

TOPIC = "crash"
FAST = {"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100", "TXLOG_OUTBOX_POLL_INTERVAL_MS": "50"}


def server_for(db_url: str, tmp_path, name: str, crash_at: str | None = None, **env: str) -> ServerProcess:  # type: ignore[no-untyped-def]
    """A server (not started yet: ``with`` starts it and kills it at the end)."""
    extra = {"TXLOG_CRASH_AT": crash_at} if crash_at else {}
    return ServerProcess(db_url, env={**FAST, **extra, **env}, log_path=tmp_path / f"{name}.log")


def died(server: ServerProcess) -> None:
    assert server.proc is not None
    try:
        code = server.proc.wait(timeout=30)
    finally:
        server.kill()  # never leave one behind
    assert code == 137, "the server should have died at its crash point"


def sql(db_url: str, query: str, *params: object) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


def log_values(db_url: str) -> list[bytes]:
    return [v for (v,) in sql(db_url, 'SELECT value FROM txlog.committed_records WHERE topic = %s ORDER BY "offset"', TOPIC)]


def send_half(api: httpx.Client, group: str = "g") -> str:
    assert api.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code in (201, 409)
    r = api.post("/v1/half-messages", json={"producer_group": group, "topic": TOPIC, "value": "paid"})
    assert r.status_code == 200, r.text
    return r.json()["transaction_id"]


@pytest.mark.parametrize("point", ["half_message_decided", "half_message_ended"])
def test_a_commit_that_dies_is_retried_and_appends_once(db_url, tmp_path, point):
    server = server_for(db_url, tmp_path, "dying", point).start()
    with server.client() as api:
        tid = send_half(api)
        with pytest.raises(httpx.TransportError):
            api.post(f"/v1/half-messages/{tid}/commit")
    died(server)
    if point == "half_message_decided":  # died inside the database transaction: nothing happened
        assert sql(db_url, "SELECT state FROM txlog.half_messages") == [("Prepared",)]
        assert log_values(db_url) == []
    else:  # committed, not answered
        assert sql(db_url, "SELECT state FROM txlog.half_messages") == [("Committed",)]
        assert log_values(db_url) == [b"paid"]
    with server_for(db_url, tmp_path, "after") as after, after.client() as api:
        r = api.post(f"/v1/half-messages/{tid}/commit")  # the producer's retry
        assert (r.status_code, r.json()["state"], r.json()["offset"]) == (200, "Committed", 0), r.text
        assert api.post(f"/v1/half-messages/{tid}/commit").json()["offset"] == 0
    assert log_values(db_url) == [b"paid"]


def test_a_check_back_decision_that_dies_before_its_append_is_asked_again_and_appends_once(db_url, tmp_path):
    with Endpoint(answer("COMMIT")) as endpoint:
        server = server_for(db_url, tmp_path, "dying", "half_message_decided").start()
        with server.client() as api:
            r = api.put(
                "/v1/producer-groups/g", json={"check_url": endpoint.url, "check_interval_ms": 200, "check_immunity_ms": 0}
            )
            assert r.status_code == 200, r.text
            tid = send_half(api)  # the producer never decides: the checker asks, hears COMMIT, dies
        died(server)
        assert sql(db_url, "SELECT state, check_count FROM txlog.half_messages") == [("Prepared", 1)]
        assert log_values(db_url) == []
        with server_for(db_url, tmp_path, "after") as after, after.client() as api:
            wait_until(
                lambda: api.get(f"/v1/half-messages/{tid}").json()["state"] == "Committed", 20, 0.1, "the check-back to commit"
            )
            h = api.get(f"/v1/half-messages/{tid}").json()
        assert len(endpoint.calls) == 2
    # the first check never finished (its server died); the second one committed
    assert [(c["check_no"], c["answer"], c["finished_at_ms"] is not None) for c in h["checks"]] == [
        (1, None, False),
        (2, "COMMIT", True),
    ]
    assert log_values(db_url) == [b"paid"]


@pytest.mark.parametrize("point", ["outbox_appended", "outbox_committed"])
def test_a_killed_drainer_resumes_without_duplicates_or_gaps(db_url, tmp_path, point):
    server = server_for(db_url, tmp_path, "dying", point, TXLOG_OUTBOX_BATCH_RECORDS="10").start()
    with server.client() as api:
        assert api.post("/v1/topics", json={"name": TOPIC, "partitions": 1}).status_code == 201
    with psycopg.connect(db_url) as conn:  # an application's transaction: 35 records, committed together
        for i in range(35):
            conn.execute("SELECT txlog.send(%s, NULL, %s)", (TOPIC, f"r{i:02}".encode()))
    died(server)
    drained = 0 if point == "outbox_appended" else 10
    assert log_values(db_url) == [f"r{i:02}".encode() for i in range(drained)]
    assert sql(db_url, "SELECT count(*) FROM txlog.outbox") == [(35 - drained,)]
    with server_for(db_url, tmp_path, "after", TXLOG_OUTBOX_BATCH_RECORDS="10"):
        wait_until(lambda: sql(db_url, "SELECT count(*) FROM txlog.outbox") == [(0,)], 20, 0.05, "the outbox to drain")
    assert log_values(db_url) == [f"r{i:02}".encode() for i in range(35)]
