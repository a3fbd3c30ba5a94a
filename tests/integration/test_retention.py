"""Retention against a real PostgreSQL: DeleteRecords, retention.ms and retention.bytes move the log
start (never past the last stable offset); the sweeper deletes what lies below it in bounded
batches, several sweepers at once; fetch, read_committed, the views, the admin browser and the
Spark reader's snapshot all start at the new log start; topic config validation; and the space
deleted records leave is reused (measured)."""

from __future__ import annotations

import os
import threading
import time

import psycopg
from sqlalchemy import text

from app.domain.groups.offsets import GroupOffset
from app.domain.log import PartitionStatus
from app.domain.records import NewRecord, record_size
from app.domain.topic_configs import MAX_LONG
from app.errors import ErrorCode
from app.services import Broker, groups, retention, sweeper, topics
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services.inspect.topics import BROWSE_MODES, browse_partition
from app.services.produce import ProduceRequest
from app.storage import log as log_store
from app.storage import retention as retention_store
from app.storage.db import libpq_url
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer, error_of

HOUR = 3_600_000


def produce(broker: Broker, topic: str, partition: int, *values: str, ts: int | None = None) -> produce_service.ProduceResult:
    return produce_service.produce(
        broker, topic, partition, ProduceRequest([NewRecord(None, v.encode(), (), ts) for v in values])
    )


def fill(broker: Broker, topic: str, partition: int, n: int, batch: int = 500) -> None:
    for i in range(0, n, batch):
        produce(broker, topic, partition, *(f"r{j}" for j in range(i, min(n, i + batch))))


def status(broker: Broker, topic: str, partition: int = 0) -> PartitionStatus:
    with broker.db.read() as conn:
        return log_store.partition_status(conn, topic, partition)


def log_start(broker: Broker, topic: str, partition: int = 0) -> int:
    return status(broker, topic, partition).log_start_offset


def stored(broker: Broker, topic: str, partition: int = 0) -> tuple[int, int, int, int]:
    """(stored start offset, lowest stored offset, highest stored offset, stored records)."""
    with broker.db.read() as conn:
        start = conn.execute(
            text("SELECT stored_start_offset FROM txlog.partitions WHERE topic = :t AND partition = :p"),
            {"t": topic, "p": partition},
        ).scalar_one()
        lo, hi, n = conn.execute(
            text('SELECT min("offset"), max("offset"), count(*) FROM txlog.records WHERE topic = :t AND partition = :p'),
            {"t": topic, "p": partition},
        ).one()
    return start, lo, hi, n


def aborted_ranges(broker: Broker, topic: str, partition: int = 0) -> list[tuple[int, int]]:
    with broker.db.read() as conn:
        rows = conn.execute(
            text("SELECT first_offset, last_offset FROM txlog.aborted_txns WHERE topic = :t AND partition = :p ORDER BY 1"),
            {"t": topic, "p": partition},
        )
        return [(r[0], r[1]) for r in rows]


def values_from(broker: Broker, topic: str, offset: int, isolation: str = "read_committed") -> list[tuple[int, bytes | None]]:
    """Every record a reader sees from ``offset``, following next_offset with small fetches."""
    out: list[tuple[int, bytes | None]] = []
    for _ in range(1000):
        got = fetch_service.fetch(broker, topic, 0, offset, max_records=2, isolation_level=isolation)  # type: ignore[arg-type]
        out += [(r.offset, r.value) for r in got.records]
        offset = got.next_offset
        if offset >= (got.last_stable_offset if isolation == "read_committed" else got.high_watermark):
            return out
    raise AssertionError("the reader did not reach the end")


def sweep(broker: Broker) -> sweeper.SweepReport:
    report = sweeper.sweep(broker, budget_s=30)
    assert report.failed == 0
    return report


# --- DeleteRecords ------------------------------------------------------------------------------------


def test_delete_records_moves_the_log_start(broker):
    topics.create_topic(broker, "t", 2)
    produce(broker, "t", 0, *"abcdefghij")
    got = retention.delete_records(broker, "t", 0, 4)
    assert (got.topic, got.partition, got.log_start_offset) == ("t", 0, 4)
    assert (log_start(broker, "t", 0), log_start(broker, "t", 1)) == (4, 0)
    # Below the current log start, or at it: nothing changes, the answer is the log start.
    assert retention.delete_records(broker, "t", 0, 2).log_start_offset == 4
    assert retention.delete_records(broker, "t", 0, 4).log_start_offset == 4
    assert retention.delete_records(broker, "t", 0, 0).log_start_offset == 4
    assert log_start(broker, "t", 0) == 4
    # Up to the high watermark (the LSO without open transactions): an empty log that starts there.
    assert retention.delete_records(broker, "t", 0, 10).log_start_offset == 10
    s = status(broker, "t", 0)
    assert (s.log_start_offset, s.high_watermark, s.last_stable_offset) == (10, 10, 10)
    assert fetch_service.fetch(broker, "t", 0, 10).records == []
    # The log goes on from there.
    assert produce(broker, "t", 0, "k").base_offset == 10
    assert produce(broker, "t", 0, "l").log_start_offset == 10


def test_delete_records_minus_one_means_the_last_stable_offset(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, "a", "b", "c")
    assert retention.delete_records(broker, "t", 0, -1).log_start_offset == 3
    open_txn = Producer(broker, "tx")
    open_txn.send("t", 0, "d")  # offset 3, open: the LSO stays at 3
    produce(broker, "t", 0, "e")
    assert retention.delete_records(broker, "t", 0, -1).log_start_offset == 3
    open_txn.commit()  # marker at 5, LSO = HW = 6
    assert retention.delete_records(broker, "t", 0, -1).log_start_offset == 6


def test_delete_records_past_the_last_stable_offset_is_refused(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, "a", "b")
    open_txn = Producer(broker, "tx")
    open_txn.send("t", 0, "c", "d")  # offsets 2, 3: the LSO is 2
    produce(broker, "t", 0, "e")  # HW 5
    s = status(broker, "t")
    assert (s.log_start_offset, s.last_stable_offset, s.high_watermark) == (0, 2, 5)
    for offset in (3, 5, 6, MAX_LONG):  # past the LSO, at the HW, past the HW
        err = error_of(retention.delete_records, broker, "t", 0, offset)
        assert err.code is ErrorCode.OFFSET_OUT_OF_RANGE
        assert err.details == {"log_start_offset": 0, "last_stable_offset": 2, "high_watermark": 5}
    assert log_start(broker, "t") == 0
    assert retention.delete_records(broker, "t", 0, 2).log_start_offset == 2  # up to the LSO is fine
    open_txn.commit()  # marker at 5: LSO = HW = 6
    assert retention.delete_records(broker, "t", 0, 6).log_start_offset == 6
    assert error_of(retention.delete_records, broker, "t", 0, 7).code is ErrorCode.OFFSET_OUT_OF_RANGE


def test_delete_records_of_an_unknown_partition_or_a_negative_offset(broker):
    topics.create_topic(broker, "t", 1)
    for topic, partition in [("missing", 0), ("t", 1), ("t", -1)]:
        assert error_of(retention.delete_records, broker, topic, partition, 0).code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error_of(retention.delete_records, broker, "t", 0, -2).code is ErrorCode.OFFSET_OUT_OF_RANGE


# --- retention.ms -----------------------------------------------------------------------------------


def test_retention_ms_moves_the_log_start_past_old_records(clocked_broker, clock):
    b, now = clocked_broker, clock.now_ms
    topics.create_topic(b, "t", 2)
    produce(b, "t", 0, *"abcde", ts=now - 10 * HOUR)  # 0-4
    produce(b, "t", 0, *"fghij", ts=now - 1 * HOUR)  # 5-9
    produce(b, "t", 0, "k", "l")  # 10-11, at append time: now
    produce(b, "t", 1, "x", ts=now - 10 * HOUR)
    sweep(b)
    assert (log_start(b, "t", 0), log_start(b, "t", 1)) == (0, 0)  # no limit: kept forever
    topics.alter_topic_config(b, "t", {"retention.ms": 2 * HOUR})
    report = sweep(b)
    assert report.log_start_moved == 2
    assert (log_start(b, "t", 0), log_start(b, "t", 1)) == (5, 1)
    clock.advance(2 * HOUR)  # 5-9 are 3 h old now; 10-11 exactly 2 h: kept (Kafka deletes what is older)
    sweep(b)
    assert log_start(b, "t", 0) == 10
    clock.advance(1)
    sweep(b)
    assert log_start(b, "t", 0) == 12
    assert stored(b, "t", 0)[0] == 12 and stored(b, "t", 0)[3] == 0  # and all of it deleted


def test_retention_ms_keeps_every_record_after_a_young_one(clocked_broker, clock):
    """Producers choose timestamps, which need not grow with offsets: as Kafka keeps a segment while
    its newest record is young, an old record after a young one is kept."""
    b, now = clocked_broker, clock.now_ms
    topics.create_topic(b, "t", 1, {"retention.ms": HOUR})
    old, young = now - 5 * HOUR, now
    for ts in (old, old, young, old, old, young, old):
        produce(b, "t", 0, "v", ts=ts)
    sweep(b)
    assert log_start(b, "t") == 2
    topics.create_topic(b, "u", 1, {"retention.ms": HOUR})
    for ts in (young, old, old):
        produce(b, "u", 0, "v", ts=ts)
    sweep(b)
    assert log_start(b, "u") == 0


def test_retention_ms_reads_a_long_old_log_in_windows(clocked_broker, clock, monkeypatch):
    b, now = clocked_broker, clock.now_ms
    monkeypatch.setattr(retention, "TIME_SCAN_WINDOW", 7)
    topics.create_topic(b, "t", 1, {"retention.ms": HOUR})
    produce(b, "t", 0, *(f"{i}" for i in range(30)), ts=now - 2 * HOUR)  # 0-29, three full windows and more
    produce(b, "t", 0, "young", ts=now)  # 30
    produce(b, "t", 0, "old again", ts=now - 2 * HOUR)  # 31
    sweep(b)
    assert log_start(b, "t") == 30


def test_retention_ms_never_passes_the_last_stable_offset(clocked_broker, clock):
    b, now = clocked_broker, clock.now_ms
    topics.create_topic(b, "t", 1, {"retention.ms": HOUR})
    produce(b, "t", 0, "a", "b", "c", ts=now - 5 * HOUR)  # 0-2
    open_txn = Producer(b, "tx")
    open_txn.send("t", 0, "d")  # 3, open: the LSO
    produce(b, "t", 0, "e", ts=now - 5 * HOUR)  # 4
    clock.advance(5 * HOUR)  # everything is old now (retention alone: the sweeper would time the transaction out)
    assert retention.apply(b, 30).failed == 0
    s = status(b, "t")
    assert (s.log_start_offset, s.last_stable_offset) == (3, 3)
    assert [v for _, v in values_from(b, "t", 3, "read_uncommitted")] == [b"d", b"e"]  # the open transaction is whole
    open_txn.commit()  # marker at 5, appended now: young
    assert retention.apply(b, 30).failed == 0
    assert log_start(b, "t") == 5


def test_retention_ms_larger_than_the_clock_keeps_everything(clocked_broker, clock):
    b = clocked_broker
    topics.create_topic(b, "t", 1, {"retention.ms": MAX_LONG})
    topics.create_topic(b, "u", 1, {"retention.ms": clock.now_ms + HOUR})
    for t in ("t", "u"):
        produce(b, t, 0, "a", ts=0)
    assert sweep(b).log_start_moved == 0
    assert log_start(b, "t") == log_start(b, "u") == 0


# --- retention.bytes --------------------------------------------------------------------------------


def test_retention_bytes_counts_key_value_and_headers_exactly(broker):
    topics.create_topic(broker, "t", 1)
    # 1 + 9 + (1 + 2) + (2 + 0) = 15 bytes each ("é" is two bytes in UTF-8; a null value counts 0)
    record = NewRecord(b"k", b"123456789", (("h", b"vv"), ("é", None)))
    assert record.size() == record_size(b"k", b"123456789", record.headers) == 15
    for _ in range(10):
        produce_service.produce(broker, "t", 0, ProduceRequest([record]))  # offsets 0-9, positions 0, 15, ... 135
    with broker.db.read() as conn:
        next_position = conn.execute(text("SELECT next_position FROM txlog.partitions WHERE topic = 't'")).scalar_one()
    assert next_position == 150
    for limit, start in [(150, 0), (1000, 0), (149, 1), (45, 7), (44, 8), (30, 8), (15, 9), (14, 10), (0, 10)]:
        topics.alter_topic_config(broker, "t", {"retention.bytes": limit})
        sweep(broker)
        assert log_start(broker, "t") == start, limit


def test_retention_bytes_leaves_markers_out_and_never_passes_the_last_stable_offset(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, "0123456789", "0123456789")  # 0-1: 20 bytes
    t1 = Producer(broker, "tx1")
    t1.send("t", 0, "0123456789")  # 2
    t1.commit()  # 3: a marker, 0 bytes
    t2 = Producer(broker, "tx2")
    t2.send("t", 0, "0123456789")  # 4, open
    produce(broker, "t", 0, "0123456789")  # 5
    with broker.db.read() as conn:
        positions = [r[0] for r in conn.execute(text("SELECT position FROM txlog.records WHERE topic = 't' ORDER BY \"offset\""))]
    assert positions == [0, 10, 20, 33, 33, 46]  # a transactional record's key is its transactional id: 3 bytes
    topics.alter_topic_config(broker, "t", {"retention.bytes": 23})  # 56 - 33: the log fits from the marker at 3
    sweep(broker)
    assert log_start(broker, "t") == 3
    topics.alter_topic_config(broker, "t", {"retention.bytes": 0})
    sweep(broker)
    assert log_start(broker, "t") == 4  # the LSO: the open transaction keeps its records
    t2.commit()  # marker at 6: LSO = HW = 7
    sweep(broker)
    assert log_start(broker, "t") == 6  # the marker: 0 bytes, nothing over the limit


def test_broker_defaults_apply_unless_the_topic_says_otherwise(db_url):
    b = make_broker(db_url, log_retention_bytes=10)
    try:
        topics.create_topic(b, "default", 1)
        topics.create_topic(b, "keep", 1, {"retention.bytes": -1})
        topics.create_topic(b, "own", 1, {"retention.bytes": "20"})
        for t in ("default", "keep", "own"):
            produce(b, t, 0, *(["0123456789"] * 5))
        sweep(b)
        assert [log_start(b, t) for t in ("default", "keep", "own")] == [4, 0, 3]
        topics.alter_topic_config(b, "keep", {"retention.bytes": None})  # removed: the default applies
        sweep(b)
        assert log_start(b, "keep") == 4
    finally:
        b.db.dispose()


def test_a_config_stored_before_validation_does_not_stop_retention(broker):
    topics.create_topic(broker, "bad", 1)
    topics.create_topic(broker, "good", 1, {"retention.bytes": 10})
    for t in ("bad", "good"):
        produce(broker, t, 0, *(["0123456789"] * 3))
    with broker.db.transaction() as conn:
        conn.execute(
            text("""UPDATE txlog.topics SET config = '{"retention.ms": "7d", "retention.bytes": 1.5}' WHERE name = 'bad'""")
        )
    sweep(broker)
    assert (log_start(broker, "bad"), log_start(broker, "good")) == (0, 2)


def test_one_partition_that_cannot_be_locked_does_not_stop_the_others(db_url):
    b = make_broker(db_url, db_lock_timeout_ms=200)
    try:
        topics.create_topic(b, "t", 2, {"retention.bytes": 10})
        for p in (0, 1):
            produce(b, "t", p, *(["0123456789"] * 3))
        with b.db.transaction() as conn:
            retention_store.partition_lock(conn, "t", 0)  # an append in flight, holding partition 0's lock
            report = retention.apply(b, 10)
        assert report.failed == 1 and report.log_start_moved == 1
        assert (log_start(b, "t", 0), log_start(b, "t", 1)) == (0, 2)
        assert retention.apply(b, 10).log_start_moved == 1  # the next round does it
        assert log_start(b, "t", 0) == 2
    finally:
        b.db.dispose()


# --- deleting below the log start -------------------------------------------------------------------


def test_trim_deletes_below_the_log_start_in_bounded_batches(broker, monkeypatch):
    topics.create_topic(broker, "t", 2)
    fill(broker, "t", 0, 3000)
    fill(broker, "t", 1, 10)
    retention.delete_records(broker, "t", 0, 2500)
    retention.delete_records(broker, "t", 1, 4)
    assert stored(broker, "t", 0) == (0, 0, 2999, 3000)  # nothing deleted yet: readers see the log start at once
    batches: list[tuple[str, int, int, int, int]] = []
    log_trim = retention_store.log_trim

    def spy(conn, topic, partition, batch):  # type: ignore[no-untyped-def]
        deleted = log_trim(conn, topic, partition, batch)
        txid = conn.execute(text("SELECT txid_current()")).scalar_one()
        batches.append((topic, partition, deleted, txid, stored(broker, topic, partition)[0]))  # as others see it meanwhile
        return deleted

    monkeypatch.setattr(retention_store, "log_trim", spy)
    report = sweep(broker)
    assert report.records_deleted == 2504
    mine = [(t, p, n) for t, p, n, _, _ in batches if n]
    assert sorted(mine) == [("t", 0, 500), ("t", 0, 1000), ("t", 0, 1000), ("t", 1, 4)]
    assert len({txid for *_, txid, _ in batches}) == len(batches)  # each batch its own database transaction
    # Before each batch commits, the others still see the stored start where the last one left it.
    assert [s for t, p, n, _, s in batches if (t, p) == ("t", 0) and n] == [0, 1000, 2000]
    assert stored(broker, "t", 0) == (2500, 2500, 2999, 500)
    assert stored(broker, "t", 1) == (4, 4, 9, 6)
    assert sweep(broker).records_deleted == 0


def test_trim_stops_when_its_time_is_up_and_goes_on_next_round(broker):
    topics.create_topic(broker, "t", 1)
    fill(broker, "t", 0, 2500)
    retention.delete_records(broker, "t", 0, -1)
    report = retention.RetentionReport()
    retention.trim(broker, report, time.monotonic())  # no time at all
    assert report.records_deleted == 0
    assert stored(broker, "t")[0] == 0
    assert retention.apply(broker, 30).records_deleted == 2500
    assert stored(broker, "t") == (2500, None, None, 0)


def test_trim_deletes_aborted_ranges_below_the_log_start_and_keeps_a_straddling_one(broker):
    topics.create_topic(broker, "t", 1)
    a = Producer(broker, "a")
    a.send("t", 0, "a0", "a1")  # 0-1
    a.abort()  # ABORT at 2
    b = Producer(broker, "b")
    b.send("t", 0, "b0")  # 3: b's first record
    produce(broker, "t", 0, "p4")  # 4
    b.send("t", 0, "b1")  # 5
    produce(broker, "t", 0, "p6")  # 6
    b.abort()  # ABORT at 7
    produce(broker, "t", 0, "p8")  # 8
    assert aborted_ranges(broker, "t") == [(0, 2), (3, 7)]
    retention.delete_records(broker, "t", 0, 4)  # b's first record is below the log start
    sweep(broker)
    assert stored(broker, "t") == (4, 4, 8, 5)
    assert aborted_ranges(broker, "t") == [(3, 7)]  # a's range is gone with its marker; b's stays
    # read_committed still hides b1 (5), whose transaction began below the log start.
    assert values_from(broker, "t", 4) == [(4, b"p4"), (6, b"p6"), (8, b"p8")]
    assert values_from(broker, "t", 4, "read_uncommitted") == [(4, b"p4"), (5, b"b1"), (6, b"p6"), (8, b"p8")]
    with psycopg.connect(libpq_url(broker.db.url)) as conn:
        view = conn.execute("SELECT \"offset\" FROM txlog.committed_records WHERE topic = 't' ORDER BY 1").fetchall()
    assert [o for (o,) in view] == [4, 6, 8]
    page = browse_partition(broker, "t", 0, "all", offset=0)
    assert [(r.offset, r.control_type, r.aborted and r.control_type is None) for r in page.records] == [
        (4, None, False),
        (5, None, True),
        (6, None, False),
        (7, 0, False),
        (8, None, False),
    ]
    retention.delete_records(broker, "t", 0, 8)  # past b's marker: its range goes too
    sweep(broker)
    assert aborted_ranges(broker, "t") == []
    assert values_from(broker, "t", 8) == [(8, b"p8")]


# --- what readers see -----------------------------------------------------------------------------


def test_every_reader_starts_at_the_new_log_start(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, *(f"v{i}" for i in range(6)))  # 0-5
    done = Producer(broker, "done")
    done.send("t", 0, "c6", "c7")
    done.commit()  # COMMIT at 8
    groups.offset_commit(broker, "g", [GroupOffset("t", 0, 1, "")])  # a consumer far behind
    retention.delete_records(broker, "t", 0, 3)

    def check() -> None:
        # fetch: below the start is OFFSET_OUT_OF_RANGE naming the new start; at the start it works
        for isolation in ("read_committed", "read_uncommitted"):
            err = error_of(fetch_service.fetch, broker, "t", 0, 2, isolation_level=isolation)
            assert err.code is ErrorCode.OFFSET_OUT_OF_RANGE
            assert err.details["log_start_offset"] == 3
            got = fetch_service.fetch(broker, "t", 0, 3, isolation_level=isolation)
            assert [r.offset for r in got.records] == [3, 4, 5, 6, 7] and got.log_start_offset == 3
        assert error_of(fetch_service.fetch, broker, "t", 0, 0).details == {"log_start_offset": 3, "high_watermark": 9}
        # the views
        with psycopg.connect(libpq_url(broker.db.url)) as conn:
            committed = conn.execute("SELECT \"offset\" FROM txlog.committed_records WHERE topic = 't' ORDER BY 1").fetchall()
            s = conn.execute(
                "SELECT log_start_offset, high_watermark, last_stable_offset FROM txlog.partition_status WHERE topic = 't'"
            ).fetchone()
        assert [o for (o,) in committed] == [3, 4, 5, 6, 7]
        assert s == (3, 9, 9)
        # the admin browser, in every mode, however it is asked
        for mode in BROWSE_MODES:
            tail = browse_partition(broker, "t", 0, mode)
            assert tail.records[0].offset == 3 and tail.older is None and tail.status.log_start_offset == 3
            assert browse_partition(broker, "t", 0, mode, offset=0).records[0].offset == 3
            assert browse_partition(broker, "t", 0, mode, before=2).records == []
            assert browse_partition(broker, "t", 0, mode, offset=4, limit=1).older == 4
            assert browse_partition(broker, "t", 0, mode, before=4, limit=5).records[0].offset == 3
        # the Spark reader's snapshot (no Spark needed to fix the offsets)
        from spark.reader import snapshot

        url = libpq_url(broker.db.url)
        assert snapshot(url, "t").start_offsets == {0: 3}
        assert snapshot(url, "t", start_offsets={0: 0}).start_offsets == {0: 3}
        assert snapshot(url, "t", group_id="g").start_offsets == {0: 3}  # a group offset below the start
        assert snapshot(url, "t", isolation_level="read_uncommitted").ranges[0].span == 6

    check()  # the log start moved; nothing deleted yet
    assert sweep(broker).records_deleted == 3
    check()  # and after the sweeper deleted what lies below


# --- several sweepers at once -----------------------------------------------------------------------


def test_a_partition_being_trimmed_is_left_to_its_sweeper(broker):
    topics.create_topic(broker, "t", 1)
    fill(broker, "t", 0, 2500)
    retention.delete_records(broker, "t", 0, 2500)
    with broker.db.transaction() as conn:
        assert retention_store.log_trim(conn, "t", 0, 1000) == 1000  # a sweeper mid-batch
        with broker.db.transaction() as other:
            assert retention_store.log_trim(other, "t", 0, 1000) is None
        report = retention.RetentionReport()
        retention.trim(broker, report, time.monotonic() + 10)  # a whole round of another sweeper
        assert report.records_deleted == 0
    assert stored(broker, "t")[0] == 1000
    assert retention.apply(broker, 30).records_deleted == 1500


def test_concurrent_sweepers_appends_and_delete_records_never_lose_a_record_above_the_log_start(db_url):
    """Two brokers (each its own connection pool, as two hosts) sweep in a loop while producers
    append and DeleteRecords moves the log start step by step: every record at or above the log
    start survives, everything below is deleted once, and no sweeper fails."""
    brokers = [make_broker(db_url) for _ in range(3)]
    b = brokers[0]
    try:
        topics.create_topic(b, "t", 1)
        topics.create_topic(b, "s", 1, {"retention.bytes": 20_000})  # by size, as it grows
        fill(b, "t", 0, 4000)
        fill(b, "s", 0, 4000)
        stop = threading.Event()
        errors: list[BaseException] = []
        reports: list[retention.RetentionReport] = []

        def guarded(fn):  # type: ignore[no-untyped-def]
            def run() -> None:
                try:
                    fn()
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                    stop.set()

            return run

        def sweeping(broker: Broker) -> None:
            while not stop.is_set():
                r = retention.apply(broker, 5)
                reports.append(r)
                assert r.failed == 0

        def producing() -> None:
            i = 0
            while not stop.is_set():
                for topic in ("t", "s"):
                    produce(b, topic, 0, *(f"n{i}-{j}" for j in range(50)))
                i += 1

        def deleting() -> None:
            for offset in range(500, 4001, 350):
                retention.delete_records(b, "t", 0, offset)
                time.sleep(0.05)

        threads = [
            threading.Thread(target=guarded(f)) for f in (lambda: sweeping(brokers[1]), lambda: sweeping(brokers[2]), producing)
        ]
        for t in threads:
            t.start()
        guarded(deleting)()
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors
        reports.append(retention.apply(b, 30))
        for topic in ("t", "s"):
            s = status(b, topic)
            start, lo, hi, n = stored(b, topic)
            assert start == s.log_start_offset == lo
            assert hi == s.high_watermark - 1 and n == s.high_watermark - s.log_start_offset  # dense, nothing missing
        assert log_start(b, "t") == 4000 and log_start(b, "s") > 0
        # every record below a log start deleted exactly once
        assert sum(r.records_deleted for r in reports) == log_start(b, "t") + log_start(b, "s")
    finally:
        for x in brokers:
            x.db.dispose()


# --- topic config -----------------------------------------------------------------------------------


def test_retention_config_is_validated_at_create(broker):
    for config in (
        {"retention.ms": "1h"},
        {"retention.bytes": -2},
        {"retention.ms": 1.5},
        {"retention.bytes": True},
        {"x": "\x00"},
    ):
        err = error_of(topics.create_topic, broker, "t", 1, config)
        assert err.code is ErrorCode.INVALID_CONFIG and err.code.http_status == 400
    assert topics.list_topics(broker) == []  # nothing created
    topics.create_topic(broker, "t", 1, {"retention.ms": "3600000", "retention.bytes": None, "cleanup.policy": "delete"})
    assert topics.topic_config(broker, "t") == {"retention.ms": 3600000, "cleanup.policy": "delete"}


def test_alter_topic_config(broker):
    topics.create_topic(broker, "t", 1, {"retention.ms": 1000, "cleanup.policy": "delete"})
    assert topics.alter_topic_config(broker, "t", {"retention.bytes": "2048", "retention.ms": None}) == {
        "cleanup.policy": "delete",
        "retention.bytes": 2048,
    }
    assert topics.topic_config(broker, "t") == {"cleanup.policy": "delete", "retention.bytes": 2048}
    err = error_of(topics.alter_topic_config, broker, "t", {"retention.ms": 5, "retention.bytes": "lots"})
    assert err.code is ErrorCode.INVALID_CONFIG
    assert topics.topic_config(broker, "t") == {"cleanup.policy": "delete", "retention.bytes": 2048}  # unchanged
    assert (
        error_of(topics.alter_topic_config, broker, "missing", {"retention.ms": 5}).code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert error_of(topics.topic_config, broker, "missing").code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# --- disk space -------------------------------------------------------------------------------------


def test_deleted_records_leave_space_the_log_reuses(broker):
    """Fill a partition with 20 MB, keep the last 2 MB (retention.bytes), let the sweeper delete the
    rest, VACUUM the records table as autovacuum would, and write 20 MB again: the table grows by a
    fraction of what the first 20 MB took, because the new records go where the old ones were. A
    second round shows the steady state: the table no longer grows."""
    mb, value_size, batch = 20, 1000, 500  # values below the TOAST threshold: the rows live in the table itself
    n = mb * 1_000_000 // value_size
    url = libpq_url(broker.db.url)

    def sizes() -> tuple[int, int, int]:
        """(table, indexes, total) of txlog.records, in bytes."""
        with psycopg.connect(url) as conn:
            return conn.execute(
                "SELECT pg_relation_size('txlog.records'), pg_indexes_size('txlog.records'), pg_total_relation_size('txlog.records')"
            ).fetchone()

    def write() -> None:
        for _ in range(n // batch):  # random bytes: nothing compresses
            produce_service.produce(
                broker, "big", 0, ProduceRequest([NewRecord(None, os.urandom(value_size)) for _ in range(batch)])
            )

    def vacuum() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM txlog.records")

    topics.create_topic(broker, "big", 1)
    started = time.monotonic()
    empty = sizes()
    write()
    topics.alter_topic_config(broker, "big", {"retention.bytes": 2_000_000})
    rounds = [sizes()]  # after each write of 20 MB; before it, retention to 2 MB, trim and VACUUM
    vacuumed = []
    for i in range(2):
        report = sweep(broker)
        assert report.log_start_moved == 1 and report.records_deleted == (n - 2000 if i == 0 else n)
        assert stored(broker, "big")[3] == 2000
        vacuum()
        vacuumed.append(sizes())
        write()
        rounds.append(sizes())
    growth = [rounds[0][2] - empty[2]] + [after[2] - before[2] for before, after in zip(vacuumed, rounds[1:])]
    mib = 1 << 20

    def shown(s: tuple[int, int, int]) -> str:
        return f"{s[0] / mib:.1f} / {s[1] / mib:.1f} / {s[2] / mib:.1f}"

    print(
        f"\nrecords table, heap / indexes / total in MiB — empty: {shown(empty)}; after {mb} MB: {shown(rounds[0])}; "
        + "; ".join(
            f"retention to 2 MB, trim, VACUUM: {shown(v)}, {mb} MB more: {shown(r)}" for v, r in zip(vacuumed, rounds[1:])
        )
        + f". Growth per {mb} MB written: "
        + ", ".join(f"{g / mib:.1f} MiB" for g in growth)
        + f"; {time.monotonic() - started:.1f} s"
    )
    assert growth[1] < 0.25 * growth[0]  # the second 20 MB mostly went where the first were
    assert growth[2] < 0.1 * growth[0]  # and from then on the table holds steady
    assert time.monotonic() - started < 60
