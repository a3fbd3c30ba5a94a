"""Event sourcing of the transaction coordinator against a real PostgreSQL: after a rich history,
replaying each transactional id's events rebuilds its current row exactly; versions are dense;
the events table only grows, in order."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from app.domain import transactions as txn
from app.domain.transactions import TxnState
from app.errors import TxlogError
from app.services import sweeper, topics, transaction_aborts, transactions
from app.storage import transactions as transactions_store
from tests.integration.test_transactions import Producer, prepare_only

S = TxnState


def all_ids(broker) -> list[str]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        return list(conn.execute(text("SELECT transactional_id FROM txlog.transactions ORDER BY 1")).scalars())


def event_rows(broker) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Every event row as stored, with the id of the database transaction that wrote it."""
    with broker.db.read() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT transactional_id, version, from_state, to_state, producer_id, producer_epoch, timeout_ms, at, "
                    "partitions_added, groups_added, last_producer_id, last_producer_epoch, result, reason, "
                    "xmin::text::bigint FROM txlog.transaction_events ORDER BY transactional_id, version"
                )
            )
        ]


def assert_replay_matches(broker) -> None:  # type: ignore[no-untyped-def]
    ids = all_ids(broker)
    assert ids
    for tid in ids:
        with broker.db.read() as conn:
            events = transactions_store.txn_events(conn, tid)
            current = transactions_store.txn_get(conn, tid)
            view = conn.execute(
                text(
                    "SELECT producer_id, producer_epoch, state, timeout_ms FROM txlog.transaction_state WHERE transactional_id = :t"
                ),
                {"t": tid},
            ).one()
        assert [e.version for e in events] == list(range(1, len(events) + 1)), tid
        assert events[0].from_state is None
        assert all(e.from_state is prev.to_state for prev, e in zip(events, events[1:])), tid
        assert all(prev.at_ms <= e.at_ms for prev, e in zip(events, events[1:])), tid
        assert txn.replay(events) == current, tid
        assert tuple(view) == (current.producer_id, current.producer_epoch, current.state.value, current.timeout_ms)


def rich_history(broker, clock) -> None:  # type: ignore[no-untyped-def]
    topics.create_topic(broker, "t", 3)
    # commits and aborts over several partitions, offsets, empty transactions
    a = Producer(broker, "a", timeout_ms=5_000)
    for i in range(6):
        a.send("t", i % 3, f"a{i}")
        a.send("t", (i + 1) % 3, f"a{i}'")
        if i % 2:
            a.commit_offsets("g", ("t", i % 3, i))
        clock.advance(10)
        a.end("commit" if i % 3 else "abort")
    a.end("abort")  # empty transactions: from CompleteCommit, from CompleteAbort, from CompleteCommit
    a.end("commit")
    a.end("commit")
    a.commit_offsets("g", ("t", 0, 99))  # a transaction of offsets only
    sent = copy.copy(a)
    a.commit()
    version = transactions.describe(broker, "a").version
    copy.copy(sent).commit()  # a retried end and a contradicting one leave no event
    with pytest.raises(TxlogError):
        copy.copy(sent).abort()
    assert transactions.describe(broker, "a").version == version
    a.send("t", 0, "x")  # left open: it times out at the end
    # re-inits: over an ongoing transaction and over a prepared one
    b = Producer(broker, "b", timeout_ms=2_000)
    b.send("t", 1, "b0")
    copy.copy(b).init(3_000)
    b.init()
    b.send("t", 2, "b1")
    prepare_only(broker, "b", "commit")
    b.init()
    # a timeout, then the producer starts over
    c = Producer(broker, "c", timeout_ms=1_000)
    c.send("t", 0, "c0")
    clock.advance(1_001)
    assert sweeper.sweep(broker).timed_out == 1  # c; a's open transaction (5 s) is not yet due
    c.init()
    c.send("t", 0, "c1")
    c.commit()
    # an operator abort
    d = Producer(broker, "d")
    d.add(("t", 1), ("t", 2))
    transaction_aborts.abort_by_operator(broker, "d")
    d.init()
    # a crash between the steps of EndTxn, completed by the sweeper
    e = Producer(broker, "e")
    e.send("t", 1, "e0")
    e.commit_offsets("g2", ("t", 1, 1))
    prepare_only(broker, "e", "abort")
    assert sweeper.sweep(broker).recovered == 1

    # concurrent producers
    def worker(n: int) -> None:
        p = Producer(broker, f"w{n}")
        for i in range(5):
            p.send("t", (n + i) % 3, f"w{n}-{i}")
            p.end("commit" if (n + i) % 2 else "abort")

    with ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(worker, n) for n in range(4)]:
            f.result()
    # expiry
    clock.advance(broker.settings.transactional_id_expiration_ms + 1)
    Producer(broker, "fresh")
    report = sweeper.sweep(broker)
    assert report.timed_out == 1 and report.expired >= 1


def test_replay_of_the_events_is_the_current_row(clocked_broker, clock):
    rich_history(clocked_broker, clock)
    assert_replay_matches(clocked_broker)
    states = {tid: transactions.describe(clocked_broker, tid).state for tid in all_ids(clocked_broker)}
    assert S.DEAD in states.values() and states["fresh"] is S.EMPTY


def test_every_transition_kind_appears_in_the_history(clocked_broker, clock):
    rich_history(clocked_broker, clock)
    seen = {(e.from_state, e.to_state) for tid in all_ids(clocked_broker) for e in transactions.events(clocked_broker, tid)}
    expected = {
        (None, S.EMPTY),
        (S.EMPTY, S.ONGOING),
        (S.ONGOING, S.ONGOING),
        (S.ONGOING, S.PREPARE_COMMIT),
        (S.ONGOING, S.PREPARE_ABORT),
        (S.PREPARE_COMMIT, S.COMPLETE_COMMIT),
        (S.PREPARE_ABORT, S.COMPLETE_ABORT),
        (S.COMPLETE_COMMIT, S.ONGOING),
        (S.COMPLETE_ABORT, S.ONGOING),
        (S.COMPLETE_COMMIT, S.PREPARE_COMMIT),
        (S.COMPLETE_COMMIT, S.PREPARE_ABORT),
        (S.COMPLETE_ABORT, S.PREPARE_COMMIT),
        (S.COMPLETE_ABORT, S.EMPTY),
        (S.COMPLETE_COMMIT, S.EMPTY),
        (S.EMPTY, S.EMPTY),
        (S.EMPTY, S.DEAD),
        (S.COMPLETE_COMMIT, S.DEAD),
        (S.COMPLETE_ABORT, S.DEAD),
    }
    assert expected <= seen, expected - seen


def test_the_events_table_only_grows_in_order(clocked_broker, clock):
    b = clocked_broker
    topics.create_topic(b, "t", 2)
    p = Producer(b, "tx")
    for i in range(3):
        p.send("t", i % 2, f"v{i}")
        p.end("commit" if i % 2 else "abort")
    before = event_rows(b)
    p.send("t", 0, "open")
    copy.copy(p).init()  # aborts the open transaction and raises the epoch: 3 events in one database transaction
    p.init()
    for i in range(3):
        p.send("t", 0, f"w{i}")
        p.send("t", 1, f"w{i}")
        p.commit_offsets("g", ("t", 0, i))
        p.commit()
    after = event_rows(b)
    assert after[: len(before)] == before  # nothing updated or removed
    assert [r[1] for r in after] == list(range(1, len(after) + 1))
    # each version was written by the same or a later database transaction than the one before it
    xids = [r[-1] for r in after]
    assert all(x1 <= x2 for x1, x2 in zip(xids, xids[1:]))
    # Written together: each EndTxn's decision and completion, and the fencing init's abort with
    # its new epoch; every other event alone.
    together = [tuple(r[3] for r in after if r[-1] == x) for x in sorted(set(xids))]
    assert [t for t in together if len(t) > 1] == [
        ("PrepareAbort", "CompleteAbort"),
        ("PrepareCommit", "CompleteCommit"),
        ("PrepareAbort", "CompleteAbort"),
        ("PrepareAbort", "CompleteAbort", "Empty"),
        ("PrepareCommit", "CompleteCommit"),
        ("PrepareCommit", "CompleteCommit"),
        ("PrepareCommit", "CompleteCommit"),
    ]
    assert_replay_matches(b)


def test_replay_of_each_prefix_is_a_valid_state(clocked_broker, clock):
    rich_history(clocked_broker, clock)
    for tid in all_ids(clocked_broker):
        events = transactions.events(clocked_broker, tid)
        for i in range(1, len(events) + 1):
            meta = txn.replay(events[:i])
            assert meta is not None and meta.version == i and meta.state is events[i - 1].to_state
