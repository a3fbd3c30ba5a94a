"""Idempotent producers through the services, against a real PostgreSQL: duplicates, sequence
errors, fencing, state that survives a restart and expires, concurrent retries of one batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import sweeper, topics, transactions
from app.services.produce import ProduceRequest
from tests import storage_helpers
from tests.conftest import make_broker


def recs(*values: str) -> list[NewRecord]:
    return [NewRecord(None, v.encode()) for v in values]


def send(broker, pid: int, epoch: int, seq: int, *values: str, partition: int = 0, topic: str = "t", tid: str | None = None):  # type: ignore[no-untyped-def]
    return produce_service.produce(broker, topic, partition, ProduceRequest(recs(*values), pid, epoch, seq, tid))


def error_of(fn, *args, **kwargs) -> TxlogError:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args, **kwargs)
    return info.value


def log_values(broker, partition: int = 0, topic: str = "t") -> list[bytes | None]:  # type: ignore[no-untyped-def]
    return [r.value for r in fetch_service.fetch(broker, topic, partition, 0, max_records=10_000).records]


def high_watermark(broker, partition: int = 0, topic: str = "t") -> int:  # type: ignore[no-untyped-def]
    return fetch_service.fetch(broker, topic, partition, 0, max_records=1).high_watermark


def new_pid(broker) -> int:  # type: ignore[no-untyped-def]
    got = transactions.init_producer_id(broker, None)
    assert got.producer_epoch == 0
    return got.producer_id


@pytest.fixture
def topic(broker):  # type: ignore[no-untyped-def]
    topics.create_topic(broker, "t", 2)
    return "t"


# --- sequences ------------------------------------------------------------------------------------


def test_batches_in_sequence_get_dense_offsets_and_are_stored_with_their_sequences(broker, topic):
    pid = new_pid(broker)
    a = send(broker, pid, 0, 0, "a0", "a1", "a2")
    b = send(broker, pid, 0, 3, "b0")
    c = send(broker, pid, 0, 4, "c0", "c1")
    assert [(r.base_offset, r.last_offset, r.duplicate) for r in (a, b, c)] == [(0, 2, False), (3, 3, False), (4, 5, False)]
    got = fetch_service.fetch(broker, "t", 0, 0).records
    assert [(r.offset, r.producer_id, r.producer_epoch, r.sequence, r.is_transactional) for r in got] == [
        (i, pid, 0, i, False) for i in range(6)
    ]


def test_a_duplicate_answers_the_original_offsets_and_appends_nothing(broker, topic):
    pid = new_pid(broker)
    send(broker, pid, 0, 0, "x")
    first = send(broker, pid, 0, 1, "a", "b")
    send(broker, pid, 0, 3, "c")
    again = send(broker, pid, 0, 1, "a", "b")
    assert again.duplicate
    assert (again.base_offset, again.last_offset, again.log_append_time_ms) == (
        first.base_offset,
        first.last_offset,
        first.log_append_time_ms,
    )
    assert log_values(broker) == [b"x", b"a", b"b", b"c"]
    assert high_watermark(broker) == 4


def test_a_duplicate_is_recognised_among_the_last_five_batches_only(broker, topic):
    pid = new_pid(broker)
    results = [send(broker, pid, 0, i, f"v{i}") for i in range(6)]
    for i in range(1, 6):
        dup = send(broker, pid, 0, i, f"v{i}")
        assert dup.duplicate and dup.base_offset == results[i].base_offset
    err = error_of(send, broker, pid, 0, 0, "v0")
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert high_watermark(broker) == 6


@pytest.mark.parametrize(("seq", "count"), [(3, 1), (7, 2), (0, 2), (1, 2), (2147483647, 1)])
def test_gaps_and_rewinds_are_out_of_order(broker, topic, seq, count):
    pid = new_pid(broker)
    send(broker, pid, 0, 0, "a")
    send(broker, pid, 0, 1, "b")
    err = error_of(send, broker, pid, 0, seq, *["x"] * count)
    assert err.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert err.code.http_status == 409
    assert "expected 2" in err.message
    assert log_values(broker) == [b"a", b"b"]


def test_a_rewind_overlapping_a_batch_is_out_of_order(broker, topic):
    pid = new_pid(broker)
    send(broker, pid, 0, 0, "a", "b", "c")
    assert error_of(send, broker, pid, 0, 1, "b", "c").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_of(send, broker, pid, 0, 0, "a", "b").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert high_watermark(broker) == 3


def test_unknown_producer_must_start_at_sequence_zero(broker, topic):
    pid = new_pid(broker)
    err = error_of(send, broker, pid, 0, 3, "a")
    assert err.code is ErrorCode.UNKNOWN_PRODUCER_ID
    assert high_watermark(broker) == 0


def test_sequences_are_per_partition(broker, topic):
    pid = new_pid(broker)
    send(broker, pid, 0, 0, "a", "b", partition=0)
    assert send(broker, pid, 0, 0, "c", partition=1).base_offset == 0
    assert error_of(send, broker, pid, 0, 2, "d", partition=1).code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert send(broker, pid, 0, 2, "d", partition=0).base_offset == 2


def test_producers_do_not_share_sequences(broker, topic):
    p1, p2 = new_pid(broker), new_pid(broker)
    assert p1 != p2
    send(broker, p1, 0, 0, "a")
    send(broker, p2, 0, 0, "b")  # not a duplicate of p1's batch
    assert log_values(broker) == [b"a", b"b"]


def test_the_sequence_wraps_after_the_maximum(broker, topic):
    pid = new_pid(broker)
    with broker.db.transaction() as conn:  # a producer that already sent 2**31 - 2 records here
        conn.execute(
            text(
                "INSERT INTO txlog.producer_partitions (topic, partition, producer_id, producer_epoch, batches, last_timestamp) "
                "VALUES ('t', 0, :pid, 0, CAST(:b AS jsonb), now())"
            ),
            {"pid": pid, "b": "[[2147483640, 2147483645, 0, 5, 0]]"},
        )
    wrap = send(broker, pid, 0, 2147483646, "w0", "w1", "w2")
    assert (wrap.base_offset, wrap.last_offset) == (0, 2)
    assert [r.sequence for r in fetch_service.fetch(broker, "t", 0, 0).records] == [2147483646, 2147483647, 0]
    assert send(broker, pid, 0, 2147483646, "w0", "w1", "w2").duplicate
    assert send(broker, pid, 0, 1, "after").base_offset == 3
    assert send(broker, pid, 0, 1, "after").duplicate
    assert error_of(send, broker, pid, 0, 3, "gap").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# --- epochs ---------------------------------------------------------------------------------------


def test_a_lower_epoch_is_fenced_and_a_higher_one_starts_at_zero(broker, topic):
    pid = new_pid(broker)
    send(broker, pid, 3, 0, "a")
    send(broker, pid, 3, 1, "b")
    err = error_of(send, broker, pid, 2, 2, "old")
    assert (err.code, err.details["reason"], err.details["current_epoch"]) == (ErrorCode.PRODUCER_FENCED, "newer_epoch", 3)
    assert error_of(send, broker, pid, 4, 2, "new").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert send(broker, pid, 4, 0, "new").base_offset == 2
    assert error_of(send, broker, pid, 3, 2, "zombie").code is ErrorCode.PRODUCER_FENCED
    assert log_values(broker) == [b"a", b"b", b"new"]


# --- durability, expiry ---------------------------------------------------------------------------


def test_producer_state_survives_a_new_broker(db_url, broker, topic):
    pid = new_pid(broker)
    first = send(broker, pid, 0, 0, "a", "b")
    broker.db.dispose()
    restarted = make_broker(db_url)
    try:
        again = send(restarted, pid, 0, 0, "a", "b")
        assert again.duplicate and (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset)
        assert error_of(send, restarted, pid, 0, 5, "gap").code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert send(restarted, pid, 0, 2, "c").base_offset == 2
        assert new_pid(restarted) > pid  # producer ids are never handed out twice
    finally:
        restarted.db.dispose()


def test_producer_state_expires_after_producer_id_expiration(db_url, clock):
    expiring = make_broker(db_url, clock, producer_id_expiration_ms=60_000)
    try:
        topics.create_topic(expiring, "t", 1)
        idle, busy = new_pid(expiring), new_pid(expiring)
        send(expiring, idle, 0, 0, "idle")
        clock.advance(40_000)
        send(expiring, busy, 0, 0, "busy")
        clock.advance(20_001)  # idle: 60.001 s since its last batch; busy: 20.001 s
        report = sweeper.sweep(expiring)
        assert report.producer_states_expired == 1
        with expiring.db.read() as conn:
            assert storage_helpers.producer_state_get(conn, "t", 0, idle) is None
            assert storage_helpers.producer_state_get(conn, "t", 0, busy) is not None
        # forgotten: a retry is no longer recognised, and the producer must start over at 0
        assert error_of(send, expiring, idle, 0, 1, "next").code is ErrorCode.UNKNOWN_PRODUCER_ID
        assert not send(expiring, idle, 0, 0, "idle").duplicate
        assert send(expiring, busy, 0, 0, "busy").duplicate
        assert sweeper.sweep(expiring).producer_states_expired == 0
    finally:
        expiring.db.dispose()


def test_producer_state_of_an_open_transaction_does_not_expire(db_url, clock):
    expiring = make_broker(db_url, clock, producer_id_expiration_ms=1_000, default_transaction_timeout_ms=900_000)
    try:
        topics.create_topic(expiring, "t", 1)
        p = transactions.init_producer_id(expiring, "tx")
        send(expiring, p.producer_id, p.producer_epoch, 0, "open", tid="tx")
        clock.advance(5_000)
        assert sweeper.sweep(expiring).producer_states_expired == 0
        with expiring.db.read() as conn:
            assert storage_helpers.producer_state_get(conn, "t", 0, p.producer_id) is not None
        assert send(expiring, p.producer_id, p.producer_epoch, 0, "open", tid="tx").duplicate
    finally:
        expiring.db.dispose()


# --- concurrency ----------------------------------------------------------------------------------


def test_one_batch_sent_concurrently_lands_exactly_once(broker, topic):
    """20 copies of one batch at once (a client retrying over several connections): one append,
    19 duplicates answering its offsets. The pool (5 + 20 overflow) serves every sender at once."""
    for round_ in range(3):
        pid = new_pid(broker)
        seq = 0
        if round_:  # also when the producer already has state on the partition
            send(broker, pid, 0, 0, "first")
            seq = 1
        start = threading.Barrier(20)

        def attempt() -> produce_service.ProduceResult:
            start.wait()
            return send(broker, pid, 0, seq, "same", "batch")

        with ThreadPoolExecutor(20) as pool:
            results = [f.result() for f in [pool.submit(attempt) for _ in range(20)]]
        originals = [r for r in results if not r.duplicate]
        assert len(originals) == 1, results
        assert {(r.base_offset, r.last_offset) for r in results} == {(originals[0].base_offset, originals[0].last_offset)}
    values = log_values(broker)
    assert values == [b"same", b"batch", b"first", b"same", b"batch", b"first", b"same", b"batch"]
    assert high_watermark(broker) == 8


def test_pipelined_batches_sent_concurrently_all_land_in_sequence_order(broker, topic):
    """Batches 0..9 of one producer sent at once: each either lands or is refused because it is
    ahead of the log (the client resends it); in the end every batch landed exactly once, in
    sequence order. A batch that arrives before batch 0 finds a producer with no state on the
    partition (UNKNOWN_PRODUCER_ID); one that arrives after a gap is OUT_OF_ORDER_SEQUENCE_NUMBER."""
    pid = new_pid(broker)
    ahead_of_the_log = {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID}
    failed = threading.Event()  # one sender failing stops the others: the batches after it never land
    deadline = time.monotonic() + 60

    def until_landed(i: int) -> produce_service.ProduceResult:
        try:
            while not failed.is_set() and time.monotonic() < deadline:
                try:
                    return send(broker, pid, 0, i, f"v{i}")
                except TxlogError as exc:
                    assert exc.code in ahead_of_the_log, exc
                    time.sleep(0.005)  # a client's retry backoff
            raise AssertionError(f"batch {i} did not land")
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(until_landed, range(10)))
    assert [r.base_offset for r in results] == list(range(10))
    assert log_values(broker) == [f"v{i}".encode() for i in range(10)]


def test_producer_ids_are_unique_across_concurrent_inits(broker):
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: transactions.init_producer_id(broker, None), range(200)))
    assert all(p.producer_epoch == 0 for p in ids)
    assert len({p.producer_id for p in ids}) == 200


# --- idempotent and transactional use of one producer id -----------------------------------------


def test_idempotent_produce_while_the_producer_has_an_open_transaction_is_invalid_txn_state(broker, topic):
    p = transactions.init_producer_id(broker, "tx")
    pid, epoch = p.producer_id, p.producer_epoch
    send(broker, pid, epoch, 0, "in-txn", tid="tx")
    err = error_of(send, broker, pid, epoch, 1, "outside")
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert "tx" in err.message
    err = error_of(send, broker, pid, epoch, 0, "other-partition", partition=1)
    assert err.code is ErrorCode.INVALID_TXN_STATE
    assert log_values(broker) == [b"in-txn"]
    assert high_watermark(broker, 1) == 0
    transactions.end_txn(broker, "tx", pid, epoch, "commit")
    assert log_values(broker, 0) == [b"in-txn"]


def test_a_retried_transactional_batch_is_a_duplicate(broker, topic):
    p = transactions.init_producer_id(broker, "tx")
    first = send(broker, p.producer_id, p.producer_epoch, 0, "a", "b", tid="tx")
    again = send(broker, p.producer_id, p.producer_epoch, 0, "a", "b", tid="tx")
    assert again.duplicate and again.base_offset == first.base_offset
    assert high_watermark(broker) == 2
