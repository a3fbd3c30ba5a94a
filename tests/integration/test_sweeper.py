"""The sweeper against a real PostgreSQL with a clock the tests move: timeouts abort and fence,
prepared transactions left by a crash are completed, idle transactional ids expire and are
removed, what storage finds overdue is what the domain calls overdue, and two sweepers at once do
each job once."""

from __future__ import annotations

import copy
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.domain import transactions as txn
from app.domain.groups.offsets import GroupOffset
from app.domain.records import CONTROL_ABORT, CONTROL_COMMIT
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from app.services import groups, sweeper, topics, transactions
from app.storage import transactions as transactions_store
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer, error_of, markers, prepare_only, read, status

S = TxnState


@pytest.fixture
def topic(clocked_broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(clocked_broker, "t", 3)
    return "t"


# --- timeouts ---------------------------------------------------------------------------------------


def test_an_ongoing_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(clocked_broker, clock, topic):
    b = clocked_broker
    p = Producer(b, "tx", timeout_ms=1000)
    p.send(topic, 0, "a")
    p.send(topic, 1, "b")
    p.commit_offsets("g", (topic, 0, 5))
    clock.advance(1000)
    assert sweeper.sweep(b).timed_out == 0  # at the deadline, not past it
    assert describe_state(b) is S.ONGOING
    clock.advance(1)
    report = sweeper.sweep(b)
    assert (report.timed_out, report.recovered) == (1, 0)

    meta = transactions.describe(b, "tx")
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (S.COMPLETE_ABORT, p.pid, p.epoch + 1)
    assert meta.fence_reason == "timed_out"
    assert markers(b, topic, 0) == [CONTROL_ABORT] and markers(b, topic, 1) == [CONTROL_ABORT]
    assert markers(b, topic, 2) == []
    assert read(b, topic, 0) == [] and read(b, topic, 1) == []
    assert status(b, topic, 0) == (2, 2)
    assert groups.offset_fetch(b, "g", require_stable=True) == []

    for late in (
        lambda: p.send(topic, 0, "late"),
        lambda: p.add((topic, 2)),
        lambda: copy.copy(p).commit(),
        lambda: copy.copy(p).abort(),
        lambda: p.commit_offsets("g", (topic, 0, 6)),
    ):
        err = error_of(late)
        assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "timed_out")
        assert "timed_out" in err.message and f"current epoch is {p.epoch + 1}" in err.message
    assert [e.to_state for e in transactions.events(b, "tx")][-2:] == [S.PREPARE_ABORT, S.COMPLETE_ABORT]
    assert transactions.events(b, "tx")[-2].reason == "timed_out"

    p.init()  # the producer starts over
    p.send(topic, 0, "again")
    p.commit()
    assert read(b, topic, 0) == [b"again"]
    assert sweeper.sweep(b).timed_out == 0


def test_the_timeout_counts_from_the_start_of_each_transaction(clocked_broker, clock, topic):
    b = clocked_broker
    p = Producer(b, "tx", timeout_ms=1000)
    p.send(topic, 0, "first")
    clock.advance(600)
    p.commit()
    clock.advance(300)
    p.send(topic, 0, "second")  # starts 900 ms after the first one
    clock.advance(700)  # 1600 ms after the first started, 700 ms after the second
    assert sweeper.sweep(b).timed_out == 0
    p.add((topic, 1))  # adding partitions does not restart the clock
    clock.advance(301)
    assert sweeper.sweep(b).timed_out == 1
    assert read(b, topic, 0) == [b"first"]


def test_an_idle_empty_or_ended_transactional_id_never_times_out(clocked_broker, clock, topic):
    b = clocked_broker
    Producer(b, "empty", timeout_ms=100)
    ended = Producer(b, "ended", timeout_ms=100)
    ended.send(topic, 0, "a")
    ended.commit()
    clock.advance(10_000)
    assert sweeper.sweep(b).timed_out == 0
    assert transactions.describe(b, "empty").state is S.EMPTY
    assert transactions.describe(b, "ended").state is S.COMPLETE_COMMIT


def test_a_prepared_transaction_past_its_timeout_keeps_its_decision(clocked_broker, clock, topic):
    b = clocked_broker
    p = Producer(b, "tx", timeout_ms=100)
    p.send(topic, 0, "decided")
    prepare_only(b, "tx", "commit")
    clock.advance(1000)
    report = sweeper.sweep(b)
    assert (report.timed_out, report.recovered) == (0, 1)
    assert read(b, topic, 0) == [b"decided"]


# --- recovery of prepared transactions ------------------------------------------------------------


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_a_prepared_transaction_left_by_a_crash_is_completed_on_every_partition(clocked_broker, topic, result):
    b = clocked_broker
    p = Producer(b, "tx")
    for partition in range(3):
        p.send(topic, partition, f"v{partition}")
    p.commit_offsets("g", (topic, 1, 9))
    prepare_only(b, "tx", result)  # the decision of a two-step EndTxn, then the process died
    assert all(read(b, topic, i) == [] for i in range(3))
    assert all(markers(b, topic, i) == [] for i in range(3))

    report = sweeper.sweep(b)
    assert (report.timed_out, report.recovered) == (0, 1)
    marker = CONTROL_COMMIT if result == "commit" else CONTROL_ABORT
    for partition in range(3):
        assert markers(b, topic, partition) == [marker]
        assert read(b, topic, partition) == ([f"v{partition}".encode()] if result == "commit" else [])
    assert groups.offset_fetch(b, "g") == ([GroupOffset(topic, 1, 9, "")] if result == "commit" else [])
    meta = transactions.describe(b, "tx")
    assert meta.state is (S.COMPLETE_COMMIT if result == "commit" else S.COMPLETE_ABORT)
    assert meta.fence_reason is None  # the producer's own decision: nobody was fenced

    # the producer, unaware of the crash, retries its EndTxn: the same outcome, the next epoch
    out = copy.copy(p).end(result)
    assert (out.state, out.producer_id, out.producer_epoch) == (meta.state, p.pid, p.epoch + 1)
    assert sweeper.sweep(b).recovered == 0
    for partition in range(3):
        assert markers(b, topic, partition) == [marker]


def test_a_retried_end_completes_a_prepared_transaction_itself(clocked_broker, topic):
    b = clocked_broker
    p = Producer(b, "tx")
    p.send(topic, 0, "a")
    prepare_only(b, "tx", "commit")
    assert error_of(copy.copy(p).abort).code is ErrorCode.INVALID_TXN_STATE  # contradicts the durable decision
    out = p.commit()
    assert out.state is S.COMPLETE_COMMIT
    assert read(b, topic, 0) == [b"a"]
    assert markers(b, topic, 0) == [CONTROL_COMMIT]
    assert sweeper.sweep(b).recovered == 0


def test_produce_to_a_prepared_transaction_is_concurrent_transactions(clocked_broker, topic):
    b = clocked_broker
    p = Producer(b, "tx")
    p.send(topic, 0, "a")
    prepare_only(b, "tx", "commit")
    err = error_of(p.send, topic, 1, "b")
    assert err.code is ErrorCode.CONCURRENT_TRANSACTIONS and err.code.retriable
    assert error_of(p.add, (topic, 2)).code is ErrorCode.CONCURRENT_TRANSACTIONS
    sweeper.sweep(b)
    assert read(b, topic, 0) == [b"a"]
    assert read(b, topic, 1, "read_uncommitted") == []


# --- transactional id expiry ---------------------------------------------------------------------------


@pytest.fixture
def expiring(db_url, clock):  # type: ignore[no-untyped-def]
    b = make_broker(
        db_url,
        clock,
        transactional_id_expiration_ms=60_000,
        transaction_abort_check_interval_ms=1_000,
        default_transaction_timeout_ms=900_000,
    )
    topics.create_topic(b, "t", 3)
    yield b
    b.db.dispose()


def test_an_idle_transactional_id_expires_then_is_removed(expiring, clock):
    b = expiring
    idle = Producer(b, "idle")
    idle.send("t", 0, "a")
    idle.commit()
    Producer(b, "empty")
    open_ = Producer(b, "open")
    open_.send("t", 1, "open")
    clock.advance(30_000)
    Producer(b, "busy")
    clock.advance(30_001)  # idle/empty/open: 60.001 s without change; busy: 30.001 s

    report = sweeper.sweep(b)
    assert (report.expired, report.removed) == (2, 0)
    assert transactions.describe(b, "idle").state is S.DEAD
    assert transactions.describe(b, "empty").state is S.DEAD
    assert transactions.describe(b, "open").state is S.ONGOING  # an open transaction never expires
    assert transactions.describe(b, "busy").state is S.EMPTY
    assert transactions.events(b, "idle")[-1].reason == "expired"

    err = error_of(idle.send, "t", 0, "b")
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "expired")
    err = error_of(copy.copy(idle).commit)
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "expired")

    assert sweeper.sweep(b).removed == 0  # Dead for less than the check interval
    clock.advance(1_001)
    report = sweeper.sweep(b)
    assert (report.expired, report.removed) == (0, 2)
    for tid in ("idle", "empty"):
        assert error_of(transactions.describe, b, tid).code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        assert error_of(transactions.events, b, tid).code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    assert read(b, "t", 0) == [b"a"]  # the log keeps what was committed

    again = Producer(b, "idle")  # a new life for the id: a new producer id at epoch 0
    assert again.epoch == 0 and again.pid != idle.pid
    assert [e.version for e in transactions.events(b, "idle")] == [1]


def test_init_of_a_dead_transactional_id_starts_afresh(expiring, clock):
    b = expiring
    old = Producer(b, "tx")
    clock.advance(60_001)
    assert sweeper.sweep(b).expired == 1
    new = Producer(b, "tx")
    assert new.epoch == 0 and new.pid != old.pid
    assert transactions.describe(b, "tx").state is S.EMPTY
    assert error_of(old.send, "t", 0, "zombie").code is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    new.send("t", 0, "ok")
    new.commit()
    assert read(b, "t", 0) == [b"ok"]


# --- what is overdue: the SQL and the domain agree ---------------------------------------------------


def test_what_storage_finds_overdue_is_what_the_domain_calls_overdue(clocked_broker, clock, topic):
    """``OVERDUE`` (SQL: the sweeper's claims, the admin alerts) against ``txn.is_timed_out`` and
    ``txn.is_stuck_prepared`` (Python: the sweeper's re-check under the lock), over transactions in
    every state, at every instant where one of them becomes due and either side of it."""
    b = clocked_broker
    rng = random.Random(20261124)
    for i in range(30):
        p = Producer(b, f"tx{i}", timeout_ms=rng.choice([50, 200, 1000]))
        action = rng.choice(["empty", "ongoing", "committed", "aborted", "prepare_commit", "prepare_abort"])
        if action != "empty":
            p.send(topic, rng.randrange(3), f"v{i}")
        if action in ("committed", "aborted"):
            p.end({"committed": "commit", "aborted": "abort"}[action])
        elif action.startswith("prepare_"):
            prepare_only(b, f"tx{i}", action.removeprefix("prepare_"))
        clock.advance(rng.randrange(0, 300))
    with b.db.read() as conn:
        every = transactions_store.txn_page(conn)
    assert len(every) == 30 and {m.state for m in every} >= {S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT}

    instants = {clock.now_ms}
    for m in every:
        for t in (txn.deadline_ms(m), m.updated_at_ms):
            if t is not None:
                instants |= {t - 1, t, t + 1}
    for at in sorted(instants):
        for now, before in ((at, at), (at, at - 100), (at + 100, at)):
            expected = {m.transactional_id for m in every if txn.is_overdue(m, now, before)}
            with b.db.read() as conn:
                found = transactions_store.txns_overdue(conn, now, before, limit=1000)
            assert sorted(m.transactional_id for m in found) == sorted(expected), (now, before)
            for kind, due in (
                ("timed_out", lambda m: txn.is_timed_out(m, now)),
                ("prepared", lambda m: txn.is_stuck_prepared(m, before)),
            ):
                claimed: list[str] = []
                with b.db.transaction() as conn:
                    while (m := transactions_store.txn_claim(conn, kind, now_ms=now, before_ms=before, skip=claimed)) is not None:
                        assert due(m), (kind, m)
                        claimed.append(m.transactional_id)
                assert sorted(claimed) == sorted(m.transactional_id for m in every if due(m)), (kind, now, before)


# --- two sweepers ------------------------------------------------------------------------------------


def test_two_sweepers_at_once_do_each_job_once(db_url, clock):
    first = make_broker(db_url, clock, transactional_id_expiration_ms=3_600_000, default_transaction_timeout_ms=1_000)
    second = make_broker(db_url, clock, transactional_id_expiration_ms=3_600_000, default_transaction_timeout_ms=1_000)
    try:
        topics.create_topic(first, "t", 3)
        for i in range(12):  # timed out
            p = Producer(first, f"late-{i}")
            p.send("t", i % 3, f"late-{i}")
            p.send("t", (i + 1) % 3, f"late-{i}")
        for i in range(6):  # prepared, then a crash
            p = Producer(first, f"prepared-{i}")
            p.send("t", i % 3, f"prepared-{i}")
            prepare_only(first, f"prepared-{i}", "commit")
        for i in range(5):  # idle for long
            Producer(first, f"idle-{i}")
        clock.advance(3_600_001)

        start = threading.Barrier(2)

        def sweep(b):  # type: ignore[no-untyped-def]
            start.wait()
            return sweeper.sweep(b)

        with ThreadPoolExecutor(2) as pool:
            reports = [f.result() for f in [pool.submit(sweep, b) for b in (first, second)]]
        assert sum(r.timed_out for r in reports) == 12
        assert sum(r.recovered for r in reports) == 6
        expired_now = sum(r.expired for r in reports)
        assert expired_now == 5
        # one marker per transaction per partition, whoever did it
        assert sum(len(markers(first, "t", i)) for i in range(3)) == 12 * 2 + 6
        assert sorted(v for i in range(3) for v in read(first, "t", i)) == sorted(f"prepared-{i}".encode() for i in range(6))
        for i in range(12):
            events = transactions.events(first, f"late-{i}")
            assert [e.to_state for e in events].count(S.COMPLETE_ABORT) == 1
        with ThreadPoolExecutor(2) as pool:
            again = [f.result() for f in [pool.submit(sweeper.sweep, b) for b in (first, second)]]
        assert all((r.timed_out, r.recovered) == (0, 0) for r in again)
    finally:
        first.db.dispose()
        second.db.dispose()


def describe_state(b) -> TxnState:  # type: ignore[no-untyped-def]
    return transactions.describe(b, "tx").state
