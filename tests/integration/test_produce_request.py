"""A Kafka Produce request's partition batches appended together (``produce_all_steps``) against a
real PostgreSQL: planned ahead in one statement, under their locks in one database transaction,
a transaction's first batches joining it in one statement; each batch answered as it would be
alone — a refused batch (a sequence gap, a fenced epoch, an unknown partition) refuses only itself,
a retried one is answered with its first offsets — and one commit for the request."""

from __future__ import annotations

import functools

import pytest

from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import executor, topics, transactions
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services.produce import ProduceRequest, ProduceResult
from app.storage import append as append_store
from tests.conftest import make_broker

PARTITIONS = 4


@pytest.fixture
def broker(db_url: str):  # type: ignore[no-untyped-def]
    b = make_broker(db_url)
    topics.create_topic(b, "t", PARTITIONS)
    yield b
    b.db.dispose()


def produce_all(broker, batches):  # type: ignore[no-untyped-def]
    return executor.run(broker, functools.partial(produce_service.produce_all_steps, broker, batches))


def values(broker, partition: int, isolation: str = "read_uncommitted") -> list[bytes | None]:  # type: ignore[no-untyped-def]
    return [r.value for r in fetch_service.fetch(broker, "t", partition, 0, isolation_level=isolation).records]  # type: ignore[arg-type]


def codes(answers) -> list[ErrorCode | None]:  # type: ignore[no-untyped-def]
    return [a.code if isinstance(a, TxlogError) else None for a in answers]


def test_an_idempotent_request_over_partitions_is_answered_per_partition(broker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    appends: list[int] = []
    real = append_store.log_append

    def counting(conn, batches, commit=False):  # type: ignore[no-untyped-def]
        appends.append(len(batches))
        return real(conn, batches, commit)

    monkeypatch.setattr(append_store, "log_append", counting)
    p = transactions.init_producer_id(broker, None)
    pid, epoch = p.producer_id, p.producer_epoch

    def batch(partition: int, seq: int, tag: str, topic: str = "t"):  # type: ignore[no-untyped-def]
        return topic, partition, ProduceRequest([NewRecord(None, f"{tag}{k}".encode()) for k in range(2)], pid, epoch, seq)

    # Nothing remembered: under the locks, one database transaction for the request's batches; a
    # partition that does not exist and a first batch not at sequence 0 refuse only themselves.
    first = produce_all(broker, [batch(0, 0, "a"), batch(1, 0, "b"), batch(2, 5, "gap"), batch(9, 0, "x"), batch(3, 0, "d")])
    assert codes(first) == [None, None, ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None]
    assert appends == [3]
    assert [a.base_offset for a in first if isinstance(a, ProduceResult)] == [0, 0, 0]
    # Remembered: planned ahead, one statement (no locked append); the gap again refused alone.
    appends.clear()
    second = produce_all(broker, [batch(0, 2, "a"), batch(1, 7, "gap"), batch(3, 2, "d")])
    assert codes(second) == [None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None]
    assert [a.base_offset for a in second if isinstance(a, ProduceResult)] == [2, 2]
    assert appends == []  # the planned-ahead statement; the gap refused under its lock, writing nothing
    # A retry of the whole request: each batch answered with its first offsets.
    again = produce_all(broker, [batch(0, 2, "a"), batch(3, 2, "d")])
    assert all(isinstance(a, ProduceResult) and a.duplicate and a.base_offset == 2 for a in again)
    # Partition 2 still takes the producer's first batch, partition 1 its next.
    after = produce_all(broker, [batch(2, 0, "c"), batch(1, 2, "b"), batch(0, 4, "a")])
    assert codes(after) == [None, None, None]
    assert values(broker, 0) == [b"a0", b"a1"] * 3
    assert values(broker, 1) == [b"b0", b"b1"] * 2
    assert values(broker, 2) == [b"c0", b"c1"]


def test_a_fenced_epoch_in_a_request_refuses_only_its_batches(broker) -> None:  # type: ignore[no-untyped-def]
    old = transactions.init_producer_id(broker, None)
    new = transactions.init_producer_id(broker, None)
    produce_all(broker, [("t", p, ProduceRequest([NewRecord(None, b"v")], old.producer_id, 0, 0)) for p in range(2)])
    mixed = produce_all(
        broker,
        [
            ("t", 0, ProduceRequest([NewRecord(None, b"w")], old.producer_id, 0, 1)),
            ("t", 1, ProduceRequest([NewRecord(None, b"w")], new.producer_id, 0, 0)),
            ("t", 2, ProduceRequest([NewRecord(None, b"w")], None, None, None)),
        ],
    )
    assert codes(mixed) == [None, None, None]
    assert [values(broker, p) for p in range(3)] == [[b"v", b"w"], [b"v", b"w"], [b"w"]]


def test_a_transactional_request_over_partitions_joins_and_appends_together(broker) -> None:  # type: ignore[no-untyped-def]
    p = transactions.init_producer_id(broker, "tx")
    producer = [p.producer_id, p.producer_epoch]

    def batch(partition: int, seq: int, tag: str):  # type: ignore[no-untyped-def]
        pid, epoch = producer
        return "t", partition, ProduceRequest([NewRecord(None, tag.encode())], pid, epoch, seq, transactional_id="tx")

    for round_ in range(2):  # the first under the locks (nothing remembered), the second joined ahead
        seq = 0  # each transaction at an epoch of its own (transactions V2)
        first = produce_all(broker, [batch(q, seq, f"{round_}-{q}") for q in range(3)])
        assert codes(first) == [None] * 3
        # its next batches planned ahead (the partitions are in the transaction); a gap refused alone
        nxt = produce_all(
            broker, [batch(0, seq + 1, f"{round_}-n0"), batch(1, seq + 5, "gap"), batch(2, seq + 1, f"{round_}-n2")]
        )
        assert codes(nxt) == [None, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, None]
        assert all(len(values(broker, q, "read_committed")) == 2 * round_ - (q == 1) * round_ for q in range(3))
        ended = transactions.end_txn(broker, "tx", producer[0], producer[1], "commit")
        producer[:] = [ended.producer_id, ended.producer_epoch]
        # the markers end every partition the request's batches added
        assert [values(broker, q, "read_committed")[-2:] for q in (0, 2)] == [
            [f"{round_}-{q}".encode(), f"{round_}-n{q}".encode()] for q in (0, 2)
        ]
        assert values(broker, 1, "read_committed")[-1] == f"{round_}-1".encode()
