"""The log as Kafka's wire protocol reads it, through the services on a real PostgreSQL: every
stored row (markers and aborted records included) up to the reader's end, within a byte budget
that always lets the first row through, the aborted transactions a read_committed consumer skips by,
and ListOffsets (log start, reader's end, by timestamp, largest timestamp)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.domain.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    ListedOffset,
    NewRecord,
)
from app.errors import ErrorCode
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services import topics
from app.services.produce import ProduceRequest
from app.storage import retention as retention_store
from tests.integration.test_log import _explain, _statements_of
from tests.integration.test_transactions import Producer, error_of

T0 = 1_700_000_000_000


def plain(broker, topic: str, partition: int, *values: str, ts: int | None = None, headers=()):  # type: ignore[no-untyped-def]
    records = [NewRecord(None, v.encode(), headers, ts) for v in values]
    return produce_service.produce(broker, topic, partition, ProduceRequest(records))


def page(broker, topic: str, offset: int = 0, partition: int = 0, **kwargs):  # type: ignore[no-untyped-def]
    return fetch_service.fetch_log(broker, topic, partition, offset, **kwargs)


def offsets(p) -> list[int]:  # type: ignore[no-untyped-def]
    return [r.offset for r in p.records]


@pytest.fixture
def topic(broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(broker, "w", 2)
    return "w"


# --- what a page holds ---------------------------------------------------------------------------------


def test_a_page_holds_every_stored_row_with_what_a_record_batch_carries(broker, topic):
    headers = (("trace", b"1"), ("bin", b"\x00\xff"), ("trace", None))
    plain(broker, topic, 0, "plain", ts=T0, headers=headers)  # 0
    p = Producer(broker, "tx")
    p.send(topic, 0, "aborted")  # 1
    p.abort()  # 2: ABORT
    p.send(topic, 0, "committed-1", "committed-2")  # 3, 4 (next epoch)
    p.commit()  # 5: COMMIT

    got = page(broker, topic)
    assert offsets(got) == [0, 1, 2, 3, 4, 5]
    assert got.aborted_transactions is None  # read_uncommitted: none, as Kafka
    assert (got.high_watermark, got.last_stable_offset, got.log_start_offset) == (6, 6, 0)
    r0, r1, r2, r3, r4, r5 = got.records
    assert (r0.value, r0.key, r0.headers, r0.timestamp_ms) == (b"plain", None, headers, T0)
    assert (r0.producer_id, r0.producer_epoch, r0.sequence, r0.is_transactional, r0.control_type) == (
        None,
        None,
        None,
        False,
        None,
    )
    assert (r1.value, r1.producer_id, r1.producer_epoch, r1.sequence, r1.is_transactional) == (b"aborted", p.pid, 0, 0, True)
    assert (r2.control_type, r2.key, r2.value, r2.is_transactional, r2.producer_epoch) == (CONTROL_ABORT, None, None, True, 0)
    assert [(r.sequence, r.producer_epoch) for r in (r3, r4)] == [(0, 1), (1, 1)]
    assert r5.control_type == CONTROL_COMMIT and r3.headers == ()
    assert not any(r.aborted for r in got.records)  # not read for read_uncommitted

    committed = page(broker, topic, isolation_level="read_committed")
    assert offsets(committed) == offsets(got)  # aborted records and markers are sent: the consumer skips them
    assert committed.aborted_transactions == [(p.pid, 1)]
    assert [r.offset for r in committed.records if r.aborted] == [1, 2]


def test_read_committed_stops_at_the_last_stable_offset(broker, topic):
    plain(broker, topic, 0, "a")  # 0
    p = Producer(broker, "open")
    p.send(topic, 0, "undecided")  # 1: holds the last stable offset
    plain(broker, topic, 0, "b")  # 2
    got = page(broker, topic, isolation_level="read_committed")
    assert offsets(got) == [0] and (got.high_watermark, got.last_stable_offset) == (3, 1)
    at_lso = page(broker, topic, 1, isolation_level="read_committed")
    assert at_lso.records == [] and at_lso.aborted_transactions == []
    assert offsets(page(broker, topic, 2, isolation_level="read_committed")) == []  # past the LSO, below the HW
    assert offsets(page(broker, topic, 1)) == [1, 2]  # read_uncommitted reads to the high watermark
    assert page(broker, topic, 3).records == []  # at the high watermark: empty, not out of range


def test_offsets_outside_the_log_are_out_of_range(broker, topic):
    plain(broker, topic, 0, "a", "b", "c")
    for offset in (-1, 4):
        err = error_of(page, broker, topic, offset)
        assert (err.code, err.details) == (ErrorCode.OFFSET_OUT_OF_RANGE, {"log_start_offset": 0, "high_watermark": 3})
    with broker.db.transaction() as conn:
        retention_store.log_start_advance(conn, topic, 0, 2)
    assert error_of(page, broker, topic, 1).code is ErrorCode.OFFSET_OUT_OF_RANGE
    got = page(broker, topic, 2)
    assert offsets(got) == [2] and got.log_start_offset == 2
    assert error_of(page, broker, "nope").code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error_of(page, broker, topic, 2, max_bytes=-1).code is ErrorCode.INVALID_REQUEST
    assert error_of(page, broker, topic, 2, max_records=0).code is ErrorCode.INVALID_REQUEST


# --- the byte budget -----------------------------------------------------------------------------------


def test_the_byte_budget_counts_keys_values_and_headers_and_always_lets_the_first_row_through(broker, topic):
    plain(broker, topic, 0, *["x" * 100] * 5)
    assert offsets(page(broker, topic, max_bytes=300)) == [0, 1, 2]  # exactly full
    assert offsets(page(broker, topic, max_bytes=299)) == [0, 1]
    assert offsets(page(broker, topic, max_bytes=1)) == [0]  # the first, larger than the budget
    assert offsets(page(broker, topic, 3, max_bytes=100)) == [3]
    assert offsets(page(broker, topic, 1, max_bytes=10_000)) == [1, 2, 3, 4]
    assert offsets(page(broker, topic, max_records=2)) == [0, 1]
    plain(broker, topic, 1, "h", headers=(("k" * 10, b"v" * 40),))
    plain(broker, topic, 1, "i")
    assert offsets(page(broker, topic, partition=1, max_bytes=51)) == [0]
    assert offsets(page(broker, topic, partition=1, max_bytes=52)) == [0, 1]


def test_markers_and_empty_records_cost_no_bytes_but_count_against_max_records(broker, topic):
    p = Producer(broker, "tx")
    p.send(topic, 0, "x" * 98)  # 0: 100 bytes with its key
    p.commit()  # 1: COMMIT
    plain(broker, topic, 0, "")  # 2
    plain(broker, topic, 0, "y" * 100)  # 3
    assert offsets(page(broker, topic, max_bytes=100)) == [0, 1, 2]  # the marker and the empty record fit
    assert offsets(page(broker, topic, max_bytes=99)) == [0]
    assert offsets(page(broker, topic, 1, max_bytes=1)) == [1, 2]  # from the marker: the first row is, the 100 bytes not
    assert offsets(page(broker, topic, 1, max_bytes=100)) == [1, 2, 3]
    assert offsets(page(broker, topic, 1, max_records=2)) == [1, 2]


def test_each_page_names_the_aborted_transactions_its_rows_belong_to(broker, topic):
    a, b = Producer(broker, "a"), Producer(broker, "b")
    a.send(topic, 0, *[f"a{i}" * 10 for i in range(4)])  # 0-3, 21 bytes each with the key
    b.send(topic, 0, "b0" * 10)  # 4
    a.abort()  # 5: ABORT of a
    b.commit()  # 6: COMMIT of b
    a.send(topic, 0, "a-next" * 4)  # 7 (next epoch)
    a.abort()  # 8

    def aborted(offset: int, max_bytes: int):  # type: ignore[no-untyped-def]
        got = page(broker, topic, offset, max_bytes=max_bytes, isolation_level="read_committed")
        return offsets(got), got.aborted_transactions

    assert aborted(0, 10_000) == (list(range(9)), [(a.pid, 0), (a.pid, 7)])
    assert aborted(0, 42) == ([0, 1], [(a.pid, 0)])
    assert aborted(2, 42) == ([2, 3], [(a.pid, 0)])  # the page starts inside the transaction: its first offset still 0
    assert aborted(4, 42) == ([4, 5, 6], [(a.pid, 0)])  # a's ABORT marker ends the range here
    assert aborted(6, 42) == ([6, 7, 8], [(a.pid, 7)])
    assert aborted(6, 10_000) == ([6, 7, 8], [(a.pid, 7)])


# --- cost ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation_level", ["read_uncommitted", "read_committed"])
def test_a_page_reads_its_own_rows_and_a_bisection_not_the_log(broker, topic, isolation_level):
    for start in range(0, 20_000, 2000):
        plain(broker, topic, 0, *[f"v{i:09d}" for i in range(start, start + 2000)])  # 10 bytes each
    with broker.db.transaction() as conn:
        conn.execute(text("ANALYZE txlog.records"))

    def fetch():  # type: ignore[no-untyped-def]
        return page(broker, topic, 5000, max_bytes=500, isolation_level=isolation_level)

    assert offsets(fetch()) == list(range(5000, 5050))
    pages = [(st, params) for st, params in _statements_of(broker, fetch) if "WITH RECURSIVE budget" in st]
    assert len(pages) == 1
    nodes, _ = _explain(broker, *pages[0])
    on_records = [n for n in nodes if n.get("Relation Name") == "records"]
    assert on_records and all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_records), nodes
    # the page's rows and the one at the budget's end (that one does not fit: dropped), no more
    assert max(n.get("Actual Rows", 0) for n in on_records) <= 51
    assert sum(n.get("Actual Loops", 1) for n in on_records) <= 40  # about log2(window) lookups


def test_a_read_committed_page_probes_the_aborted_index_once_per_transaction_not_per_row(broker, topic):
    p = Producer(broker, "a")
    for i in range(300):  # a long history of aborted (and committed) transactions of 5 records
        p.send(topic, 0, *[f"t{i}-{j}" for j in range(5)])
        p.abort() if i % 2 else p.commit()
    with broker.db.transaction() as conn:
        # and a long one on the other partition: a table PostgreSQL would not scan for a probe
        conn.execute(
            text(
                "INSERT INTO txlog.aborted_txns (topic, partition, producer_id, first_offset, last_offset, producer_epoch) "
                "SELECT :t, 1, 7, 2 * g, 2 * g + 1, 0 FROM generate_series(0, 19999) g"
            ),
            {"t": topic},
        )
        conn.execute(text("ANALYZE txlog.records"))
        conn.execute(text("ANALYZE txlog.aborted_txns"))

    def fetch():  # type: ignore[no-untyped-def]
        return page(broker, topic, 600, max_bytes=280, isolation_level="read_committed")  # 7 bytes a record

    got = fetch()
    assert offsets(got) == list(range(600, 648))  # 8 transactions: 40 records and 8 markers
    assert got.aborted_transactions == [(p.pid, o) for o in range(606, 648, 12)]
    pages = [(st, params) for st, params in _statements_of(broker, fetch) if "WITH RECURSIVE budget" in st]
    nodes, _ = _explain(broker, *pages[0])
    on_index = [n for n in nodes if n.get("Relation Name") == "aborted_txns"]
    assert on_index and all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_index), nodes
    # a probe for each of the page's 8 transactions (and the row at the budget's end), none per row,
    # and no scan of the aborted ranges
    assert sum(n.get("Actual Loops", 1) for n in on_index) <= 9
    assert max(n.get("Actual Rows", 0) for n in on_index) <= 1


# --- ListOffsets ----------------------------------------------------------------------------------------


def test_list_offsets_earliest_latest_by_isolation_and_by_timestamp(broker, topic):
    for i in range(5):
        plain(broker, topic, 0, f"r{i}", ts=T0 + 1000 * i)  # offsets 0..4 at T0, T0+1s, …
    p = Producer(broker, "open")
    p.send(topic, 0, "undecided")  # 5, at the wall clock: holds the LSO
    with broker.db.transaction() as conn:
        retention_store.log_start_advance(conn, topic, 0, 1)

    def listed(timestamp: int, isolation: str = "read_uncommitted"):  # type: ignore[no-untyped-def]
        [r] = fetch_service.list_offsets(broker, [(topic, 0, timestamp)], isolation)  # type: ignore[arg-type]
        assert r.error is None and (r.topic, r.partition, r.timestamp) == (topic, 0, timestamp)
        return r.offset

    assert listed(EARLIEST_TIMESTAMP) == listed(EARLIEST_LOCAL_TIMESTAMP) == ListedOffset(1, None)
    assert listed(LATEST_TIMESTAMP) == ListedOffset(6, None)
    assert listed(LATEST_TIMESTAMP, "read_committed") == ListedOffset(5, None)
    assert listed(T0 + 2000) == ListedOffset(2, T0 + 2000)
    assert listed(T0 + 2500) == ListedOffset(3, T0 + 3000)
    assert listed(T0) == ListedOffset(1, T0 + 1000)  # the log starts at 1
    assert listed(T0 + 4500) == ListedOffset(5, listed(T0 + 4500).timestamp_ms)  # the open transaction's record
    assert listed(T0 + 4500, "read_committed") is None  # … which a read_committed reader may not see yet
    assert listed(2**62) is None  # nothing that late


def test_list_offsets_max_timestamp_is_the_first_data_record_with_the_largest_one(broker, topic):
    for i, ts in enumerate([T0, T0 + 5000, T0 + 1000, T0 + 5000, T0 + 2000]):
        plain(broker, topic, 0, f"r{i}", ts=ts)
    [r] = fetch_service.list_offsets(broker, [(topic, 0, MAX_TIMESTAMP)])
    assert r.offset == ListedOffset(1, T0 + 5000)
    p = Producer(broker, "tx")
    p.send(topic, 0, "x")  # 5: now, later than all, open
    [r] = fetch_service.list_offsets(broker, [(topic, 0, MAX_TIMESTAMP)], "read_committed")
    assert r.offset is None  # the largest is past the last stable offset
    p.commit()  # the COMMIT marker is later still, but markers are no records
    [r] = fetch_service.list_offsets(broker, [(topic, 0, MAX_TIMESTAMP)], "read_committed")
    assert r.offset is not None and r.offset.offset == 5
    [r] = fetch_service.list_offsets(broker, [(topic, 1, MAX_TIMESTAMP)])
    assert r.offset is None and r.error is None  # an empty partition


def test_list_offsets_answers_each_partition_with_its_own_error(broker, topic):
    plain(broker, topic, 1, "a")
    got = fetch_service.list_offsets(
        broker, [(topic, 1, LATEST_TIMESTAMP), ("nope", 0, -1), (topic, 7, -2), (topic, 0, -9), (topic, 2**40, -1)]
    )
    assert [(r.topic, r.partition) for r in got] == [(topic, 1), ("nope", 0), (topic, 7), (topic, 0), (topic, 2**40)]
    assert got[0].offset == ListedOffset(1, None) and got[0].error is None
    assert [r.error.code for r in got[1:]] == [  # type: ignore[union-attr]
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]


def test_partition_statuses_of_several_partitions_in_one_read(broker, topic):
    plain(broker, topic, 0, "a", "b")
    Producer(broker, "open").send(topic, 1, "x")
    got = fetch_service.partition_statuses(broker, [(topic, 0), (topic, 1), ("nope", 0), (topic, -1)])
    assert set(got) == {(topic, 0), (topic, 1)}
    assert (got[(topic, 0)].high_watermark, got[(topic, 0)].last_stable_offset) == (2, 2)
    assert (got[(topic, 1)].high_watermark, got[(topic, 1)].last_stable_offset, got[(topic, 1)].open_transactions) == (1, 0, 1)


# --- a Fetch of many partitions ----------------------------------------------------------------------


def test_a_fetch_reads_its_partitions_in_one_snapshot_each_with_its_own_errors(broker, topic_name):
    topics.create_topic(broker, topic_name, 4)
    for p in range(4):
        plain(broker, topic_name, p, f"p{p}-a", f"p{p}-b")
    wanted = [(topic_name, p) for p in (0, 1, 2, 3, 7)]

    def read_all():  # type: ignore[no-untyped-def]
        with fetch_service.LogReader(broker, wanted) as reader:
            plain(broker, topic_name, 1, "after the snapshot")
            assert error_of(reader.page, topic_name, 7, 0).code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert error_of(reader.page, topic_name, 0, 3).code is ErrorCode.OFFSET_OUT_OF_RANGE
            later = reader.page(topic_name, 1, 0)
            assert [r.value for r in later.records] == [b"p1-a", b"p1-b"] and later.high_watermark == 2
            assert reader.page(topic_name, 2, 2).records == []  # caught up: no statement of its own
            assert [r.value for r in reader.page(topic_name, 3, 1).records] == [b"p3-b"]

    statements = _statements_of(broker, read_all, touching=("txlog.partition_status", "WITH RECURSIVE budget"))
    assert sum("txlog.partition_status" in st for st, _ in statements) == 1  # one status statement for all
    assert sum("WITH RECURSIVE budget" in st for st, _ in statements) == 2  # a page statement per partition read
    assert page(broker, topic_name, partition=1).high_watermark == 3


def test_record_sizes_are_what_records_count_against_a_budget_and_a_spent_budget_reads_no_page(broker, topic_name):
    topics.create_topic(broker, topic_name, 2)
    plain(broker, topic_name, 0, "a" * 10, headers=(("h", b"123"), ("n", None)))  # 0
    p = Producer(broker, "tx")
    p.send(topic_name, 0, "b" * 30)  # 1
    p.abort()  # 2: ABORT
    plain(broker, topic_name, 0, "", "c" * 7)  # 3, 4: the last, sized by the partition's next position
    rows = page(broker, topic_name).records
    wanted = [(topic_name, 0, o) for o in range(6)] + [(topic_name, 1, 0), ("nope", 0, 0), (topic_name, 0, -1)]

    def read_all():  # type: ignore[no-untyped-def]
        with fetch_service.LogReader(broker, [(topic_name, 0), (topic_name, 1)]) as reader:
            sizes = reader.record_sizes(wanted)
            unread = reader.page(topic_name, 0, 1, max_bytes=0, isolation_level="read_committed")
            assert error_of(reader.page, topic_name, 0, 6, max_bytes=0).code is ErrorCode.OFFSET_OUT_OF_RANGE
        return sizes, unread

    statements = _statements_of(broker, read_all, touching=("WITH RECURSIVE budget", 'AS w(topic, partition, "offset")'))
    assert len(statements) == 1  # the sizes in one statement; the page of no bytes reads none
    sizes, unread = read_all()
    assert sizes == {(topic_name, 0, r.offset): r.size for r in rows}  # the marker's 0; none but stored records
    assert [sizes[(topic_name, 0, o)] for o in range(5)] == [10 + 1 + 3 + 1, len(rows[1].key or b"") + 30, 0, 0, 7]
    assert (unread.records, unread.aborted_transactions, unread.high_watermark) == ([], [], 5)


def test_a_database_failure_fails_every_page_read_after_it(broker, topic_name):
    topics.create_topic(broker, topic_name, 3)
    for p in range(3):
        plain(broker, topic_name, p, f"p{p}")
    with fetch_service.LogReader(broker, [(topic_name, p) for p in range(3)]) as reader:
        assert reader.page(topic_name, 0, 0).records
        with broker.db.transaction() as conn:  # the reader's session ends under it
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        assert ended == 1
        first = error_of(reader.page, topic_name, 1, 0)
        assert first.code.retriable, first
        assert error_of(reader.page, topic_name, 2, 0) is first
    assert page(broker, topic_name, partition=2).records  # the next Fetch reads again
