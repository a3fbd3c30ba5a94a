"""The log and coordinator, v2, through the services on a real PostgreSQL: aborted transactions as
offset ranges (exact when a producer keeps one epoch for many transactions), Kafka's headers kept
exactly, fencing that reaches every partition, a fetch whose work is bounded by its request, a
paged history, and a transaction whose partitions are rows of their own."""

from __future__ import annotations

import copy

from sqlalchemy import text

from app.domain.producer_state import MAX_EPOCH
from app.domain.records import NewRecord
from app.domain.transactions import TxnState
from app.errors import ErrorCode
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import sweeper, topics, transaction_aborts, transactions
from app.services.produce import ProduceRequest
from app.storage import log as log_store
from tests.integration.test_log import _explain, _statements_of
from tests.integration.test_transactions import Producer, error_of, read

S = TxnState


def values(broker, topic: str, partition: int, isolation: str = "read_committed") -> list[str]:  # type: ignore[no-untyped-def]
    return [v.decode() for v in read(broker, topic, partition, isolation) if v is not None]


def aborted_ranges(broker, topic: str) -> list[tuple[int, int, int, int]]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        rows = conn.execute(
            text(
                "SELECT partition, producer_id, first_offset, last_offset FROM txlog.aborted_txns "
                "WHERE topic = :t ORDER BY partition, first_offset"
            ),
            {"t": topic},
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


def view_values(broker, topic: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        rows = conn.execute(
            text('SELECT partition, value FROM txlog.committed_records WHERE topic = :t ORDER BY partition, "offset"'),
            {"t": topic},
        )
        return [(p, v.decode()) for p, v in rows]


# --- 1. aborted transactions are offset ranges ----------------------------------------------------


def test_transactions_of_one_epoch_committed_and_aborted_interleaved_on_several_partitions(broker):
    """A producer that keeps its epoch (Kafka clients before transactions V2): an aborted
    transaction hides only its own records, and a second abort at the same epoch is indexed too."""
    topics.create_topic(broker, "t", 3)
    a = Producer(broker, "keeps-epoch", transaction_version=1)
    b = Producer(broker, "also-keeps", transaction_version=1)
    epoch = a.epoch
    a.send("t", 0, "a1-p0")
    b.send("t", 0, "b1-p0")
    a.send("t", 1, "a1-p1")
    a.abort()  # transaction 1 of a: aborted
    a.send("t", 1, "a2-p1")
    b.send("t", 1, "b1-p1")
    a.send("t", 2, "a2-p2")
    a.send("t", 0, "a2-p0")
    a.commit()  # transaction 2: committed
    b.commit()
    a.send("t", 0, "a3-p0")
    a.send("t", 2, "a3-p2")
    a.abort()  # transaction 3: aborted again, same epoch
    b.send("t", 2, "b2-p2")
    b.abort()
    a.send("t", 1, "a4-p1")
    a.commit()
    assert (a.epoch, a.pid) == (epoch, a.pid)  # one epoch all along

    assert values(broker, "t", 0) == ["b1-p0", "a2-p0"]
    assert values(broker, "t", 1) == ["a2-p1", "b1-p1", "a4-p1"]
    assert values(broker, "t", 2) == ["a2-p2"]
    assert view_values(broker, "t") == [(0, "b1-p0"), (0, "a2-p0"), (1, "a2-p1"), (1, "b1-p1"), (1, "a4-p1"), (2, "a2-p2")]
    ranges = aborted_ranges(broker, "t")
    assert len([r for r in ranges if r[1] == a.pid]) == 4  # 1 on p0 and p1, 3 on p0 and p2
    assert len([r for r in ranges if r[1] == b.pid]) == 1
    # read_uncommitted sees everything, aborted included
    assert len(values(broker, "t", 0, "read_uncommitted")) == 4


def test_a_retried_end_of_a_version_1_transaction_is_answered_and_a_contradicting_one_refused(broker):
    topics.create_topic(broker, "t", 1)
    p = Producer(broker, "v1", transaction_version=1)
    p.send("t", 0, "x")
    first = p.commit()
    assert first.state is S.COMPLETE_COMMIT and (first.producer_id, first.producer_epoch) == (p.pid, p.epoch)
    again = p.commit()  # the answer was lost; the client asks again
    assert again == first
    assert error_of(p.abort).code is ErrorCode.INVALID_TXN_STATE
    p.send("t", 0, "y")  # the next transaction, same epoch, sequences go on
    p.abort()
    assert values(broker, "t", 0) == ["x"]


# --- 2. headers ---------------------------------------------------------------------------------


def test_headers_are_kept_as_an_ordered_list_with_repeated_keys_and_null_values(broker):
    topics.create_topic(broker, "h", 1)
    headers = (("trace", b"1"), ("bin", b"\x00\xff"), ("trace", b"2"), ("none", None), ("empty", b""))
    produce_service.produce(broker, "h", 0, ProduceRequest([NewRecord(b"k", b"v", headers), NewRecord(None, b"plain")]))
    got = fetch_service.fetch(broker, "h", 0, 0).records
    assert [r.headers for r in got] == [headers, ()]
    with broker.db.read() as conn:
        row = conn.execute(
            text("SELECT header_keys, header_values, headers FROM txlog.committed_records WHERE topic = 'h' ORDER BY \"offset\"")
        ).all()
    assert row[0][0] == ["trace", "bin", "trace", "none", "empty"]
    assert row[0][1] == [b"1", b"\x00\xff", b"2", None, b""]
    assert row[0][2] == {"trace": "2", "bin": "\ufffd\ufffd", "none": None, "empty": ""}  # the object form: last value wins
    assert row[1] == (None, None, None)


# --- 3. fencing reaches the partitions ------------------------------------------------------------


def plain_batch(broker, p: Producer, topic: str, partition: int, epoch: int, value: str, seq: int = 0):  # type: ignore[no-untyped-def]
    """A batch of ``p``'s producer id at ``epoch`` without its transactional id."""
    return produce_service.produce(broker, topic, partition, ProduceRequest([NewRecord(None, value.encode())], p.pid, epoch, seq))


def test_a_fenced_epoch_appends_nowhere_with_or_without_its_transactional_id(broker):
    topics.create_topic(broker, "f", 3)
    p = Producer(broker, "fenced")
    zombie = copy.copy(p)
    p.send("f", 0, "committed")
    p.commit()  # EndTxn: the epoch moves on
    for partition in (0, 1, 2):  # p0 carries a marker of the old epoch; p1, p2 never saw the producer
        err = error_of(plain_batch, broker, zombie, "f", partition, zombie.epoch, "zombie")
        assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "transaction_ended")
    err = error_of(zombie.send, "f", 1, "zombie")
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "transaction_ended")

    before_init = copy.copy(p)
    p.init()  # another producer takes over
    err = error_of(plain_batch, broker, before_init, "f", 2, before_init.epoch, "zombie")
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "newer_epoch")

    p.send("f", 0, "open")
    before_abort = copy.copy(p)
    transaction_aborts.abort_by_operator(broker, "fenced")
    err = error_of(plain_batch, broker, before_abort, "f", 2, before_abort.epoch, "zombie")
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "aborted_by_operator")
    for partition in range(3):
        assert "zombie" not in values(broker, "f", partition, "read_uncommitted")
    assert values(broker, "f", 0) == ["committed"]


def test_a_timed_out_producer_is_fenced_on_partitions_it_never_wrote(clocked_broker, clock):
    b = clocked_broker
    topics.create_topic(b, "f", 2)
    p = Producer(b, "slow", timeout_ms=1_000)
    p.send("f", 0, "late")
    clock.advance(1_001)
    assert sweeper.abort_timed_out(b) == 1
    err = error_of(plain_batch, b, p, "f", 1, p.epoch, "zombie")
    assert (err.code, err.details["reason"]) == (ErrorCode.PRODUCER_FENCED, "timed_out")
    assert "timed_out" in err.message


def test_a_producer_id_given_up_for_a_new_one_is_fenced_at_every_epoch(broker):
    topics.create_topic(broker, "f", 1)
    p = Producer(broker, "exhausted")
    with broker.db.transaction() as conn:  # the epoch is at its last value
        conn.execute(
            text("UPDATE txlog.transactions SET producer_epoch = :epoch WHERE transactional_id = 'exhausted'"),
            {"epoch": MAX_EPOCH - 1},
        )
    p.init()  # epoch MAX_EPOCH
    old_pid = p.pid
    p.send("f", 0, "x")
    p.commit()  # a new producer id at epoch 0
    assert p.pid != old_pid and p.epoch == 0
    for epoch in (0, MAX_EPOCH):
        err = error_of(produce_service.produce, broker, "f", 0, ProduceRequest([NewRecord(None, b"z")], old_pid, epoch, 0))
        assert err.code is ErrorCode.PRODUCER_FENCED and f"now uses producer id {p.pid}" in err.message
    p.send("f", 0, "y")
    p.commit()


def test_an_idempotent_producer_without_a_transactional_id_is_never_fenced(broker):
    topics.create_topic(broker, "f", 1)
    pid = transactions.init_producer_id(broker, None).producer_id
    for seq in range(3):
        produce_service.produce(broker, "f", 0, ProduceRequest([NewRecord(None, b"v")], pid, 0, seq))
    assert values(broker, "f", 0) == ["v", "v", "v"]


# --- 7. costs bounded by the request --------------------------------------------------------------


def test_a_read_committed_fetch_over_a_long_aborted_range_reads_a_bounded_window(broker):
    topics.create_topic(broker, "long", 1)
    p = Producer(broker, "big")
    for i in range(10):
        p.send("long", 0, *[f"aborted-{i}-{j}" for j in range(1000)])
    p.abort()
    produce_service.produce(broker, "long", 0, ProduceRequest([NewRecord(None, b"after")]))
    with broker.db.transaction() as conn:
        conn.execute(text("ANALYZE txlog.records"))

    def fetch():  # type: ignore[no-untyped-def]
        return fetch_service.fetch(broker, "long", 0, 0, max_records=10, isolation_level="read_committed")

    for statement, parameters in _statements_of(broker, fetch):
        nodes, _ = _explain(broker, statement, parameters)
        on_records = [n for n in nodes if n.get("Relation Name") == "records"]
        assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_records), nodes
        assert max(n.get("Actual Rows", 0) for n in on_records) <= 1000  # the window, not the 10,000 aborted records
    first = fetch()
    assert first.records == [] and 0 < first.next_offset <= 1000  # nothing to return, but it moved on
    assert values(broker, "long", 0) == ["after"]


def test_events_are_read_a_page_at_a_time_newest_first_in_pages_oldest_first_within(broker):
    topics.create_topic(broker, "e", 1)
    p = Producer(broker, "history")
    for _ in range(6):
        p.send("e", 0, "x")
        p.commit()
    everything = transactions.events(broker, "history")
    assert [e.version for e in everything] == list(range(1, len(everything) + 1))
    last = transactions.events(broker, "history", limit=4)
    assert last == everything[-4:]
    before = transactions.events(broker, "history", limit=4, before_version=last[0].version)
    assert before == everything[-8:-4]
    assert transactions.events(broker, "history", limit=1000, before_version=1) == []
    assert error_of(transactions.events, broker, "history", 0).code is ErrorCode.INVALID_REQUEST
    assert error_of(transactions.events, broker, "nobody").code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


def test_adding_partitions_to_a_long_transaction_never_rewrites_the_ones_it_has(broker):
    topics.create_topic(broker, "wide", 60)
    p = Producer(broker, "wide")
    sizes = []
    for partition in range(60):
        p.send("wide", partition, "x")
        with broker.db.read() as conn:
            sizes.append(
                conn.execute(
                    text("SELECT pg_column_size(t.*) FROM txlog.transactions t WHERE transactional_id = 'wide'")
                ).scalar()
            )
    assert len(set(sizes)) == 1  # the transaction's row does not grow with its partitions
    assert len(transactions.describe(broker, "wide").partitions) == 60
    with broker.db.read() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM txlog.transaction_partitions WHERE transactional_id = 'wide'")).scalar() == 60
        )
    p.commit()
    p.send("wide", 0, "next")  # the next transaction starts with only its own partitions
    assert transactions.describe(broker, "wide").partitions == (("wide", 0),)
    p.commit()
    with broker.db.read() as conn:
        assert log_store.partition_status(conn, "wide", 59).last_stable_offset == 2
