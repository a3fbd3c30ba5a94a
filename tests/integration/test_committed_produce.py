"""A produce that commits its transaction (``committed_produce``) against a real PostgreSQL: planned
ahead it is one statement, and whichever way it runs it leaves the log, the producer's state and the
transaction's history exactly as a produce followed by an EndTxn with result commit leaves them. A
retry of a request that committed is answered again and writes nothing; refusals are a produce's
and an EndTxn's."""

from __future__ import annotations

import pytest

from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import topics, transactions
from app.services.committed_produce import produce_committed
from app.services.produce import ProduceRequest
from app.storage import append as append_store
from app.storage import log as log_store
from app.storage import producers as producers_store
from app.storage import transactions as transactions_store
from tests.conftest import make_broker


@pytest.fixture
def two(db_url: str):  # type: ignore[no-untyped-def]
    """Two brokers on one database: two server processes, each with its own memory."""
    a, b = make_broker(db_url, produce_group_commit_batches=1), make_broker(db_url, produce_group_commit_batches=1)
    topics.create_topic(a, "t", 4)
    a.now(), b.now()
    yield a, b
    a.db.dispose()
    b.db.dispose()


@pytest.fixture
def ahead(monkeypatch):  # type: ignore[no-untyped-def]
    """For each statement that wrote a batch ending with its marker: whether it was written."""
    seen: list[bool] = []
    conditional = append_store.txn_append_if_unchanged

    def if_unchanged(batches, *args, **kwargs):  # type: ignore[no-untyped-def]
        def note(written):  # type: ignore[no-untyped-def]
            if batches and batches[0].trailing_marker is not None:
                seen.append(written is not None)
            return written

        return conditional(batches, *args, **kwargs).then(note)

    monkeypatch.setattr(append_store, "txn_append_if_unchanged", if_unchanged)
    return seen


def req(p, tag: str, seq: int = 0, tid: str = "tx", n: int = 3) -> ProduceRequest:  # type: ignore[no-untyped-def]
    return ProduceRequest([NewRecord(b"k", f"{tag}:{k}".encode()) for k in range(n)], p.producer_id, p.producer_epoch, seq, tid)


def stored(broker, partition: int) -> list[tuple]:  # type: ignore[no-untyped-def]
    """A partition's rows, everything but the values and the producer (compared across producers)."""
    with broker.db.read() as conn:
        return [
            tuple(row)
            for row in conn.exec_driver_sql(
                'SELECT "offset", key, producer_epoch, sequence, is_transactional, control_type, position, txn_first_offset '
                "FROM txlog.records WHERE topic = 't' AND partition = %(p)s ORDER BY \"offset\"",
                {"p": partition},
            )
        ]


def producer_state(broker, partition: int) -> list[tuple]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        entries = producers_store.partition_producers(conn, "t", partition)
    return [(e.producer_epoch, [m.to_json()[:4] for m in e.batches], e.txn_first_offset) for e in entries]


def history(broker, tid: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        events = transactions_store.txn_events(conn, tid)
    return [
        (e.from_state, e.to_state, e.producer_epoch, len(e.partitions_added), e.result, e.transaction_version) for e in events
    ]


def status(broker, partition: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        s = log_store.partition_status(conn, "t", partition)
    return s.high_watermark, s.last_stable_offset


def test_a_produce_that_commits_reads_as_a_produce_then_an_end_and_is_one_statement_once_remembered(two, ahead) -> None:  # type: ignore[no-untyped-def]
    """Three one-batch transactions of "tx" on partition 0, each by one request; the same of "ty" on
    partition 1, each a produce and an EndTxn. Both partitions hold the same rows (offsets,
    sequences, markers, positions), the producers' states and the transactions' histories are the
    same, and the records are committed as each answer comes. The first request finds nothing
    remembered and runs a produce and an end; the next ones are one statement each."""
    a, _ = two
    p = transactions.init_producer_id(a, "tx")
    q = transactions.init_producer_id(a, "ty")
    for n in range(3):
        done = produce_committed(a, "t", 0, req(p, str(n)))
        assert (done.produced.base_offset, done.produced.last_offset, done.produced.duplicate) == (4 * n, 4 * n + 2, False)
        assert done.ended.state.value == "CompleteCommit"
        assert (done.ended.producer_id, done.ended.producer_epoch) == (p.producer_id, p.producer_epoch + 1)
        assert status(a, 0) == (4 * n + 4, 4 * n + 4)  # the batch and its marker, committed
        committed = fetch_service.fetch(a, "t", 0, 4 * n, isolation_level="read_committed").records
        assert [r.value for r in committed] == [f"{n}:{k}".encode() for k in range(3)]
        p = transactions.ProducerIdAndEpoch(done.ended.producer_id, done.ended.producer_epoch)
        produce_service.produce(a, "t", 1, req(q, str(n), tid="ty"))
        out = transactions.end_txn(a, "ty", q.producer_id, q.producer_epoch, "commit")
        q = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)
    assert ahead == [True, True]
    assert stored(a, 0) == stored(a, 1)
    assert producer_state(a, 0) == producer_state(a, 1)
    assert history(a, "tx") == history(a, "ty")
    assert [e[1].value for e in history(a, "tx")][-3:] == ["Ongoing", "PrepareCommit", "CompleteCommit"]


def test_a_retry_of_a_request_that_committed_is_answered_again_and_writes_nothing(two, ahead) -> None:  # type: ignore[no-untyped-def]
    """The answer was lost; the same request comes again (to this process or another): the batch is
    the duplicate it is, the end the one taken, with the next epoch it gave — also once the next
    transaction is open. A request at that epoch that is not a retry is fenced."""
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    first = produce_committed(a, "t", 0, req(p, "first"))
    p1 = transactions.ProducerIdAndEpoch(first.ended.producer_id, first.ended.producer_epoch)
    done = produce_committed(a, "t", 0, req(p1, "second"))
    assert ahead == [True]
    before = (stored(a, 0), history(a, "tx"))
    for broker in (a, b, a):
        again = produce_committed(broker, "t", 0, req(p1, "second"))
        assert again.produced.duplicate and again.produced.base_offset == done.produced.base_offset
        assert again.ended == done.ended
        assert (stored(a, 0), history(a, "tx")) == before
    p2 = transactions.ProducerIdAndEpoch(done.ended.producer_id, done.ended.producer_epoch)
    produce_service.produce(a, "t", 1, req(p2, "open"))  # the next transaction, open
    again = produce_committed(b, "t", 0, req(p1, "second"))
    assert again.produced.duplicate and again.ended == done.ended
    with pytest.raises(TxlogError) as fenced:
        produce_committed(a, "t", 2, req(p1, "never sent before"))
    assert fenced.value.code is ErrorCode.PRODUCER_FENCED
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0, isolation_level="read_committed").records] == []


def test_it_commits_the_whole_transaction_with_a_marker_on_each_partition(two, ahead) -> None:  # type: ignore[no-untyped-def]
    """The transaction has batches on other partitions already (and another process wrote one of
    them): the request commits them all, planned ahead when this process wrote the others, by a
    produce and an end when it did not."""
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    for partition in (0, 1):  # partitions 0 and 1 remembered by a
        d = produce_committed(a, "t", partition, req(p, f"warm{partition}"))
        p = transactions.ProducerIdAndEpoch(d.ended.producer_id, d.ended.producer_epoch)
    ahead.clear()
    produce_service.produce(a, "t", 1, req(p, "one"))
    done = produce_committed(a, "t", 0, req(p, "zero"))
    assert ahead == [True]
    assert status(a, 0)[0] == status(a, 0)[1] and status(a, 1)[0] == status(a, 1)[1]
    for partition, tag in ((0, "zero"), (1, "one")):
        values = [r.value for r in fetch_service.fetch(a, "t", partition, 0, isolation_level="read_committed").records]
        assert values[-3:] == [f"{tag}:{k}".encode() for k in range(3)]
    p = transactions.ProducerIdAndEpoch(done.ended.producer_id, done.ended.producer_epoch)
    produce_service.produce(b, "t", 2, req(p, "two"))  # another process's batch of the transaction
    ahead.clear()
    produce_committed(a, "t", 0, req(p, "zero again"))
    # a's memory of the transaction is one partition short: its statement writes nothing, and a
    # produce and an end commit the transaction whole
    assert ahead == [False]
    assert status(a, 2) == (4, 4)
    assert [r.value for r in fetch_service.fetch(a, "t", 2, 0, isolation_level="read_committed").records] == [
        f"two:{k}".encode() for k in range(3)
    ]


def test_a_partition_another_process_moved_takes_the_produce_and_the_end(two, ahead) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    d = produce_committed(a, "t", 0, req(p, "first"))
    produce_service.produce(b, "t", 0, ProduceRequest([NewRecord(None, b"plain")]))  # moves partition 0 on
    d = produce_committed(a, "t", 0, req(transactions.ProducerIdAndEpoch(d.ended.producer_id, d.ended.producer_epoch), "second"))
    assert ahead == [False]
    assert d.produced.base_offset == 5 and status(a, 0) == (9, 9)
    values = [r.value for r in fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records]
    assert values == [f"first:{k}".encode() for k in range(3)] + [b"plain"] + [f"second:{k}".encode() for k in range(3)]


def test_refusals_are_a_produces_and_an_ends(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, "tx")
    with pytest.raises(TxlogError) as no_tid:
        produce_committed(a, "t", 0, ProduceRequest([NewRecord(None, b"x")], p.producer_id, p.producer_epoch, 0))
    assert no_tid.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(TxlogError) as gap:
        produce_committed(a, "t", 0, req(p, "gap", seq=5))
    assert gap.value.code is ErrorCode.UNKNOWN_PRODUCER_ID
    assert [e[1].value for e in history(a, "tx")] == ["Empty"]  # nothing of the refused request
    with pytest.raises(TxlogError) as newer:
        produce_committed(a, "t", 0, req(transactions.ProducerIdAndEpoch(p.producer_id, p.producer_epoch + 1), "newer"))
    assert newer.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(TxlogError) as missing:
        produce_committed(a, "nope", 0, req(p, "x"))
    assert missing.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
