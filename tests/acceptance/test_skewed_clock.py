"""Hosts with skewed clocks agree, because deadlines and expiry use the database's clock. A real
server runs under libfaketime with its own clock hours ahead of (or behind) the database's:

- its sweeper does not abort a transaction before the transaction's timeout by the database's
  clock (a clock ahead would abort at once), and does abort it on time (a clock behind would never);
- it does not expire a transactional id idle for far less than transactional.id.expiration.ms;
- the times it writes — append time, transaction start, event times — are the database's.

The transactions that time out are opened through the services with the database's clock, as
another, well-set host would."""

from __future__ import annotations

import email.utils
import glob

import psycopg
import pytest

from app.domain.records import NewRecord
from app.services import produce, topics, transactions
from app.services.produce import ProduceRequest
from tests.support import ServerProcess, wait_until

SKEW_S = 5 * 3600
SLACK_MS = 2_000  # a request's duration and polling on a busy machine
TIMEOUT_MS = 3_000


def libfaketime() -> str:
    found = [
        path
        for pattern in (
            "/usr/lib/*/faketime/libfaketime.so.1",
            "/usr/lib*/faketime/libfaketime.so.1",
            "/usr/local/lib*/faketime/libfaketime.so.1",
        )
        for path in sorted(glob.glob(pattern))
    ]
    if not found:
        pytest.skip("libfaketime is not installed (scripts/system-deps.sh installs it)")
    return found[0]


def database_ms(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0]


@pytest.mark.parametrize("skew", ["+5h", "-5h"])
def test_a_server_with_a_skewed_clock_keeps_the_database_s_time(db_url, broker, tmp_path, skew):  # type: ignore[no-untyped-def]
    env = {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME": skew,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # Python's timed waits need the real monotonic clock
        "TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "200",
        "TXLOG_TRANSACTIONAL_ID_EXPIRATION_MS": "3600000",  # an hour: far less than the skew
    }
    topics.create_topic(broker, "t", 1)
    transactions.init_producer_id(broker, "idle")  # Empty, idle for seconds only: must not expire
    with (
        ServerProcess(db_url, env=env, log_path=tmp_path / "server.log") as server,
        server.client() as api,
        psycopg.connect(db_url, autocommit=True) as conn,
    ):
        host_ms = email.utils.parsedate_to_datetime(api.get("/healthz").headers["date"]).timestamp() * 1000
        sign = 1 if skew.startswith("+") else -1
        assert abs(host_ms - database_ms(conn) - sign * SKEW_S * 1000) < 60_000, "the server's own clock is skewed"

        # A transaction opened by a well-set host (the database's clock) times out by that clock.
        pe = transactions.init_producer_id(broker, "tx", TIMEOUT_MS)
        produce.produce(broker, "t", 0, ProduceRequest([NewRecord(None, b"x")], pe.producer_id, pe.producer_epoch, 0, "tx"))
        started_ms, deadline_ms = conn.execute(
            "SELECT (extract(epoch FROM started_at) * 1000)::bigint, (extract(epoch FROM deadline) * 1000)::bigint "
            "FROM txlog.transactions WHERE transactional_id = 'tx'"
        ).fetchone()
        assert deadline_ms == started_ms + TIMEOUT_MS
        seen: dict[str, int] = {}

        def aborted() -> bool:
            state, now = conn.execute(
                "SELECT state, (extract(epoch FROM clock_timestamp()) * 1000)::bigint "
                "FROM txlog.transactions WHERE transactional_id = 'tx'"
            ).fetchone()
            if state == "Ongoing":
                seen["last_ongoing"] = now
                return False
            seen["first_ended"] = now
            return True

        wait_until(aborted, timeout=TIMEOUT_MS / 1000 + 15, interval=0.05, message="the timed-out transaction aborted")
        assert seen["last_ongoing"] >= deadline_ms - 1_000, "aborted before its timeout by the database's clock"
        ((at_ms, reason),) = conn.execute(
            "SELECT (extract(epoch FROM at) * 1000)::bigint, reason FROM txlog.transaction_events "
            "WHERE transactional_id = 'tx' AND to_state = 'PrepareAbort'"
        ).fetchall()
        assert reason == "timed_out"
        assert deadline_ms < at_ms <= seen["first_ended"] + SLACK_MS  # the event's time is the database's

        # Many rounds of expiry ran meanwhile; an hour's expiration is an hour by the database's clock.
        assert transactions.describe(broker, "idle").state.value == "Empty"

        # What the server writes carries the database's time.
        before = database_ms(conn)
        p = api.post("/v1/producers", json={"transactional_id": "through-skewed"}).json()
        r = api.post(
            "/v1/topics/t/partitions/0/records",
            json={
                "transactional_id": "through-skewed",
                "producer_id": p["producer_id"],
                "producer_epoch": p["producer_epoch"],
                "base_sequence": 0,
                "records": [{"value": "y"}],
            },
        )
        assert r.status_code == 200, r.text
        assert (
            api.post(
                "/v1/transactions/through-skewed/end",
                json={"producer_id": p["producer_id"], "producer_epoch": p["producer_epoch"], "result": "commit"},
            ).status_code
            == 200
        )
        after = database_ms(conn)

        def within(ms: int) -> bool:
            return before - SLACK_MS <= ms <= after + SLACK_MS

        assert within(r.json()["log_append_time_ms"])
        fetched = api.get("/v1/topics/t/partitions/0/records", params={"offset": r.json()["base_offset"]}).json()
        assert within(fetched["records"][0]["timestamp_ms"])
        described = api.get("/v1/transactions/through-skewed").json()
        assert within(described["started_at_ms"]) and within(described["updated_at_ms"])
        events = api.get("/v1/transactions/through-skewed/events").json()["events"]
        assert [e["to_state"] for e in events] == ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]
        assert all(within(e["at_ms"]) for e in events)
