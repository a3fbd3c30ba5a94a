"""One item the sweeper cannot handle does not end its round: each job (timeout aborts, completion
of prepared transactions, expiry) meets a real failure for one transactional id — a trigger that
refuses its event, a partition whose marker insert fails, a partition row held by a stuck session
— and still handles every other due item, counts the failure, and handles the failed one in a
later round once the cause is gone."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from app.domain.records import CONTROL_ABORT, CONTROL_COMMIT
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from app.services import sweeper, topics, transactions
from app.storage.db import libpq_url
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer, error_of, markers, prepare_only, read, status

S = TxnState


def refuse(broker, table: str, condition: str) -> None:  # type: ignore[no-untyped-def]
    """A row trigger on ``txlog.<table>`` that raises for rows matching ``condition`` (SQL on NEW)."""
    with broker.db.transaction() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION public.refuse_for_test() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF {condition} THEN RAISE EXCEPTION 'refused for a test'; END IF; RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER refuse_for_test BEFORE INSERT ON txlog.{table} "
                "FOR EACH ROW EXECUTE FUNCTION public.refuse_for_test()"
            )
        )


def allow(broker, table: str) -> None:  # type: ignore[no-untyped-def]
    with broker.db.transaction() as conn:
        conn.execute(text(f"DROP TRIGGER refuse_for_test ON txlog.{table}"))
        conn.execute(text("DROP FUNCTION public.refuse_for_test()"))


def state(broker, tid: str) -> TxnState:  # type: ignore[no-untyped-def]
    return transactions.describe(broker, tid).state


@pytest.fixture
def b(db_url, clock):  # type: ignore[no-untyped-def]
    broker = make_broker(
        db_url, clock, default_transaction_timeout_ms=1_000, transactional_id_expiration_ms=60_000, db_lock_timeout_ms=300
    )
    topics.create_topic(broker, "t", 3)
    yield broker
    broker.db.dispose()


def test_a_timed_out_transaction_that_cannot_be_aborted_does_not_stop_the_others(b, clock):
    # The bad one has the earliest deadline: it is claimed first, and the round goes on after it.
    bad = Producer(b, "bad")
    bad.send("t", 0, "bad")
    clock.advance(10)
    good = [Producer(b, f"good-{i}") for i in range(5)]
    for i, p in enumerate(good):
        p.send("t", i % 3, f"good-{i}")
    refuse(b, "transaction_events", "NEW.transactional_id = 'bad' AND NEW.to_state = 'PrepareAbort'")
    clock.advance(1_001)

    report = sweeper.sweep(b)
    assert (report.timed_out, report.failed) == (5, 1)
    assert state(b, "bad") is S.ONGOING
    assert all(state(b, p.tid) is S.COMPLETE_ABORT for p in good)
    assert [len(markers(b, "t", i)) for i in range(3)] == [2, 2, 1]
    hw, lso = status(b, "t", 0)
    assert lso == 0 < hw  # the bad transaction still holds partition 0 back
    assert status(b, "t", 1)[0] == status(b, "t", 1)[1]

    assert (sweeper.sweep(b).timed_out, sweeper.sweep(b).failed) == (0, 1)  # tried again each round
    allow(b, "transaction_events")
    report = sweeper.sweep(b)
    assert (report.timed_out, report.failed) == (1, 0)
    assert state(b, "bad") is S.COMPLETE_ABORT
    assert transactions.describe(b, "bad").fence_reason == "timed_out"
    for partition in range(3):
        hw, lso = status(b, "t", partition)
        assert hw == lso
        assert read(b, "t", partition) == []


def test_a_prepared_transaction_whose_marker_cannot_be_written_does_not_stop_the_others(b):
    topics.create_topic(b, "broken", 1)
    bad = Producer(b, "bad")
    bad.send("t", 0, "bad-t")  # on a healthy partition too: its marker there must wait with the other
    bad.send("broken", 0, "bad-broken")
    prepare_only(b, "bad", "commit")
    good = [Producer(b, f"good-{i}") for i in range(4)]
    for i, p in enumerate(good):
        p.send("t", i % 3, f"good-{i}")
        prepare_only(b, p.tid, "commit" if i % 2 == 0 else "abort")
    refuse(b, "records", "NEW.topic = 'broken' AND NEW.control_type IS NOT NULL")

    report = sweeper.sweep(b)
    assert (report.recovered, report.failed) == (4, 1)
    assert state(b, "bad") is S.PREPARE_COMMIT
    assert [state(b, p.tid) for p in good] == [S.COMPLETE_COMMIT, S.COMPLETE_ABORT] * 2
    # All or nothing per transaction: no marker of the bad one on the healthy partition either.
    assert markers(b, "t", 0) == [CONTROL_COMMIT, CONTROL_ABORT] and markers(b, "broken", 0) == []
    assert read(b, "t", 2) == [b"good-2"]
    assert read(b, "t", 0) == [] and read(b, "t", 0, "read_uncommitted") == [
        b"bad-t",
        b"good-0",
        b"good-3",
    ]  # held back by the bad one

    allow(b, "records")
    report = sweeper.sweep(b)
    assert (report.recovered, report.failed) == (1, 0)
    assert state(b, "bad") is S.COMPLETE_COMMIT
    assert read(b, "broken", 0) == [b"bad-broken"] and read(b, "t", 0) == [b"bad-t", b"good-0"]


def test_an_idle_transactional_id_that_cannot_expire_does_not_stop_the_others(b, clock):
    for tid in ("a", "bad", "c"):
        Producer(b, tid)
    refuse(b, "transaction_events", "NEW.transactional_id = 'bad' AND NEW.to_state = 'Dead'")
    clock.advance(60_001)

    report = sweeper.sweep(b)
    assert (report.expired, report.failed) == (2, 1)
    assert [state(b, tid) for tid in ("a", "bad", "c")] == [S.DEAD, S.EMPTY, S.DEAD]
    allow(b, "transaction_events")
    assert sweeper.sweep(b).expired == 1
    assert state(b, "bad") is S.DEAD


def test_a_partition_held_by_a_stuck_session_delays_only_the_transactions_on_it(b, clock, db_url):
    """A session that stopped while holding partition 0's row lock (a frozen host): the sweeper's
    lock wait ends after the lock timeout as a counted failure, the transactions on the other
    partitions are aborted in the same round, and a produce to partition 0 is answered
    REQUEST_TIMED_OUT (retriable) instead of hanging."""
    on_0 = Producer(b, "on-0")
    on_0.send("t", 0, "x")
    others = [Producer(b, f"on-{i}") for i in (1, 2)]
    for i, p in enumerate(others, start=1):
        p.send("t", i, "y")
    clock.advance(1_001)
    with psycopg.connect(libpq_url(db_url)) as stuck:
        stuck.execute("SELECT 1 FROM txlog.partitions WHERE topic = 't' AND partition = 0 FOR UPDATE")
        report = sweeper.sweep(b)
        assert (report.timed_out, report.failed) == (2, 1)
        assert [state(b, p.tid) for p in others] == [S.COMPLETE_ABORT] * 2
        assert state(b, "on-0") is S.ONGOING  # rolled back whole: still Ongoing, still due

        err = error_of(Producer(b, "fresh").send, "t", 0, "waits")
        assert err.code is ErrorCode.REQUEST_TIMED_OUT and err.code.retriable and err.code.http_status == 503
    report = sweeper.sweep(b)  # the lock is gone
    assert (report.timed_out, report.failed) == (1, 0)
    assert state(b, "on-0") is S.COMPLETE_ABORT
    assert status(b, "t", 0)[0] == status(b, "t", 0)[1]
