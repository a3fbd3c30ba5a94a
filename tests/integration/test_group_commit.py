"""The produce service's group commit against a real PostgreSQL: concurrent plain and idempotent
batches, several to one partition, appended exactly once and in order; a refused batch refuses only
itself; a partition another transaction holds does not hold up the group's other partitions; a
failing statement puts every batch of its group through alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import topics, transactions
from app.services.produce import ProduceRequest
from app.storage import append as append_store
from tests.conftest import make_broker

PARTITIONS = 4


@pytest.fixture
def grouped(db_url: str):  # type: ignore[no-untyped-def]
    b = make_broker(db_url, produce_group_commit_batches=16)
    topics.create_topic(b, "t", PARTITIONS)
    yield b
    b.db.dispose()


def values(broker, partition: int) -> list[bytes | None]:  # type: ignore[no-untyped-def]
    return [r.value for r in fetch_service.fetch(broker, "t", partition, 0, max_records=100_000).records]


def test_concurrent_batches_are_grouped_and_each_appended_once_in_order(grouped, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sizes: list[int] = []
    real = append_store.log_append

    def counting(conn, batches, commit=False):  # type: ignore[no-untyped-def]
        sizes.append(len(batches))
        return real(conn, batches, commit)

    monkeypatch.setattr(append_store, "log_append", counting)
    producers = [transactions.init_producer_id(grouped, None) for _ in range(8)]
    per_producer = 40

    def run(i: int) -> list[int]:
        pid, epoch = producers[i].producer_id, producers[i].producer_epoch
        partition = i % PARTITIONS  # two producers per partition
        offsets = []
        for n in range(per_producer):
            records = [NewRecord(None, f"{i}:{n}:{k}".encode()) for k in range(3)]
            result = produce_service.produce(grouped, "t", partition, ProduceRequest(records, pid, epoch, 3 * n))
            assert not result.duplicate
            offsets.append(result.base_offset)
        return offsets

    with ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(run, range(8)))
    assert max(sizes) > 1, "concurrent batches were never appended together"
    for partition in range(PARTITIONS):
        log = values(grouped, partition)
        assert len(log) == 2 * per_producer * 3
        for i in (partition, partition + PARTITIONS):
            mine = [v for v in log if v.startswith(f"{i}:".encode())]  # type: ignore[union-attr]
            assert mine == [f"{i}:{n}:{k}".encode() for n in range(per_producer) for k in range(3)]
            # each caller was answered with its own batch's offsets
            for n, base in enumerate(answered[i]):
                assert log[base : base + 3] == [f"{i}:{n}:{k}".encode() for k in range(3)]
    # a retry of an appended batch is answered with its first offsets, grouped or not
    pid, epoch = producers[0].producer_id, producers[0].producer_epoch
    again = produce_service.produce(
        grouped, "t", 0, ProduceRequest([NewRecord(None, b"x")] * 3, pid, epoch, 3 * (per_producer - 1))
    )
    assert again.duplicate and again.base_offset == answered[0][-1]


def test_a_refused_batch_refuses_only_itself(grouped) -> None:  # type: ignore[no-untyped-def]
    barrier = threading.Barrier(6)
    for _ in range(5):
        producers = [transactions.init_producer_id(grouped, None) for _ in range(6)]
        for i, p in enumerate(producers):
            produce_service.produce(
                grouped, "t", i % PARTITIONS, ProduceRequest([NewRecord(None, b"v")], p.producer_id, p.producer_epoch, 0)
            )

        def run(i: int):  # type: ignore[no-untyped-def]
            p = producers[i]
            seq = 5 if i % 2 else 1  # odd producers leave a gap: OUT_OF_ORDER_SEQUENCE_NUMBER
            barrier.wait()
            try:
                return produce_service.produce(
                    grouped, "t", i % PARTITIONS, ProduceRequest([NewRecord(None, b"v")], p.producer_id, p.producer_epoch, seq)
                )
            except TxlogError as exc:
                return exc.code

        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(run, range(6)))
        assert [o for i, o in enumerate(outcomes) if i % 2] == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER] * 3
        assert all(not isinstance(o, ErrorCode) for i, o in enumerate(outcomes) if i % 2 == 0)


def test_a_held_partition_does_not_hold_up_the_others(grouped) -> None:  # type: ignore[no-untyped-def]
    with ThreadPoolExecutor(8) as pool:
        with grouped.db.transaction() as holder:
            append_store.partition_lock_for_append(holder, "t", 0, None)  # another transaction holds partition 0
            started = time.monotonic()
            waiting = pool.submit(produce_service.produce, grouped, "t", 0, ProduceRequest([NewRecord(None, b"held")]))
            others = [
                pool.submit(produce_service.produce, grouped, "t", 1 + i % 3, ProduceRequest([NewRecord(None, b"free")]))
                for i in range(20)
            ]
            for f in others:
                f.result(timeout=10)
            assert time.monotonic() - started < 3  # well within the 5 s lock timeout
            assert not waiting.done()
        assert waiting.result(timeout=10).base_offset == 0
    assert values(grouped, 0) == [b"held"]
    assert sum(len(values(grouped, p)) for p in (1, 2, 3)) == 20


def test_a_failing_statement_puts_each_batch_through_alone(grouped, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = append_store.log_append
    failed = []

    def failing_in_groups(conn, batches, commit=False):  # type: ignore[no-untyped-def]
        if len(batches) > 1:
            failed.append(len(batches))
            conn.exec_driver_sql("SELECT 1/0")
        return real(conn, batches, commit)

    monkeypatch.setattr(append_store, "log_append", failing_in_groups)
    barrier = threading.Barrier(8)

    def run(i: int):  # type: ignore[no-untyped-def]
        barrier.wait()
        return [
            produce_service.produce(grouped, "t", i % PARTITIONS, ProduceRequest([NewRecord(None, f"{i}:{n}".encode())]))
            for n in range(10)
        ]

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, range(8)))
    assert failed, "no group was formed"
    for partition in range(PARTITIONS):
        log = values(grouped, partition)
        assert sorted(log) == sorted(f"{i}:{n}".encode() for i in (partition, partition + PARTITIONS) for n in range(10))
