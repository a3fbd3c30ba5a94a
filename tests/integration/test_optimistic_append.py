"""The optimistic append against a real PostgreSQL: a batch planned against where this process's
last append left the partition is written by one statement that checks the partition and the
producer's state (and, for a transactional batch, its transaction) are still as planned against,
in a thread or awaited on an event loop.
Whatever another process (or anything else) changed meanwhile, the batch is appended exactly once
at the right offsets, a retry is answered as a duplicate, and refusals follow the state in the
database, never the remembered one."""

from __future__ import annotations

import asyncio
import dataclasses
import functools

import psycopg
import pytest

from app.domain.groups.offsets import GroupOffset
from app.domain.log import AppendBatch, AppendPosition
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import executor as executor_mod
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import topics, transactions
from app.services.executor import Blocking, LoopExecutor
from app.services.last_appends import LastAppends
from app.services.produce import ProduceRequest
from app.storage import append as append_store
from app.storage import db as dbmod
from app.storage import groups as groups_store
from app.storage import log as log_store
from app.storage import producers as producers_store
from app.storage import transactions as transactions_store
from app.storage.db import DatabaseClock, LoopConnections, SessionLimits, driver, libpq_url
from app.storage.statements import execute
from tests.conftest import make_broker


@pytest.fixture
def two(db_url: str):  # type: ignore[no-untyped-def]
    """Two brokers on one database: two server processes, each with its own memory."""
    a, b = make_broker(db_url, produce_group_commit_batches=1), make_broker(db_url, produce_group_commit_batches=1)
    topics.create_topic(a, "t", 2)
    a.now(), b.now()  # their clocks read (an append on an event loop never reads one)
    yield a, b
    a.db.dispose()
    b.db.dispose()


def batch(tag: str, n: int = 3) -> list[NewRecord]:
    return [NewRecord(None, f"{tag}:{k}".encode()) for k in range(n)]


def log(broker) -> list[bytes | None]:  # type: ignore[no-untyped-def]
    return [r.value for r in fetch_service.fetch(broker, "t", 0, 0, max_records=100_000).records]


@pytest.fixture
def statements(monkeypatch):  # type: ignore[no-untyped-def]
    """Which path each append took: 'optimistic' (appended by the conditional statement), 'stale'
    (the conditional statement found the partition changed), 'joined' (a transaction's first batch
    on the partition, written with the partition's joining by one conditional statement),
    'join-stale' (that statement found something changed) or 'locked'."""
    seen: list[str] = []
    conditional, locked, with_txn = (
        append_store.log_append_if_unchanged,
        append_store.log_append,
        append_store.txn_append_if_unchanged,
    )

    def if_unchanged(batches, planned_against, transactional_ids):  # type: ignore[no-untyped-def]
        def note(out):  # type: ignore[no-untyped-def]
            seen.extend("optimistic" if i in out else "stale" for i in range(len(batches)))
            return out

        return conditional(batches, planned_against, transactional_ids).then(note)

    def log_append(conn, batches, commit=False):  # type: ignore[no-untyped-def]
        if batches[0].control_type is None:  # not the markers of a locked EndTxn
            seen.append("locked")
        return locked(conn, batches, commit)

    def txn_append(batches, *args, **kwargs):  # type: ignore[no-untyped-def]
        def note(out):  # type: ignore[no-untyped-def]
            if not batches:  # AddPartitionsToTxn planned ahead
                seen.append("added" if out is not None else "add-stale")
            elif batches[0].control_type is None:  # not the markers of an EndTxn planned ahead
                seen.append("joined" if out is not None else "join-stale")
            return out

        return with_txn(batches, *args, **kwargs).then(note)

    monkeypatch.setattr(append_store, "log_append_if_unchanged", if_unchanged)
    monkeypatch.setattr(append_store, "log_append", log_append)
    monkeypatch.setattr(append_store, "txn_append_if_unchanged", txn_append)
    return seen


def test_a_producers_next_batches_take_one_statement(two, statements) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, None)
    offsets = [
        produce_service.produce(a, "t", 0, ProduceRequest(batch(str(n)), p.producer_id, p.producer_epoch, 3 * n)).base_offset
        for n in range(4)
    ]
    assert offsets == [0, 3, 6, 9]
    assert statements == ["locked", "optimistic", "optimistic", "optimistic"]
    assert log(a) == [v for n in range(4) for v in (f"{n}:0".encode(), f"{n}:1".encode(), f"{n}:2".encode())]
    # the producer's state is saved as by the locked path: a retry of the last batch is a duplicate
    again = produce_service.produce(a, "t", 0, ProduceRequest(batch("x"), p.producer_id, p.producer_epoch, 9))
    assert again.duplicate and again.base_offset == 9
    # and the high watermark and log positions moved with the records
    status = fetch_service.partition_statuses(a, [("t", 0)])[("t", 0)]
    assert status.high_watermark == 12
    plain = produce_service.produce(a, "t", 0, ProduceRequest(batch("plain")))
    assert plain.base_offset == 12


def test_another_process_appending_first_sends_the_batch_down_the_locked_path(two, statements) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    p = transactions.init_producer_id(a, None)
    produce_service.produce(a, "t", 0, ProduceRequest(batch("a0"), p.producer_id, p.producer_epoch, 0))
    produce_service.produce(b, "t", 0, ProduceRequest(batch("b-plain")))  # another process, another writer
    statements.clear()
    second = produce_service.produce(a, "t", 0, ProduceRequest(batch("a1"), p.producer_id, p.producer_epoch, 3))
    assert statements == ["stale", "locked"]
    assert second.base_offset == 6 and not second.duplicate
    # the same producer, now through the other process (a client that reconnected elsewhere), then
    # back: the remembered state is behind the producer's, and the database's decides
    produce_service.produce(b, "t", 0, ProduceRequest(batch("a2"), p.producer_id, p.producer_epoch, 6))
    statements.clear()
    fourth = produce_service.produce(a, "t", 0, ProduceRequest(batch("a3"), p.producer_id, p.producer_epoch, 9))
    assert statements == ["locked"]
    assert fourth.base_offset == 12 and not fourth.duplicate
    assert log(a) == [f"{t}:{k}".encode() for t in ("a0", "b-plain", "a1", "a2", "a3") for k in range(3)]
    # a's memory is where its own append left the partition again: the next batch is one statement
    statements.clear()
    produce_service.produce(a, "t", 0, ProduceRequest(batch("a4"), p.producer_id, p.producer_epoch, 12))
    assert statements == ["optimistic"]


def test_a_retry_is_a_duplicate_and_a_gap_refused_as_the_database_says(two, statements) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, None)
    for n in range(2):
        produce_service.produce(a, "t", 0, ProduceRequest(batch(str(n)), p.producer_id, p.producer_epoch, 3 * n))
    statements.clear()
    retry = produce_service.produce(a, "t", 0, ProduceRequest(batch("0"), p.producer_id, p.producer_epoch, 0))
    assert retry.duplicate and retry.base_offset == 0
    with pytest.raises(TxlogError) as gap:
        produce_service.produce(a, "t", 0, ProduceRequest(batch("gap"), p.producer_id, p.producer_epoch, 30))
    assert gap.value.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "optimistic" not in statements and "stale" not in statements
    assert len(log(a)) == 6


def test_a_producer_state_gone_from_the_database_is_not_taken_from_memory(two, statements, db_url: str) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, None)
    for n in range(2):
        produce_service.produce(a, "t", 0, ProduceRequest(batch(str(n)), p.producer_id, p.producer_epoch, 3 * n))
    with a.db.transaction() as conn:  # as the producer-state expiry deletes it
        producers_store.producer_states_expire(conn, a.now() + 60_000)
    statements.clear()
    with pytest.raises(TxlogError) as unknown:
        produce_service.produce(a, "t", 0, ProduceRequest(batch("2"), p.producer_id, p.producer_epoch, 6))
    assert unknown.value.code is ErrorCode.UNKNOWN_PRODUCER_ID
    assert statements == ["stale"]
    assert len(log(a)) == 6


def test_the_conditional_statement_writes_nothing_when_the_producer_state_differs(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, None)
    produce_service.produce(a, "t", 1, ProduceRequest(batch("0"), p.producer_id, p.producer_epoch, 0))
    last: LastAppends = a.extensions["last_appends"]
    position = last.get("t", 1, p.producer_id)
    assert position is not None and position.next_offset == 3 and position.producer_state is not None
    plan = produce_service._planned(
        "t", 1, ProduceRequest(batch("1"), p.producer_id, p.producer_epoch, 3), a.now(), [3] * 3, position
    )
    assert isinstance(plan, produce_service._Plan)
    other_epoch = type(position.producer_state)(p.producer_id, p.producer_epoch + 1, position.producer_state.batches)
    with a.db.autocommit() as conn:
        assert (
            execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [other_epoch], [None])) == {}
        )  # not the state there
        assert execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [None], [None])) == {}  # there is a state
        assert execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [position.producer_state], [None])) == {
            0: 0
        }
        assert (
            execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [position.producer_state], [None])) == {}
        )  # moved on: once only
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0).records] == [f"{t}:{k}".encode() for t in "01" for k in range(3)]


def tx_batch(p, tag: str, seq: int, tid: str = "tx", partition: int = 0, require_added: bool = False):  # type: ignore[no-untyped-def]
    return ProduceRequest(batch(tag), p.producer_id, p.producer_epoch, seq, transactional_id=tid, require_added=require_added)


def test_a_transactions_next_batches_on_a_partition_take_one_statement(two, statements) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, "tx")
    offsets = [produce_service.produce(a, "t", 0, tx_batch(p, str(n), 3 * n)).base_offset for n in range(3)]
    assert offsets == [0, 3, 6]
    # the first batch adds the partition to the transaction (locked); the next ones are one statement
    assert statements == ["locked", "optimistic", "optimistic"]
    retry = produce_service.produce(a, "t", 0, tx_batch(p, "2", 6))
    assert retry.duplicate and retry.base_offset == 6
    assert fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records == []  # not committed yet
    with a.db.read() as conn:
        assert log_store.partition_status(conn, "t", 0).last_stable_offset == 0
    out = transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit")
    committed = fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records
    assert [r.value for r in committed] == [f"{n}:{k}".encode() for n in range(3) for k in range(3)]
    # the next transaction (a new epoch): its first batch on the partition starts it and joins the
    # partition to it, planned against the marker and the ended transaction this process wrote (one
    # statement with the transition); the next batch is one statement again
    statements.clear()
    p2 = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)
    assert produce_service.produce(a, "t", 0, tx_batch(p2, "next", 0)).base_offset == 10
    assert produce_service.produce(a, "t", 0, tx_batch(p2, "next2", 3)).base_offset == 13
    assert statements == ["joined", "optimistic"]


def test_a_transaction_ended_meanwhile_takes_no_batch_from_memory(two, statements) -> None:  # type: ignore[no-untyped-def]
    """The transaction is ended (or its producer fenced) through another process between two
    batches of this one: the batch planned against this process's memory is not appended into the
    ended transaction, and the locked path gives the refusal the database's state calls for."""
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    produce_service.produce(a, "t", 0, tx_batch(p, "0", 0))
    transactions.end_txn(b, "tx", p.producer_id, p.producer_epoch, "abort")  # another process ends it
    statements.clear()
    with pytest.raises(TxlogError) as fenced:  # V2 (the HTTP API): the epoch moved on with the abort
        produce_service.produce(a, "t", 0, tx_batch(p, "1", 3))
    assert fenced.value.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)
    assert statements == ["stale"]
    # the same with a client before transactions V2, which keeps its epoch: the next transaction
    # is open, but this partition was not added to it, so the batch is refused (KIP-890 part 1)
    q1 = transactions.init_producer_id(a, "v1")
    transactions.add_partitions_to_txn(a, "v1", q1.producer_id, q1.producer_epoch, [("t", 1)])
    produce_service.produce(a, "t", 1, tx_batch(q1, "0", 0, "v1", 1, require_added=True))
    transactions.end_txn(b, "v1", q1.producer_id, q1.producer_epoch, "commit", transaction_version=1)
    transactions.add_partitions_to_txn(b, "v1", q1.producer_id, q1.producer_epoch, [("t", 0)])  # the next one, elsewhere
    statements.clear()
    with pytest.raises(TxlogError) as not_added:
        produce_service.produce(a, "t", 1, tx_batch(q1, "1", 3, "v1", 1, require_added=True))
    assert not_added.value.code is ErrorCode.INVALID_TXN_STATE
    assert statements == ["stale"]
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0).records] == [f"0:{k}".encode() for k in range(3)]


@pytest.mark.parametrize("ender", ["elsewhere", "here"])
@pytest.mark.parametrize("result", ["commit", "abort"])
def test_a_transaction_ended_while_its_batches_stream_in_is_never_torn(two, result: str, ender: str) -> None:  # type: ignore[no-untyped-def]
    """A producer streams batches of its transaction to two partitions through one process (one
    statement each, from memory) while the transaction is ended, again and again: by another
    process (the locked path), or by this one, planned against the same memory (one statement,
    racing the batches'). Every batch acknowledged is in the transaction that ended: all of them
    committed, or none visible; nothing is left after the markers holding the last stable offset
    back."""
    import random
    import threading

    a, b = two
    if ender == "here":
        b = a
    rng = random.Random(result)
    p = transactions.init_producer_id(a, "tx")
    for round_ in range(12):
        seqs = {0: 0, 1: 0}
        acked: list[tuple[int, int, int]] = []  # partition, base offset, records
        for partition in (0, 1):  # the first batch on each partition adds it (locked path)
            r = produce_service.produce(a, "t", partition, tx_batch(p, f"{round_}.first", 0, partition=partition))
            acked.append((partition, r.base_offset, 3))
            seqs[partition] = 3
        stop = threading.Event()

        def stream() -> None:  # type: ignore[no-untyped-def]
            n = 0
            while not stop.is_set():
                partition = n % 2
                try:
                    r = produce_service.produce(
                        a, "t", partition, tx_batch(p, f"{round_}.{n}", seqs[partition], partition=partition)
                    )
                except TxlogError as exc:  # the transaction ended: its epoch is fenced now
                    assert exc.code in (
                        ErrorCode.PRODUCER_FENCED,
                        ErrorCode.INVALID_PRODUCER_EPOCH,
                        ErrorCode.CONCURRENT_TRANSACTIONS,
                    ), exc
                    if exc.code is not ErrorCode.CONCURRENT_TRANSACTIONS:
                        return
                else:
                    acked.append((partition, r.base_offset, 3))
                    seqs[partition] += 3
                n += 1

        streamer = threading.Thread(target=stream)
        streamer.start()
        stop.wait(rng.uniform(0.005, 0.05))
        out = transactions.end_txn(b, "tx", p.producer_id, p.producer_epoch, result)  # type: ignore[arg-type]
        stop.set()
        streamer.join()
        for partition in (0, 1):
            with a.db.read() as conn:
                s = log_store.partition_status(conn, "t", partition)
            assert s.last_stable_offset == s.high_watermark, (round_, partition)
            visible = {
                r.offset
                for r in fetch_service.fetch(a, "t", partition, 0, max_records=100_000, isolation_level="read_committed").records
            }
            mine = {o for part, base, n in acked if part == partition for o in range(base, base + n)}
            assert mine <= visible if result == "commit" else not mine & visible, (round_, partition)
        p = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)


def test_the_conditional_statement_checks_the_transaction(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, "tx")
    produce_service.produce(a, "t", 1, tx_batch(p, "0", 0, partition=1))
    position = a.extensions["last_appends"].get("t", 1, p.producer_id)
    plan = produce_service._planned("t", 1, tx_batch(p, "1", 3), a.now(), [3] * 3, position)
    state = position.producer_state
    with a.db.autocommit() as conn:
        assert (
            execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [state], [None])) == {}
        )  # its pid has a transactional id
        assert (
            execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [state], ["other"])) == {}
        )  # not that transactional id's
    with a.db.transaction() as conn:  # the transaction's row held (as by an EndTxn): not waited for
        transactions_store.txn_get(conn, "tx", for_update=True)
        with a.db.autocommit() as other:
            assert execute(driver(other), append_store.log_append_if_unchanged([plan.batch], [state], ["tx"])) == {}
    with a.db.autocommit() as conn:
        assert execute(driver(conn), append_store.log_append_if_unchanged([plan.batch], [state], ["tx"])) == {0: 0}
    transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit")
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0, isolation_level="read_committed").records] == [
        f"{t}:{k}".encode() for t in "01" for k in range(3)
    ]


@pytest.fixture
def ends(monkeypatch):  # type: ignore[no-untyped-def]
    """Which path each EndTxn took: 'ahead' (written by the conditional statement), 'moved' (the
    conditional statement found something changed) or 'locked' (never tried)."""
    seen: list[str] = []
    conditional, locked = append_store.txn_append_if_unchanged, transactions.coordinator.complete

    def if_unchanged(batches, *args, **kwargs):  # type: ignore[no-untyped-def]
        def note(written):  # type: ignore[no-untyped-def]
            if batches and batches[0].control_type is not None:  # markers: an EndTxn
                seen.append("ahead" if written is not None else "moved")
            return written

        return conditional(batches, *args, **kwargs).then(note)

    def complete(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append("locked")
        return locked(*args, **kwargs)

    monkeypatch.setattr(append_store, "txn_append_if_unchanged", if_unchanged)
    monkeypatch.setattr(transactions.coordinator, "complete", complete)
    return seen


def events(broker, tid: str) -> list[str]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        return [e.to_state.value for e in transactions_store.txn_events(conn, tid)]


@pytest.mark.parametrize("result", ["commit", "abort"])
@pytest.mark.parametrize("version", [2, 1])
def test_an_end_after_the_transactions_batches_here_takes_one_statement(two, ends, statements, result: str, version: int) -> None:  # type: ignore[no-untyped-def]
    """EndTxn through the process that appended the transaction's batches: its markers, planned
    against that process's memory, and its transitions are one statement. Everything reads as after
    the locked path: markers on both partitions, the records committed or aborted (and indexed as
    aborted), the last stable offset free, the history PrepareX then CompleteX, the next epoch (V2)
    or the same (V1); a retry is answered again. The next transaction's first batch on a partition
    is planned against the marker: with the partition's joining (V2), or once AddPartitionsToTxn
    added it (V1), refused if it did not."""
    a, _ = two
    p = transactions.init_producer_id(a, "tx")
    for partition in (0, 1):
        if version == 1:
            transactions.add_partitions_to_txn(a, "tx", p.producer_id, p.producer_epoch, [("t", partition)])
        for n in range(2):
            produce_service.produce(
                a, "t", partition, tx_batch(p, f"{partition}.{n}", 3 * n, partition=partition, require_added=version == 1)
            )
    out = transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, result, transaction_version=version)  # type: ignore[arg-type]
    assert ends == ["ahead"]
    assert (out.producer_id, out.producer_epoch) == (p.producer_id, p.producer_epoch + (version == 2))
    done = "CompleteCommit" if result == "commit" else "CompleteAbort"
    assert out.state.value == done
    assert events(a, "tx")[-2:] == ["PrepareCommit" if result == "commit" else "PrepareAbort", done]
    with a.db.read() as conn:
        meta = transactions_store.txn_get(conn, "tx")
        assert meta is not None and meta.state.value == done and meta.transaction_version == version
        for partition in (0, 1):
            s = log_store.partition_status(conn, "t", partition)
            assert (s.high_watermark, s.last_stable_offset) == (7, 7)  # 6 records and the marker
    for partition in (0, 1):
        committed = [r.value for r in fetch_service.fetch(a, "t", partition, 0, isolation_level="read_committed").records]
        assert committed == ([f"{partition}.{n}:{k}".encode() for n in range(2) for k in range(3)] if result == "commit" else [])
        everything = fetch_service.fetch(a, "t", partition, 0, max_records=100).records
        assert len(everything) == 6  # markers are not records a fetch returns
    with a.db.read() as conn:
        aborted = conn.exec_driver_sql("SELECT count(*) FROM txlog.aborted_txns WHERE topic = 't'").scalar()
    assert aborted == (0 if result == "commit" else 2)
    # a retry is answered as the transaction that ended, and writes nothing
    again = transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, result, transaction_version=version)  # type: ignore[arg-type]
    assert (again.state, again.producer_epoch) == (out.state, out.producer_epoch)
    assert events(a, "tx")[-1] == done and ends == ["ahead"]
    # the next transaction: its first batch joins the partition on the locked path, then ends ahead
    p2 = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)
    if version == 1:
        statements.clear()
        with pytest.raises(TxlogError) as not_added:  # no transaction open, so partition 1 is in none
            produce_service.produce(a, "t", 1, tx_batch(p2, "early", 6, partition=1, require_added=True))
        assert not_added.value.code is ErrorCode.INVALID_TXN_STATE and statements == ["stale"]
        transactions.add_partitions_to_txn(a, "tx", p2.producer_id, p2.producer_epoch, [("t", 0)])
    statements.clear()
    assert (
        produce_service.produce(a, "t", 0, tx_batch(p2, "next", 6 if version == 1 else 0, require_added=version == 1)).base_offset
        == 7
    )
    assert statements == (["optimistic"] if version == 1 else ["joined"])
    ends.clear()
    transactions.end_txn(a, "tx", p2.producer_id, p2.producer_epoch, "commit", transaction_version=version)
    assert ends == ["ahead"]
    assert [r.value for r in fetch_service.fetch(a, "t", 0, 7, isolation_level="read_committed").records] == [
        f"next:{k}".encode() for k in range(3)
    ]


def test_an_end_whose_partition_moved_takes_the_locked_path(two, ends) -> None:  # type: ignore[no-untyped-def]
    """Another process appended to a partition of the transaction (a plain batch, or a batch of the
    same transaction) since this one's last append there: the end planned against this process's
    memory writes nothing, and the locked path ends the transaction whole."""
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    produce_service.produce(a, "t", 0, tx_batch(p, "a0", 0))
    produce_service.produce(a, "t", 1, tx_batch(p, "a1", 0, partition=1))
    produce_service.produce(b, "t", 1, ProduceRequest(batch("plain")))  # partition 1 moved on
    transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit")
    assert ends == ["moved", "locked"]
    assert [r.value for r in fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records] == [
        f"a0:{k}".encode() for k in range(3)
    ]
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0, isolation_level="read_committed").records] == [
        v for tag in ("a1", "plain") for v in (f"{tag}:{k}".encode() for k in range(3))
    ]
    # the next transaction's batch on partition 0 went through the other process: same thing
    ends.clear()
    out = transactions.ProducerIdAndEpoch(p.producer_id, p.producer_epoch + 1)
    produce_service.produce(a, "t", 0, tx_batch(out, "n0", 0))
    produce_service.produce(b, "t", 0, tx_batch(out, "n1", 3))
    transactions.end_txn(a, "tx", out.producer_id, out.producer_epoch, "abort")
    assert ends == ["moved", "locked"]
    with a.db.read() as conn:
        s = log_store.partition_status(conn, "t", 0)
    assert s.last_stable_offset == s.high_watermark == 11
    assert [r.value for r in fetch_service.fetch(a, "t", 0, 4, isolation_level="read_committed").records] == []


def test_the_conditional_end_checks_the_transaction_and_every_partition(two) -> None:  # type: ignore[no-untyped-def]
    """The statement writes all of the end or none of it: not at another version of the
    transaction, not while another database transaction holds its row, not if one partition of
    two moved."""
    from app.domain import transactions as txn
    from app.services import coordinator, last_appends

    a, b = two
    p = transactions.init_producer_id(a, "tx")
    for partition in (0, 1):
        produce_service.produce(a, "t", partition, tx_batch(p, str(partition), 0, partition=partition))
    with a.db.read() as conn:
        meta = transactions_store.txn_get(conn, "tx")
    assert meta is not None
    memory = last_appends.of(a)
    positions = [memory.get("t", partition, p.producer_id) for partition in (0, 1)]

    def attempt(was_version: int) -> bool:
        now = a.now()
        was = dataclasses.replace(meta, version=was_version)
        decision = txn.prepared(was, "commit", now)
        prepared = txn.apply(was, decision)
        markers = [
            coordinator.marker("t", part, pos, p.producer_id, p.producer_epoch, True, now) for part, pos in zip((0, 1), positions)
        ]
        done = txn.completed(prepared, now, None)
        with a.db.autocommit() as conn:
            return (
                execute(
                    driver(conn),
                    append_store.txn_append_if_unchanged(
                        markers,
                        [pos.producer_state for pos in positions],
                        (decision, done),
                        was,
                        txn.apply(prepared, done),
                        0,
                        None,
                        False,
                    ),
                )
                is not None
            )

    def untouched() -> None:
        with a.db.read() as conn:
            assert transactions_store.txn_get(conn, "tx") == meta
            assert [log_store.partition_status(conn, "t", part).high_watermark for part in (0, 1)] == [3, 3]

    assert not attempt(meta.version - 1)  # planned against an older version
    untouched()
    with a.db.transaction() as conn:  # the row held, as by another EndTxn: not waited for
        transactions_store.txn_get(conn, "tx", for_update=True)
        assert not attempt(meta.version)
    untouched()
    with a.db.transaction() as conn:  # one partition held: nothing of the end is written
        append_store.partition_lock_for_append(conn, "t", 1, None)
        assert not attempt(meta.version)
    untouched()
    produce_service.produce(b, "t", 1, ProduceRequest(batch("plain")))  # one partition moved
    assert not attempt(meta.version)
    with a.db.read() as conn:
        assert transactions_store.txn_get(conn, "tx") == meta
        assert log_store.partition_status(conn, "t", 0).high_watermark == 3
    # the locked path ends it, whole
    assert transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit").producer_epoch == p.producer_epoch + 1
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0, isolation_level="read_committed").records] == [
        v for tag in ("1", "plain") for v in (f"{tag}:{k}".encode() for k in range(3))
    ]


def members(broker, tid: str) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        return [
            tuple(r)
            for r in conn.exec_driver_sql(  # type: ignore[misc]
                "SELECT topic, partition FROM txlog.transaction_partitions WHERE transactional_id = %(tid)s ORDER BY 1, 2",
                {"tid": tid},
            )
        ]


def test_a_transactions_first_batch_on_a_partition_joins_it_in_one_statement(two, statements, ends) -> None:  # type: ignore[no-untyped-def]
    """Once this process has ended a producer's transaction, the next one's first batch on each
    partition is planned against the marker there and the transaction as this process wrote it:
    the batch, the transaction's start (leaving the ended one's members behind) or the partition's
    joining, in one statement. The members are exactly the new transaction's, so its end marks
    those partitions and no other. Memory gone stale — the transaction changed through another
    process — writes nothing, and the locked path decides."""
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    for partition in (0, 1):
        produce_service.produce(a, "t", partition, tx_batch(p, f"first{partition}", 0, partition=partition))
    out = transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit")
    assert statements == ["locked", "locked"] and ends == ["ahead"]
    # the next transaction: partition 1 alone, then partition 0 joins
    statements.clear()
    ends.clear()
    p2 = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)
    assert produce_service.produce(a, "t", 1, tx_batch(p2, "n1", 0, partition=1)).base_offset == 4
    assert members(a, "tx") == [("t", 1)]  # the ended transaction's partition 0 left behind
    with a.db.read() as conn:
        meta = transactions_store.txn_get(conn, "tx")
    assert meta is not None and meta.state.value == "Ongoing" and meta.partitions == (("t", 1),)
    assert events(a, "tx")[-1] == "Ongoing"
    assert produce_service.produce(a, "t", 1, tx_batch(p2, "n1b", 3, partition=1)).base_offset == 7
    assert produce_service.produce(a, "t", 0, tx_batch(p2, "n0", 0)).base_offset == 4
    assert members(a, "tx") == [("t", 0), ("t", 1)]
    assert statements == ["joined", "optimistic", "joined"]
    out2 = transactions.end_txn(a, "tx", p2.producer_id, p2.producer_epoch, "abort")
    assert ends == ["ahead"]
    for partition, hw in ((0, 8), (1, 11)):
        with a.db.read() as conn:
            s = log_store.partition_status(conn, "t", partition)
        assert (s.high_watermark, s.last_stable_offset) == (hw, hw)
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 0, isolation_level="read_committed").records] == [
        f"first1:{k}".encode() for k in range(3)
    ]
    # a transaction of partition 1 alone marks partition 1 alone
    statements.clear()
    ends.clear()
    p3 = transactions.ProducerIdAndEpoch(out2.producer_id, out2.producer_epoch)
    produce_service.produce(a, "t", 1, tx_batch(p3, "only1", 0, partition=1))
    transactions.end_txn(a, "tx", p3.producer_id, p3.producer_epoch, "commit")
    assert statements == ["joined"] and ends == ["ahead"]
    with a.db.read() as conn:
        assert (
            log_store.partition_status(conn, "t", 0).high_watermark,
            log_store.partition_status(conn, "t", 1).high_watermark,
        ) == (8, 15)
    # the transaction changed through another process (it started there): this process's memory
    # of it is stale, and the batch takes the locked path, into the transaction as it is
    statements.clear()
    p4 = transactions.ProducerIdAndEpoch(p3.producer_id, p3.producer_epoch + 1)
    produce_service.produce(b, "t", 0, tx_batch(p4, "b0", 0))
    produce_service.produce(a, "t", 1, tx_batch(p4, "a1", 0, partition=1))
    assert statements == ["locked", "join-stale", "locked"]
    assert members(a, "tx") == [("t", 0), ("t", 1)]
    transactions.end_txn(a, "tx", p4.producer_id, p4.producer_epoch, "commit")
    assert [r.value for r in fetch_service.fetch(a, "t", 1, 15, isolation_level="read_committed").records] == [
        f"a1:{k}".encode() for k in range(3)
    ]
    # and a producer fenced elsewhere (re-initialised) is refused as the database says
    statements.clear()
    p5 = transactions.ProducerIdAndEpoch(p4.producer_id, p4.producer_epoch + 1)
    transactions.init_producer_id(b, "tx")
    with pytest.raises(TxlogError) as fenced:
        produce_service.produce(a, "t", 1, tx_batch(p5, "late", 0, partition=1))
    assert fenced.value.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)


def test_a_v1_transaction_after_an_end_here_is_one_statement_a_request(two, statements, ends) -> None:  # type: ignore[no-untyped-def]
    """A client before transactions V2 (one epoch across transactions; AddPartitionsToTxn, batches,
    EndTxn): once this process has ended one of its transactions, the next one's
    AddPartitionsToTxn, batches and EndTxn are one statement each. A partition that does not exist
    and a transaction changed through another process are decided on the locked path."""
    a, b = two
    p = transactions.init_producer_id(a, "v1")

    def produce(partition: int, tag: str, seq: int):  # type: ignore[no-untyped-def]
        return produce_service.produce(a, "t", partition, tx_batch(p, tag, seq, "v1", partition, require_added=True))

    transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0), ("t", 1)])
    produce(0, "a", 0)
    produce(1, "b", 0)
    transactions.end_txn(a, "v1", p.producer_id, p.producer_epoch, "commit", transaction_version=1)
    assert statements == ["locked", "locked"] and ends == ["ahead"]
    statements.clear()
    ends.clear()
    transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0)])
    assert members(a, "v1") == [("t", 0)]
    assert produce(0, "c", 3).base_offset == 4
    assert produce(0, "d", 6).base_offset == 7
    transactions.end_txn(a, "v1", p.producer_id, p.producer_epoch, "abort", transaction_version=1)
    assert statements == ["added", "optimistic", "optimistic"] and ends == ["ahead"]
    with a.db.read() as conn:
        assert [log_store.partition_status(conn, "t", part).last_stable_offset for part in (0, 1)] == [11, 4]
    assert [r.value for r in fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records] == [
        f"a:{k}".encode() for k in range(3)
    ]
    # a partition that does not exist: nothing written, and refused under the lock
    statements.clear()
    with pytest.raises(TxlogError) as unknown:
        transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0), ("t", 7)])
    assert unknown.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert statements == ["add-stale"] and members(a, "v1") == [("t", 0)]
    with a.db.read() as conn:
        assert transactions_store.txn_get(conn, "v1").state.value == "CompleteAbort"  # type: ignore[union-attr]
    # refused, the transaction is forgotten: the next AddPartitionsToTxn takes the locked path
    statements.clear()
    transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0)])
    assert statements == [] and members(a, "v1") == [("t", 0)]
    transactions.end_txn(a, "v1", p.producer_id, p.producer_epoch, "commit", transaction_version=1)
    # the next transaction started through another process: this one's memory of it is stale
    transactions.add_partitions_to_txn(b, "v1", p.producer_id, p.producer_epoch, [("t", 1)])
    statements.clear()
    transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0)])
    assert statements == ["add-stale"]
    assert members(a, "v1") == [("t", 0), ("t", 1)]
    transactions.end_txn(a, "v1", p.producer_id, p.producer_epoch, "commit", transaction_version=1)
    with a.db.read() as conn:
        assert [log_store.partition_status(conn, "t", part).last_stable_offset for part in (0, 1)] == [13, 5]


@pytest.mark.parametrize("result", ["commit", "abort"])
def test_an_end_planned_ahead_applies_or_drops_the_group_offsets(two, ends, result: str) -> None:  # type: ignore[no-untyped-def]
    """A consume-transform-produce transaction (batches and the consumer's offsets): its end,
    planned ahead, applies the pending offsets with the markers when it commits, and drops them when
    it aborts — the group's offsets other partitions had stay as they were."""
    a, _ = two
    topics.create_topic(a, "in", 2)
    with a.db.transaction() as conn:
        groups_store.group_offsets_upsert(conn, "g", [GroupOffset("in", 1, 5, "before")])
    p = transactions.init_producer_id(a, "eos")
    for partition in (0, 1):
        produce_service.produce(a, "t", partition, tx_batch(p, f"out{partition}", 0, "eos", partition))
    transactions.txn_offset_commit(
        a, "eos", p.producer_id, p.producer_epoch, "g", [GroupOffset("in", 0, 42, "m0"), GroupOffset("in", 1, 7, "m1")]
    )
    with a.db.read() as conn:
        assert [(o.partition, o.offset, o.pending) for o in groups_store.group_offsets_fetch(conn, "g")] == [
            (0, None, True),
            (1, 5, True),
        ]
    transactions.end_txn(a, "eos", p.producer_id, p.producer_epoch, result)  # type: ignore[arg-type]
    assert ends == ["ahead"]
    with a.db.read() as conn:
        got = [(o.partition, o.offset, o.metadata, o.pending) for o in groups_store.group_offsets_fetch(conn, "g")]
        pending = conn.exec_driver_sql("SELECT count(*) FROM txlog.pending_group_offsets").scalar()
    assert pending == 0
    assert got == ([(0, 42, "m0", False), (1, 7, "m1", False)] if result == "commit" else [(1, 5, "before", False)])
    visible = [r.value for r in fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records]
    assert visible == ([f"out0:{k}".encode() for k in range(3)] if result == "commit" else [])


def test_add_partitions_answers_alike_on_either_path(two, statements) -> None:  # type: ignore[no-untyped-def]
    """AddPartitionsToTxn answers the transaction with the partitions asked for as its members,
    planned ahead or under the lock."""
    a, b = two
    p = transactions.init_producer_id(a, "v1")
    transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0)])
    produce_service.produce(a, "t", 0, tx_batch(p, "a", 0, "v1", 0, require_added=True))
    transactions.end_txn(a, "v1", p.producer_id, p.producer_epoch, "commit", transaction_version=1)
    statements.clear()
    first = transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 0)])
    ahead = transactions.add_partitions_to_txn(a, "v1", p.producer_id, p.producer_epoch, [("t", 1)])
    assert statements == ["added", "added"]
    locked = transactions.add_partitions_to_txn(b, "v1", p.producer_id, p.producer_epoch, [("t", 1)])
    assert (first.partitions, ahead.partitions, locked.partitions) == ((("t", 0),), (("t", 1),), (("t", 1),))
    assert ahead.state == locked.state and ahead.version == locked.version
    assert members(a, "v1") == [("t", 0), ("t", 1)]


def test_a_partition_beyond_the_limit_is_refused_on_the_locked_path(db_url: str, statements) -> None:  # type: ignore[no-untyped-def]
    a = make_broker(db_url, produce_group_commit_batches=1, max_partitions_per_transaction=1)
    try:
        topics.create_topic(a, "lim", 2)
        p = transactions.init_producer_id(a, "lim-tx")
        for partition in (0, 1):
            produce_service.produce(a, "lim", partition, ProduceRequest(batch("x"), p.producer_id, p.producer_epoch, 0, "lim-tx"))
            out = transactions.end_txn(a, "lim-tx", p.producer_id, p.producer_epoch, "commit")
            p = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)
        statements.clear()
        produce_service.produce(a, "lim", 0, ProduceRequest(batch("y"), p.producer_id, p.producer_epoch, 0, "lim-tx"))
        with pytest.raises(TxlogError) as refused:
            produce_service.produce(a, "lim", 1, ProduceRequest(batch("z"), p.producer_id, p.producer_epoch, 0, "lim-tx"))
        assert refused.value.code is ErrorCode.POLICY_VIOLATION
        assert statements == ["joined"]  # the second partition was never planned ahead
    finally:
        a.db.dispose()


def test_last_appends_is_bounded() -> None:
    last = LastAppends(limit=2)
    position = AppendPosition(0, 0, 0, None, None)
    for partition in range(5):
        last.remember(AppendBatch("t", partition, 0, 0, batch("x", 1), 0, sizes=[3]), position)
        assert len(last) <= 2
    remembered = last.get("t", 4, None)
    assert remembered is not None and (remembered.next_offset, remembered.next_position) == (1, 3)


def test_concurrent_producers_through_two_processes_append_each_batch_once(db_url: str) -> None:
    """Two processes, one grouping concurrent batches and one not, six producers and a plain writer
    on one partition: every batch once, each producer's in order, each answered with its offsets."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    brokers = [make_broker(db_url, produce_group_commit_batches=1), make_broker(db_url, produce_group_commit_batches=16)]
    try:
        topics.create_topic(brokers[0], "t", 1)
        producers = [transactions.init_producer_id(brokers[0], None) for _ in range(6)]
        start = threading.Barrier(7)
        rounds = 25

        def idempotent(i: int) -> list[int]:
            pid, epoch = producers[i].producer_id, producers[i].producer_epoch
            start.wait()
            return [
                produce_service.produce(
                    brokers[(i + n) % 2], "t", 0, ProduceRequest(batch(f"{i}.{n}", 2), pid, epoch, 2 * n)
                ).base_offset
                for n in range(rounds)
            ]

        def plain() -> list[int]:
            start.wait()
            return [
                produce_service.produce(brokers[n % 2], "t", 0, ProduceRequest(batch(f"p.{n}", 2))).base_offset
                for n in range(rounds)
            ]

        with ThreadPoolExecutor(7) as pool:
            futures = [pool.submit(idempotent, i) for i in range(6)] + [pool.submit(plain)]
            answered = [f.result() for f in futures]
        values = log(brokers[0])
        assert len(values) == 7 * rounds * 2
        for i, tag in enumerate([*map(str, range(6)), "p"]):
            for n, base in enumerate(answered[i]):
                assert values[base : base + 2] == [f"{tag}.{n}:{k}".encode() for k in range(2)]
    finally:
        for b in brokers:
            b.db.dispose()


def test_a_group_appends_its_batches_planned_ahead_in_one_statement(db_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Concurrent batches of producers whose partitions this process left where they are go
    through one conditional statement; one whose partition another process moved takes the
    locked path; a partition another transaction holds is not waited for by the group."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    a, b = make_broker(db_url, produce_group_commit_batches=16), make_broker(db_url, produce_group_commit_batches=1)
    try:
        topics.create_topic(a, "t", 4)
        sizes: list[int] = []
        conditional = append_store.log_append_if_unchanged

        def counting(batches, planned_against, transactional_ids):  # type: ignore[no-untyped-def]
            sizes.append(len(batches))
            return conditional(batches, planned_against, transactional_ids)

        monkeypatch.setattr(append_store, "log_append_if_unchanged", counting)
        producers = [transactions.init_producer_id(a, None) for _ in range(4)]
        rounds = 30
        moved = threading.Event()

        def run(i: int) -> list[int]:
            pid, epoch = producers[i].producer_id, producers[i].producer_epoch
            out = []
            for n in range(rounds):
                out.append(
                    produce_service.produce(a, "t", i, ProduceRequest(batch(f"{i}.{n}", 2), pid, epoch, 2 * n)).base_offset
                )
                if i == 0 and n == rounds // 2 and not moved.is_set():
                    produce_service.produce(b, "t", 0, ProduceRequest(batch("other", 2)))  # another process moves partition 0
                    moved.set()
            return out

        with ThreadPoolExecutor(4) as pool:
            answered = list(pool.map(run, range(4)))
        assert max(sizes) > 1, "concurrent batches planned ahead were never appended together"
        for i in range(4):
            values = [r.value for r in fetch_service.fetch(a, "t", i, 0, max_records=1000).records]
            mine = [v for v in values if not v.startswith(b"other")]  # type: ignore[union-attr]
            assert mine == [f"{i}.{n}:{k}".encode() for n in range(rounds) for k in range(2)]
            for n, base in enumerate(answered[i]):
                assert values[base : base + 2] == [f"{i}.{n}:{k}".encode() for k in range(2)]
    finally:
        a.db.dispose()
        b.db.dispose()


# --- the same operations on an event loop (``executor.LoopExecutor``, as the Kafka gateway and the
# HTTP workers run them): whatever moved meanwhile leaves the batch to the locked path, nothing is
# written twice, nothing is taken from memory that the database no longer says; and the loop's
# connections (``db.LoopConnections``): bounded, replaced when they fail, failures named.


class AheadOnly(LoopExecutor):
    """The loop's executor, except that an operation's blocking step (its locked path) is answered
    None instead of run: what an operation takes on the loop by its statements planned ahead."""

    async def _step(self, step):  # type: ignore[no-untyped-def]
        if isinstance(step, Blocking):
            return None
        return await super()._step(step)


async def in_thread(fn, *args):  # type: ignore[no-untyped-def]
    return await asyncio.to_thread(fn, *args)


def loop_call(broker, steps, *args, connections: LoopConnections | None = None, blocking=in_thread):  # type: ignore[no-untyped-def]
    """An operation's steps (``steps(broker, *args, now)``) on a loop of its own, planned ahead
    only (``AheadOnly``; None: left to the locked path), with connections of its own unless given."""

    async def run():  # type: ignore[no-untyped-def]
        conns = connections or LoopConnections(broker.settings.database_url, 2)
        try:
            return await AheadOnly(broker, conns, blocking).run(functools.partial(steps, broker, *args))
        finally:
            if connections is None:
                await conns.close()

    return asyncio.run(run())


def on_loop(broker, req: ProduceRequest, connections: LoopConnections | None = None, blocking=in_thread):  # type: ignore[no-untyped-def]
    """A produce to partition 0 of "t" on a loop of its own, planned ahead only."""
    return loop_call(broker, produce_service.produce_steps, "t", 0, req, connections=connections, blocking=blocking)


def add(broker, tid, producer_id, producer_epoch, partitions, now):  # type: ignore[no-untyped-def]
    """AddPartitionsToTxn's steps, of no principal."""
    return transactions.add_partitions_to_txn_steps(broker, tid, producer_id, producer_epoch, partitions, None, now)


def test_a_producers_next_batches_are_appended_on_the_loop(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, None)
    # nothing remembered yet: the first batch is left to the locked path
    assert on_loop(a, ProduceRequest(batch("0"), p.producer_id, p.producer_epoch, 0)) is None
    assert log(a) == []
    produce_service.produce(a, "t", 0, ProduceRequest(batch("0"), p.producer_id, p.producer_epoch, 0))
    results = [on_loop(a, ProduceRequest(batch(str(n)), p.producer_id, p.producer_epoch, 3 * n)) for n in (1, 2)]
    assert [(r.base_offset, r.last_offset, r.duplicate) for r in results] == [(3, 5, False), (6, 8, False)]
    assert log(a) == [f"{n}:{k}".encode() for n in range(3) for k in range(3)]
    # a retry is a duplicate, and a duplicate is answered under the lock, never on the loop
    assert on_loop(a, ProduceRequest(batch("2"), p.producer_id, p.producer_epoch, 6)) is None
    again = produce_service.produce(a, "t", 0, ProduceRequest(batch("2"), p.producer_id, p.producer_epoch, 6))
    assert again.duplicate and again.base_offset == 6
    # the producer's state was saved with each batch: a gap is refused (under the lock)
    assert on_loop(a, ProduceRequest(batch("gap"), p.producer_id, p.producer_epoch, 30)) is None
    with pytest.raises(TxlogError) as gap:
        produce_service.produce(a, "t", 0, ProduceRequest(batch("gap"), p.producer_id, p.producer_epoch, 30))
    assert gap.value.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert len(log(a)) == 9


def test_a_partition_another_process_moved_is_left_by_the_loop_to_the_locked_path(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    p = transactions.init_producer_id(a, None)
    produce_service.produce(a, "t", 0, ProduceRequest(batch("a0"), p.producer_id, p.producer_epoch, 0))
    produce_service.produce(b, "t", 0, ProduceRequest(batch("b")))  # another process appends first
    assert on_loop(a, ProduceRequest(batch("a1"), p.producer_id, p.producer_epoch, 3)) is None
    assert log(a) == [f"{t}:{k}".encode() for t in ("a0", "b") for k in range(3)]  # nothing written
    second = produce_service.produce(a, "t", 0, ProduceRequest(batch("a1"), p.producer_id, p.producer_epoch, 3))
    assert second.base_offset == 6 and not second.duplicate
    # the locked path's append is remembered: the next batch is the loop's again
    third = on_loop(a, ProduceRequest(batch("a2"), p.producer_id, p.producer_epoch, 6))
    assert third is not None and third.base_offset == 9
    assert log(a) == [f"{t}:{k}".encode() for t in ("a0", "b", "a1", "a2") for k in range(3)]


def test_a_v1_transactions_batches_are_appended_on_the_loop_only_while_it_is_open(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, "tx")
    transactions.add_partitions_to_txn(a, "tx", p.producer_id, p.producer_epoch, [("t", 0)])

    def req(tag: str, seq: int) -> ProduceRequest:
        return ProduceRequest(batch(tag), p.producer_id, p.producer_epoch, seq, transactional_id="tx", require_added=True)

    produce_service.produce(a, "t", 0, req("0", 0))
    appended = on_loop(a, req("1", 3))
    assert appended is not None and appended.base_offset == 3
    transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit", transaction_version=1)
    # the transaction ended: a batch for it is not appended from memory; the locked path refuses
    # it, the partition not being in an open transaction
    assert on_loop(a, req("late", 6)) is None
    with pytest.raises(TxlogError):
        produce_service.produce(a, "t", 0, req("late", 6))
    committed = fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records
    assert [r.value for r in committed] == [f"{n}:{k}".encode() for n in range(2) for k in range(3)]


def test_a_v1_transactions_add_and_end_are_planned_ahead_on_the_loop(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    end = transactions.end_txn_steps

    def req(tag: str, seq: int) -> ProduceRequest:
        return ProduceRequest(batch(tag), p.producer_id, p.producer_epoch, seq, transactional_id="tx", require_added=True)

    # nothing remembered of the transaction yet: the add is left to the locked path, nothing written
    assert loop_call(a, add, "tx", p.producer_id, p.producer_epoch, [("t", 0)]) is None
    assert transactions.describe(a, "tx").state.value == "Empty"
    transactions.add_partitions_to_txn(a, "tx", p.producer_id, p.producer_epoch, [("t", 0)])
    produce_service.produce(a, "t", 0, req("0", 0))
    # the end reads the transaction, and ends it by one statement planned against that reading
    first = loop_call(a, end, "tx", p.producer_id, p.producer_epoch, "commit", 1)
    assert first is not None and first.state.value == "CompleteCommit"  # now remembered
    # the next transaction: added, appended and ended on the loop, each by one statement
    added = loop_call(a, add, "tx", p.producer_id, p.producer_epoch, [("t", 0)])
    assert added is not None and added.state.value == "Ongoing" and added.partitions == (("t", 0),)
    assert on_loop(a, req("1", 3)) is not None
    ended = loop_call(a, end, "tx", p.producer_id, p.producer_epoch, "commit", 1)
    assert ended is not None and ended.state.value == "CompleteCommit"
    assert (ended.producer_id, ended.producer_epoch) == (p.producer_id, p.producer_epoch)  # V1 keeps the epoch
    committed = fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records
    assert [r.value for r in committed] == [f"{n}:{k}".encode() for n in range(2) for k in range(3)]
    states = [e.to_state.value for e in transactions.events(a, "tx")]
    assert states[-3:] == ["Ongoing", "PrepareCommit", "CompleteCommit"] and states.count("CompleteCommit") == 2
    # another process fences the producer: what this one remembers is stale, nothing is written
    # from it, and the thread's path answers the fencing
    transactions.init_producer_id(b, "tx")
    assert loop_call(a, add, "tx", p.producer_id, p.producer_epoch, [("t", 0)]) is None
    with pytest.raises(TxlogError) as fenced:
        transactions.add_partitions_to_txn(a, "tx", p.producer_id, p.producer_epoch, [("t", 0)])
    assert fenced.value.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)


def test_a_transactions_first_batch_on_a_partition_joins_it_on_the_loop(two) -> None:  # type: ignore[no-untyped-def]
    """The statement of ``_joined_ahead`` awaited on the loop: once this process has ended a
    producer's transaction, the next one's first batch starts it, with the partition, in one
    statement; memory gone stale writes nothing and leaves the batch to the locked path."""
    a, b = two
    p = transactions.init_producer_id(a, "tx")
    # nothing remembered of the transaction: left to the locked path, nothing written
    assert on_loop(a, tx_batch(p, "0", 0)) is None
    assert log(a) == [] and transactions.describe(a, "tx").state.value == "Empty"
    produce_service.produce(a, "t", 0, tx_batch(p, "0", 0))
    out = transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit")
    p2 = transactions.ProducerIdAndEpoch(out.producer_id, out.producer_epoch)
    first = on_loop(a, tx_batch(p2, "1", 0))
    assert first is not None and (first.base_offset, first.duplicate) == (4, False)
    described = transactions.describe(a, "tx")
    assert described.state.value == "Ongoing" and list(described.partitions) == [("t", 0)]
    assert events(a, "tx")[-1] == "Ongoing"
    second = on_loop(a, tx_batch(p2, "1b", 3))  # its next batch: planned ahead as any other
    assert second is not None and second.base_offset == 7
    with a.db.read() as conn:
        assert log_store.partition_status(conn, "t", 0).last_stable_offset == 4  # held by the open transaction
    out2 = transactions.end_txn(a, "tx", p2.producer_id, p2.producer_epoch, "commit")
    assert [r.value for r in fetch_service.fetch(a, "t", 0, 0, isolation_level="read_committed").records] == [
        f"{t}:{k}".encode() for t in ("0", "1", "1b") for k in range(3)
    ]
    # the transaction changed through another process: nothing is written from memory, and the
    # locked path answers as the database says
    p3 = transactions.ProducerIdAndEpoch(out2.producer_id, out2.producer_epoch)
    transactions.init_producer_id(b, "tx")
    before = log(a)
    assert on_loop(a, tx_batch(p3, "late", 0)) is None
    assert log(a) == before
    with pytest.raises(TxlogError) as fenced:
        produce_service.produce(a, "t", 0, tx_batch(p3, "late", 0))
    assert fenced.value.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)


class Blocked:
    """A loop's ``blocking``: runs each function in a thread, noting its name."""

    def __init__(self) -> None:
        self.names: list[str] = []

    async def __call__(self, fn, *args):  # type: ignore[no-untyped-def]
        self.names.append(getattr(fn, "__name__", type(fn).__name__))
        return await asyncio.to_thread(fn, *args)


def test_an_end_on_the_loop_waits_neither_for_a_connection_nor_for_the_clock(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, "tx")

    def transaction() -> None:  # one batch in an open V1 transaction, all of it remembered
        transactions.add_partitions_to_txn(a, "tx", p.producer_id, p.producer_epoch, [("t", 0)])
        produce_service.produce(
            a, "t", 0, ProduceRequest(batch("0"), p.producer_id, p.producer_epoch, 0, transactional_id="tx", require_added=True)
        )

    transaction()
    transactions.end_txn(a, "tx", p.producer_id, p.producer_epoch, "commit", transaction_version=1)
    added = loop_call(a, add, "tx", p.producer_id, p.producer_epoch, [("t", 0)])
    assert added is not None
    produce_service.produce(
        a, "t", 0, ProduceRequest(batch("1"), p.producer_id, p.producer_epoch, 3, transactional_id="tx", require_added=True)
    )

    # every connection of the loop in use: the statement is sent from a worker thread instead
    async def all_in_use(blocked: Blocked):  # type: ignore[no-untyped-def]
        conns = LoopConnections(a.settings.database_url, 1)
        try:
            async with conns.connection() as held:
                assert held is not None
                steps = functools.partial(transactions.end_txn_steps, a, "tx", p.producer_id, p.producer_epoch, "commit", 1)
                return await AheadOnly(a, conns, blocked).run(steps)
        finally:
            await conns.close()

    blocked = Blocked()
    ended = asyncio.run(all_in_use(blocked))
    assert ended is not None and ended.state.value == "CompleteCommit"
    assert blocked.names == ["_in_thread"]
    # a clock due a reading from the database: the operation runs whole in a worker thread
    a.clock = DatabaseClock(a.db, resync_s=0.0)
    a.now()
    blocked = Blocked()
    ended = loop_call(a, add, "tx", p.producer_id, p.producer_epoch, [("t", 0)], blocking=blocked)
    assert ended is not None and ended.state.value == "Ongoing"
    assert blocked.names == ["run"]
    a.clock = DatabaseClock(a.db)
    a.now()
    blocked = Blocked()
    ended = loop_call(a, transactions.end_txn_steps, "tx", p.producer_id, p.producer_epoch, "abort", 1, blocking=blocked)
    assert ended is not None and ended.state.value == "CompleteAbort"
    assert blocked.names == []  # nothing left the loop


def test_the_loop_waits_neither_for_a_connection_nor_for_the_clock(two) -> None:  # type: ignore[no-untyped-def]
    a, _ = two
    p = transactions.init_producer_id(a, None)
    produce_service.produce(a, "t", 0, ProduceRequest(batch("0"), p.producer_id, p.producer_epoch, 0))

    async def all_in_use(blocked: Blocked):  # type: ignore[no-untyped-def]
        conns = LoopConnections(a.settings.database_url, 1)
        try:
            async with conns.connection() as held:
                assert held is not None
                async with conns.connection() as none:
                    assert none is None
                steps = functools.partial(
                    produce_service.produce_steps, a, "t", 0, ProduceRequest(batch("1"), p.producer_id, p.producer_epoch, 3)
                )
                return await AheadOnly(a, conns, blocked).run(steps)
        finally:
            await conns.close()

    blocked = Blocked()
    appended = asyncio.run(all_in_use(blocked))
    assert appended is not None and appended.base_offset == 3
    assert blocked.names == ["_in_thread"]  # sent from a worker thread, not waited for on the loop
    # a clock due a reading from the database: not read from the loop
    due = DatabaseClock(a.db, resync_s=0.0)
    assert due() > 0 and due.without_waiting() is None
    a.clock = due
    blocked = Blocked()
    appended = on_loop(a, ProduceRequest(batch("2"), p.producer_id, p.producer_epoch, 6), blocking=blocked)
    assert appended is not None and appended.base_offset == 6
    assert blocked.names == ["run"]
    assert len(log(a)) == 9
    a.clock = DatabaseClock(a.db)
    assert a.now_without_waiting() is None  # never read yet
    a.now()
    assert a.now_without_waiting() is not None
    blocked = Blocked()
    assert on_loop(a, ProduceRequest(batch("3"), p.producer_id, p.producer_epoch, 9), blocking=blocked) is not None
    assert blocked.names == []


def test_a_failed_connection_is_named_and_replaced(db_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(dbmod, "IDLE_PING_SECONDS", 3600.0)  # no check before use: the failure reaches the caller

    async def run() -> tuple[ErrorCode, int, int]:
        conns = LoopConnections(db_url, 1, SessionLimits())
        try:
            async with conns.connection() as conn:
                first = conn.info.backend_pid  # type: ignore[union-attr]
                row = await (await conn.execute("SHOW lock_timeout")).fetchone()  # type: ignore[union-attr]
                assert row == ("5s",)  # the engine's session limits
            with psycopg.connect(libpq_url(db_url), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (first,))
            with pytest.raises(TxlogError) as failed:
                async with conns.connection() as conn:
                    await conn.execute("SELECT 1")  # type: ignore[union-attr]
            async with conns.connection() as conn:  # a new one
                again = conn.info.backend_pid  # type: ignore[union-attr]
                await conn.execute("SELECT 1")  # type: ignore[union-attr]
            return failed.value.code, first, again
        finally:
            await conns.close()

    code, first, again = asyncio.run(run())
    assert code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert again != first


def test_an_idle_connection_is_checked_before_use(db_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(dbmod, "IDLE_PING_SECONDS", 0.0)  # every reuse checks first

    async def run() -> tuple[int, int]:
        conns = LoopConnections(db_url, 1)
        try:
            async with conns.connection() as conn:
                first = conn.info.backend_pid  # type: ignore[union-attr]
            with psycopg.connect(libpq_url(db_url), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (first,))
            async with conns.connection() as conn:  # the dead one found out and replaced, unseen
                await conn.execute("SELECT 1")  # type: ignore[union-attr]
                return first, conn.info.backend_pid  # type: ignore[union-attr]
        finally:
            await conns.close()

    first, again = asyncio.run(run())
    assert again != first


def producing(broker, partition: int, req: ProduceRequest):  # type: ignore[no-untyped-def]
    """A produce's steps to a partition of "g"."""
    return functools.partial(produce_service.produce_steps, broker, "g", partition, req)


def senders(ex: LoopExecutor) -> int:
    """Statements the loop's group commits count as in flight."""
    return sum(executor_mod.LOOP_STATEMENTS - group._queue._free for group in ex._groups.values())


# --- the loop's group commit: batches planned ahead that arrive while ``LOOP_STATEMENTS`` statements
# are in flight share the next one (one batch per partition), each caller hearing of its own batch.


@pytest.fixture
def grouped(db_url: str, monkeypatch):  # type: ignore[no-untyped-def]
    """A broker with the group commit, an 8-partition topic "g", 8 idempotent producers that have
    each appended a first batch to their own partition (remembered), and the loop statements' group
    sizes as they are sent."""
    broker = make_broker(db_url)
    topics.create_topic(broker, "g", 8)
    broker.now()
    producers = [transactions.init_producer_id(broker, None) for _ in range(8)]
    for i, p in enumerate(producers):
        produce_service.produce(broker, "g", i, ProduceRequest(batch(f"{i}.0"), p.producer_id, p.producer_epoch, 0))
    sizes: list[int] = []
    statement_of = produce_service.appends_if_unchanged

    def counted(planned):  # type: ignore[no-untyped-def]
        sizes.append(len(planned))
        return statement_of(planned)

    monkeypatch.setattr(produce_service, "appends_if_unchanged", counted)
    yield broker, producers, sizes
    broker.db.dispose()


def values_of(broker, partition: int) -> list[bytes | None]:  # type: ignore[no-untyped-def]
    return [r.value for r in fetch_service.fetch(broker, "g", partition, 0, max_records=100_000).records]


def test_batches_arriving_together_on_the_loop_share_a_statement(grouped) -> None:  # type: ignore[no-untyped-def]
    broker, producers, sizes = grouped

    async def run():  # type: ignore[no-untyped-def]
        conns = LoopConnections(broker.settings.database_url, 4)
        ex = AheadOnly(broker, conns, in_thread)
        try:
            rounds = []
            for n in (1, 2, 3):
                rounds.append(
                    await asyncio.gather(
                        *(
                            ex.run(
                                producing(broker, i, ProduceRequest(batch(f"{i}.{n}"), p.producer_id, p.producer_epoch, 3 * n))
                            )
                            for i, p in enumerate(producers)
                        )
                    )
                )
            return rounds, senders(ex)
        finally:
            await conns.close()

    rounds, in_flight = asyncio.run(run())
    for n, results in enumerate(rounds, 1):
        assert [(r.base_offset, r.last_offset) for r in results] == [(3 * n, 3 * n + 2)] * 8
    # the first two batches of a round are sent at once, alone; the six that came meanwhile share the
    # next statement or, when both first statements end before it is sent, the next two
    assert sum(sizes) == 24 and len(sizes) <= 12 and max(sizes) >= 3
    assert in_flight == 0
    for i in range(8):
        assert values_of(broker, i) == [f"{i}.{n}:{k}".encode() for n in range(4) for k in range(3)]


def test_a_second_batch_for_a_partition_waits_for_the_next_statement(grouped) -> None:  # type: ignore[no-untyped-def]
    broker, producers, sizes = grouped
    # producers 0 and 1 both append to partition 0 as well; only one of two batches planned against
    # the same end of the partition can be appended there, the other goes the locked way
    extra = transactions.init_producer_id(broker, None)
    produce_service.produce(broker, "g", 0, ProduceRequest(batch("x.0"), extra.producer_id, extra.producer_epoch, 0))
    reqs = [(i, ProduceRequest(batch(f"{i}.1"), producers[i].producer_id, producers[i].producer_epoch, 3)) for i in (1, 2, 0, 3)]
    reqs.insert(3, (0, ProduceRequest(batch("x.1"), extra.producer_id, extra.producer_epoch, 3)))

    async def run():  # type: ignore[no-untyped-def]
        conns = LoopConnections(broker.settings.database_url, 4)
        ex = AheadOnly(broker, conns, in_thread)
        try:
            return await asyncio.gather(*(ex.run(producing(broker, i, r)) for i, r in reqs))
        finally:
            await conns.close()

    results = asyncio.run(run())
    # sent: 1 alone, 2 alone, then 0 and 3 together, x (partition 0 again) left for the next statement
    assert sorted(sizes) == [1, 1, 1, 2]
    # 0 was planned where x's first batch went since: left to the locked path
    assert [r is not None for r in results] == [True, True, False, True, True]
    for (i, r), result in zip(reqs, results):
        if result is None:
            produce_service.produce(broker, "g", i, r)
    got = values_of(broker, 0)
    assert sorted(got) == sorted([f"{t}:{k}".encode() for t in ("0.0", "x.0", "0.1", "x.1") for k in range(3)])
    assert len(set(got)) == len(got)  # each batch once


def test_a_cancelled_waiter_leaves_its_place_and_nothing_stalls(grouped) -> None:  # type: ignore[no-untyped-def]
    broker, producers, sizes = grouped

    async def run():  # type: ignore[no-untyped-def]
        conns = LoopConnections(broker.settings.database_url, 4)
        ex = AheadOnly(broker, conns, in_thread)
        try:
            tasks = [
                asyncio.create_task(
                    ex.run(producing(broker, i, ProduceRequest(batch(f"{i}.1"), p.producer_id, p.producer_epoch, 3)))
                )
                for i, p in enumerate(producers)
            ]
            await asyncio.sleep(0)  # every task has planned and is sending or waiting
            for t in tasks[2:5]:
                t.cancel()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
            again = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        ex.run(producing(broker, i, ProduceRequest(batch(f"{i}.2"), p.producer_id, p.producer_epoch, 3)))
                        for i, p in enumerate(producers)
                        if i in (2, 3, 4)
                    )
                ),
                30,
            )
            return done, again, senders(ex)
        finally:
            await conns.close()

    done, again, in_flight = asyncio.run(run())
    assert [isinstance(d, asyncio.CancelledError) for d in done] == [False, False, True, True, True, False, False, False]
    assert all(d.base_offset == 3 for i, d in enumerate(done) if i not in (2, 3, 4))
    assert [a.base_offset for a in again] == [3, 3, 3]  # the cancelled batches were never written
    assert sum(sizes) == 8 and max(sizes) >= 2 and in_flight == 0
    for i in (2, 3, 4):
        assert values_of(broker, i) == [f"{i}.{n}:{k}".encode() for n in (0, 2) for k in range(3)]


def test_a_failed_group_statement_is_heard_by_each_of_its_batches(grouped, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    broker, producers, sizes = grouped
    counted = produce_service.appends_if_unchanged

    def failing(planned):  # type: ignore[no-untyped-def]
        if all(a.plan.batch.partition >= 2 for a in planned):  # the waiters' statements: as if the connection broke
            sizes.append(len(planned))
            raise TxlogError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the connection to the database broke")
        return counted(planned)

    monkeypatch.setattr(produce_service, "appends_if_unchanged", failing)

    async def run():  # type: ignore[no-untyped-def]
        conns = LoopConnections(broker.settings.database_url, 4)
        ex = AheadOnly(broker, conns, in_thread)
        try:
            got = await asyncio.gather(
                *(
                    ex.run(producing(broker, i, ProduceRequest(batch(f"{i}.1"), p.producer_id, p.producer_epoch, 3)))
                    for i, p in enumerate(producers)
                ),
                return_exceptions=True,
            )
            return got, senders(ex)
        finally:
            await conns.close()

    got, in_flight = asyncio.run(run())
    assert sum(sizes) == 8 and max(sizes) >= 3 and in_flight == 0
    assert [r.base_offset for r in got[:2]] == [3, 3]
    assert all(isinstance(e, TxlogError) and e.code is ErrorCode.COORDINATOR_NOT_AVAILABLE for e in got[2:])
    # nothing is taken from memory after a failure: the producers' retries go the locked way
    last = produce_service.last_appends.of(broker)
    assert all(last.get("g", i, p.producer_id) is None for i, p in enumerate(producers) if i >= 2)
    for i, p in enumerate(producers[2:], 2):
        retried = produce_service.produce(broker, "g", i, ProduceRequest(batch(f"{i}.1"), p.producer_id, p.producer_epoch, 3))
        assert retried.base_offset == 3 and not retried.duplicate
