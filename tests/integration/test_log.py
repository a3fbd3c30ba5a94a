"""The partition log through the services, against a real PostgreSQL: topics, plain produce, fetch
limits and ranges, consumer group offsets, and the fetch query's plan."""

from __future__ import annotations

import json

import psycopg
import pytest
from sqlalchemy import text

from app.domain.groups.offsets import GroupOffset
from app.domain.partitioner import partition_for_key
from app.domain.records import NewRecord, headers_from_object
from app.errors import ErrorCode, TxlogError
from app.services import fetch as fetch_service
from app.services import groups, topics
from app.services import produce as produce_service
from app.services.produce import ProduceRequest
from app.storage.db import driver
from tests.conftest import make_broker


def rec(value: str | None, key: str | None = None, headers: dict | None = None, ts: int | None = None) -> NewRecord:
    return NewRecord(
        key=key.encode() if key is not None else None,
        value=value.encode() if value is not None else None,
        headers=headers_from_object(headers or {}),
        timestamp_ms=ts,
    )


def produce(broker, topic: str, partition: int, *values: str) -> produce_service.ProduceResult:  # type: ignore[no-untyped-def]
    return produce_service.produce(broker, topic, partition, ProduceRequest([rec(v) for v in values]))


def error_of(fn, *args, **kwargs) -> TxlogError:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args, **kwargs)
    return info.value


# --- topics ---------------------------------------------------------------------------------------


def test_create_list_and_describe_topics(broker):
    assert topics.create_topic(broker, "orders", 3) == ("orders", 3)
    assert topics.create_topic(broker, "audit.v1", 1, {"retention.ms": "1000"}) == ("audit.v1", 1)
    assert topics.list_topics(broker) == [("audit.v1", 1), ("orders", 3)]
    parts = topics.describe_topic(broker, "orders")
    assert [(p.topic, p.partition, p.log_start_offset, p.high_watermark, p.last_stable_offset) for p in parts] == [
        ("orders", 0, 0, 0, 0),
        ("orders", 1, 0, 0, 0),
        ("orders", 2, 0, 0, 0),
    ]
    assert topics.partition_count(broker, "orders") == 3


def test_list_topics_of_an_empty_log(broker):
    assert topics.list_topics(broker) == []


def test_duplicate_topic_is_topic_already_exists_and_keeps_the_first(broker):
    topics.create_topic(broker, "orders", 2)
    err = error_of(topics.create_topic, broker, "orders", 5)
    assert err.code is ErrorCode.TOPIC_ALREADY_EXISTS
    assert "orders" in err.message
    assert topics.partition_count(broker, "orders") == 2
    assert len(topics.describe_topic(broker, "orders")) == 2


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "a/b", "x" * 250, "nul\x00", "newline\n"])
def test_invalid_topic_names_create_nothing(broker, name):
    assert error_of(topics.create_topic, broker, name, 1).code is ErrorCode.INVALID_TOPIC_EXCEPTION
    assert topics.list_topics(broker) == []


@pytest.mark.parametrize("n", [0, -3, 10_001])
def test_invalid_partition_counts(broker, n):
    assert error_of(topics.create_topic, broker, "t", n).code is ErrorCode.INVALID_PARTITIONS
    assert topics.list_topics(broker) == []


def test_unknown_topic(broker):
    assert error_of(topics.describe_topic, broker, "missing").code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error_of(topics.partition_count, broker, "missing").code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# --- plain produce --------------------------------------------------------------------------------


def test_plain_produce_assigns_dense_offsets_per_partition(broker):
    topics.create_topic(broker, "t", 2)
    results = [produce(broker, "t", 0, *[f"b{b}r{i}" for i in range(size)]) for b, size in enumerate([1, 3, 2, 5])]
    assert [(r.base_offset, r.last_offset) for r in results] == [(0, 0), (1, 3), (4, 5), (6, 10)]
    assert all(not r.duplicate and r.log_start_offset == 0 for r in results)
    other = produce(broker, "t", 1, "x", "y")
    assert (other.base_offset, other.last_offset) == (0, 1)  # partitions have their own offset spaces

    got = fetch_service.fetch(broker, "t", 0, 0)
    assert [r.offset for r in got.records] == list(range(11))
    assert [r.value for r in got.records] == [f"b{b}r{i}".encode() for b, size in enumerate([1, 3, 2, 5]) for i in range(size)]
    assert (got.next_offset, got.high_watermark, got.last_stable_offset, got.log_start_offset) == (11, 11, 11, 0)
    status = topics.describe_topic(broker, "t")
    assert [(p.high_watermark, p.last_stable_offset) for p in status] == [(11, 11), (2, 2)]


def test_produced_records_come_back_exactly(clocked_broker, clock):
    topics.create_topic(clocked_broker, "t", 1)
    batch = [
        NewRecord(b"k1", b"v1", (("h", b"1"), ("trace", "\u00e9\u2713".encode()), ("h", None)), 1_600_000_000_123),
        NewRecord(None, None),
        NewRecord(b"", b"\x00\xff binary"),
    ]
    result = produce_service.produce(clocked_broker, "t", 0, ProduceRequest(batch))
    assert result.log_append_time_ms == clock.now_ms
    got = fetch_service.fetch(clocked_broker, "t", 0, 0).records
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp_ms) for r in got] == [
        (0, b"k1", b"v1", (("h", b"1"), ("trace", "\u00e9\u2713".encode()), ("h", None)), 1_600_000_000_123),
        (1, None, None, (), clock.now_ms),  # no timestamp given: the append time
        (2, b"", b"\x00\xff binary", (), clock.now_ms),
    ]
    assert all(r.producer_id is None and not r.is_transactional and r.control_type is None for r in got)


def test_produce_to_unknown_topic_or_partition(broker):
    topics.create_topic(broker, "t", 2)
    for topic, partition in [("missing", 0), ("t", 2), ("t", -1)]:
        err = error_of(produce, broker, topic, partition, "v")
        assert err.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert [p.high_watermark for p in topics.describe_topic(broker, "t")] == [0, 0]


def test_empty_batch_is_invalid_record(broker):
    topics.create_topic(broker, "t", 1)
    err = error_of(produce_service.produce, broker, "t", 0, ProduceRequest([]))
    assert err.code is ErrorCode.INVALID_RECORD


def test_batch_above_max_request_bytes_is_message_too_large(db_url):
    small = make_broker(db_url, max_request_bytes=100)
    try:
        topics.create_topic(small, "t", 1)
        assert produce(small, "t", 0, "x" * 100).base_offset == 0
        err = error_of(produce, small, "t", 0, "x" * 60, "y" * 41)
        assert err.code is ErrorCode.MESSAGE_TOO_LARGE
        assert fetch_service.fetch(small, "t", 0, 0).high_watermark == 1
    finally:
        small.db.dispose()


def test_produce_to_topic_partitions_by_murmur2_and_round_robin(broker):
    topics.create_topic(broker, "t", 5)
    for key in ["k", "user-1", "user-2", "\u00e9"]:
        result = produce_service.produce_to_topic(broker, "t", [rec("v", key=key)])
        assert result.partition == partition_for_key(key.encode(), 5)
    chosen = [produce_service.produce_to_topic(broker, "t", [rec("v")]).partition for _ in range(10)]
    assert sorted(set(chosen)) == [0, 1, 2, 3, 4]
    assert all(b == (a + 1) % 5 for a, b in zip(chosen, chosen[1:]))  # in turn, per process


# --- fetch ----------------------------------------------------------------------------------------


def test_fetch_max_records(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, *[str(i) for i in range(10)])
    got = fetch_service.fetch(broker, "t", 0, 2, max_records=3)
    assert [r.offset for r in got.records] == [2, 3, 4]
    assert got.next_offset == 5
    rest = fetch_service.fetch(broker, "t", 0, got.next_offset, max_records=100)
    assert [r.offset for r in rest.records] == [5, 6, 7, 8, 9]
    assert rest.next_offset == 10


def test_fetch_max_bytes_returns_at_least_the_first_record(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, "a" * 100, "b" * 10, "c" * 10, "d" * 10)
    first = fetch_service.fetch(broker, "t", 0, 0, max_bytes=5)
    assert [r.offset for r in first.records] == [0]  # larger than max_bytes, returned anyway
    assert first.next_offset == 1
    two = fetch_service.fetch(broker, "t", 0, 1, max_bytes=25)
    assert [r.offset for r in two.records] == [1, 2]
    assert two.next_offset == 3
    exact = fetch_service.fetch(broker, "t", 0, 1, max_bytes=30)
    assert [r.offset for r in exact.records] == [1, 2, 3]
    assert exact.next_offset == 4


def test_a_reader_following_next_offset_reads_everything_once(broker):
    topics.create_topic(broker, "t", 1)
    for b in range(7):
        produce(broker, "t", 0, *[f"{b}-{i}" for i in range(b + 1)])
    seen, offset = [], 0
    for _ in range(100):
        got = fetch_service.fetch(broker, "t", 0, offset, max_records=4, max_bytes=9)
        if not got.records:
            break
        seen += [r.offset for r in got.records]
        offset = got.next_offset
    assert seen == list(range(28))
    assert offset == 28


def test_fetch_at_the_high_watermark_is_empty(broker):
    topics.create_topic(broker, "t", 1)
    empty = fetch_service.fetch(broker, "t", 0, 0)
    assert (empty.records, empty.next_offset, empty.high_watermark) == ([], 0, 0)
    produce(broker, "t", 0, "a", "b")
    at_hw = fetch_service.fetch(broker, "t", 0, 2)
    assert (at_hw.records, at_hw.next_offset, at_hw.high_watermark) == ([], 2, 2)


def test_fetch_outside_the_log_is_offset_out_of_range(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, "a", "b", "c")
    above = error_of(fetch_service.fetch, broker, "t", 0, 4)
    assert above.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert above.details == {"log_start_offset": 0, "high_watermark": 3}
    assert error_of(fetch_service.fetch, broker, "t", 0, -1).code is ErrorCode.OFFSET_OUT_OF_RANGE


def test_fetch_below_the_log_start_is_offset_out_of_range(broker):
    topics.create_topic(broker, "t", 1)
    produce(broker, "t", 0, "a", "b", "c", "d")
    with broker.db.transaction() as conn:  # as retention would: the log now starts at offset 2
        conn.execute(text("UPDATE txlog.partitions SET log_start_offset = 2 WHERE topic = 't' AND partition = 0"))
        conn.execute(text("DELETE FROM txlog.records WHERE topic = 't' AND partition = 0 AND \"offset\" < 2"))
    err = error_of(fetch_service.fetch, broker, "t", 0, 1)
    assert err.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert err.details["log_start_offset"] == 2
    got = fetch_service.fetch(broker, "t", 0, 2)
    assert [r.offset for r in got.records] == [2, 3]
    assert got.log_start_offset == 2
    assert produce(broker, "t", 0, "e").log_start_offset == 2


def test_fetch_unknown_topic_or_partition(broker):
    topics.create_topic(broker, "t", 1)
    for topic, partition in [("missing", 0), ("t", 1)]:
        assert error_of(fetch_service.fetch, broker, topic, partition, 0).code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_fetch_limits_must_be_positive(broker):
    topics.create_topic(broker, "t", 1)
    assert error_of(fetch_service.fetch, broker, "t", 0, 0, max_records=0).code is ErrorCode.INVALID_REQUEST
    assert error_of(fetch_service.fetch, broker, "t", 0, 0, max_bytes=0).code is ErrorCode.INVALID_REQUEST


# --- consumer group offsets -----------------------------------------------------------------------


def test_group_offsets_commit_and_fetch(broker):
    topics.create_topic(broker, "a", 2)
    topics.create_topic(broker, "b", 1)
    assert groups.offset_fetch(broker, "g1") == []
    groups.offset_commit(broker, "g1", [GroupOffset("b", 0, 7, "m"), GroupOffset("a", 1, 3, ""), GroupOffset("a", 0, 5, "x")])
    assert groups.offset_fetch(broker, "g1") == [
        GroupOffset("a", 0, 5, "x"),
        GroupOffset("a", 1, 3, ""),
        GroupOffset("b", 0, 7, "m"),
    ]
    groups.offset_commit(broker, "g1", [GroupOffset("a", 0, 9, "later")])  # overwrites, leaves the rest
    assert groups.offset_fetch(broker, "g1", require_stable=True)[0] == GroupOffset("a", 0, 9, "later")
    assert groups.offset_fetch(broker, "g2") == []  # groups are separate
    assert groups.list_groups(broker) == ["g1"]


def test_group_offset_commit_to_unknown_partition_commits_nothing(broker):
    topics.create_topic(broker, "a", 1)
    err = error_of(
        groups.offset_commit, broker, "g", [GroupOffset("a", 0, 1, ""), GroupOffset("a", 1, 1, ""), GroupOffset("zz", 0, 1, "")]
    )
    assert err.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "a-1" in err.message and "zz-0" in err.message
    assert groups.offset_fetch(broker, "g") == []


def test_group_offset_commit_rejects_bad_input(broker):
    topics.create_topic(broker, "a", 1)
    assert error_of(groups.offset_commit, broker, "g", [GroupOffset("a", 0, -1, "")]).code is ErrorCode.INVALID_REQUEST
    assert error_of(groups.offset_commit, broker, "", [GroupOffset("a", 0, 1, "")]).code is ErrorCode.INVALID_REQUEST
    assert error_of(groups.offset_fetch, broker, "g\x00").code is ErrorCode.INVALID_REQUEST
    assert groups.offset_fetch(broker, "g") == []


# --- the fetch query stays an index range scan ----------------------------------------------------


def _statements_of(broker, fn, touching: tuple[str, ...] = ("txlog.records", "txlog.log_records")):  # type: ignore[no-untyped-def]
    """Run ``fn`` and return the (SQL, parameters) it sent that name ``touching`` (the records table
    or the view of it), as psycopg received them: through SQLAlchemy or straight to the driver."""
    seen: list[tuple[str, object]] = []
    execute = psycopg.Cursor.execute

    def capture(cursor, query, params=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        statement = query if isinstance(query, str) else bytes(query).decode()
        if any(t in statement for t in touching):
            seen.append((statement, params))
        return execute(cursor, query, params, *args, **kwargs)

    psycopg.Cursor.execute = capture  # type: ignore[method-assign]
    try:
        fn()
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    assert seen, "the fetch read no records"
    return seen


def _plan_nodes(node: dict):  # type: ignore[no-untyped-def]
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def _explain(broker, statement: str, parameters) -> tuple[list[dict], int]:  # type: ignore[no-untyped-def]
    with broker.db.transaction() as conn:
        raw = driver(conn).execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters).fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    nodes = list(_plan_nodes(plan))
    buffers = sum(
        n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in nodes if "Relation Name" in n or "Index Name" in n
    )
    return nodes, buffers


def _fill(broker, topic: str, n: int, batch: int = 2000) -> None:  # type: ignore[no-untyped-def]
    for start in range(0, n, batch):
        produce(broker, topic, 0, *[f"value-{i:08d}" for i in range(start, min(n, start + batch))])


@pytest.mark.parametrize("isolation_level", ["read_uncommitted", "read_committed"])
def test_fetch_uses_the_records_primary_key_and_its_cost_does_not_grow_with_the_log(broker, isolation_level):
    topics.create_topic(broker, "short", 1)
    topics.create_topic(broker, "long", 1)
    _fill(broker, "short", 200)
    _fill(broker, "long", 40_000)
    with broker.db.transaction() as conn:
        conn.execute(text("ANALYZE txlog.records"))

    costs = {}
    for topic, hw in [("short", 200), ("long", 40_000)]:
        for offset in (0, hw - 100):
            statements = _statements_of(
                broker, lambda: fetch_service.fetch(broker, topic, 0, offset, max_records=50, isolation_level=isolation_level)
            )
            for statement, parameters in statements:
                nodes, buffers = _explain(broker, statement, parameters)
                on_records = [n for n in nodes if n.get("Relation Name") == "records"]
                assert on_records, statement
                assert not [n for n in on_records if n["Node Type"] == "Seq Scan"], nodes
                assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_records), nodes
                assert {n.get("Index Name") for n in on_records} == {"records_pkey"}
                assert max(n.get("Actual Rows", 0) for n in on_records) <= 51  # reads what it returns, no more
                costs[(topic, offset)] = buffers
    # a page of 50 records costs a few index pages per record, the same in a 200-record log and a
    # 40,000-record log (read_committed may probe the aborted-transaction index once per record)
    assert max(costs.values()) <= 3 * 51 + 10, costs
