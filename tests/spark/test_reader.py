"""read_topic over JDBC against a real PostgreSQL: what it reads equals what a consumer of the same
isolation level fetches through txlog's services, from a snapshot fixed before Spark runs."""

from __future__ import annotations

import psycopg
import pytest

from app.errors import ErrorCode, TxlogError
from app.services import topics
from spark.reader import (
    SLICE_SESSION_INIT,
    OffsetRange,
    commit_offsets,
    jdbc_url,
    read_topic,
    slice_predicate,
    snapshot,
    split_ranges,
)
from tests.spark.logdata import Txn, consume, group_offsets, mixed_log, plain, rec, spark_rows


def test_read_committed_equals_a_read_committed_consumer(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    rows = spark_rows(read_topic(spark, db_url, topic_name))
    assert rows == consume(broker, topic_name, "read_committed")
    values = {r[3].decode() for r in rows}
    assert {v.split("-")[0] for v in values} == {"plain", "idem", "committed"}  # no aborted, open, late ones
    assert len(values) == 3 * 2 + 1 + 3 * 3 * 4
    with psycopg.connect(db_url) as conn:  # and the contract's view agrees, column by column
        view = conn.execute(
            'SELECT partition, "offset", key, value, headers::text, "timestamp", producer_id FROM txlog.committed_records '
            'WHERE topic = %s ORDER BY partition, "offset"',
            (topic_name,),
        ).fetchall()
    df = read_topic(spark, db_url, topic_name).orderBy("partition", "offset")
    got = [
        (
            r["partition"],
            r["offset"],
            bytes(r["key"]) if r["key"] is not None else None,
            bytes(r["value"]),
            r["headers"],
            r["ts"],
            r["producer_id"],
        )
        for r in df.selectExpr("*", "unix_micros(timestamp) AS ts").collect()
    ]
    assert got == [(p, o, k, v, h, int(ts.timestamp() * 1_000_000), pid) for p, o, k, v, h, ts, pid in view]
    assert all(r["topic"] == topic_name for r in df.collect())


def test_read_uncommitted_sees_data_records_up_to_the_high_watermark(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    rows = spark_rows(read_topic(spark, db_url, topic_name, isolation_level="read_uncommitted"))
    assert rows == consume(broker, topic_name, "read_uncommitted")
    kinds = {r[3].decode().split("-")[0] for r in rows}
    assert kinds == {"plain", "idem", "committed", "aborted", "open", "late"}
    status = topics.describe_topic(broker, topic_name)
    controls = sum(s.high_watermark for s in status) - len(rows)
    assert controls == 6 * 3  # the markers of six ended transactions on three partitions: never read


def test_a_read_is_a_snapshot_fixed_before_spark_runs(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    open_txn = mixed_log(broker, topic_name)
    before = consume(broker, topic_name)
    snap = snapshot(db_url, topic_name)
    # Meanwhile: the open transaction commits, another aborts, more records arrive.
    open_txn.commit()
    t = Txn(broker)
    t.send(topic_name, 1, rec("aborted-later"))
    t.abort()
    plain(broker, topic_name, 2, rec("after"))
    assert consume(broker, topic_name) != before
    for n in (1, 3):
        assert spark_rows(snap.read(spark, n)) == before


@pytest.mark.parametrize("num_partitions", [1, 2, 4])
def test_parallel_slices_read_the_same_rows(spark, broker, db_url, topic_name, num_partitions) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    snap = snapshot(db_url, topic_name)
    df = snap.read(spark, num_partitions)
    assert df.rdd.getNumPartitions() == len(snap.slices(num_partitions)) == num_partitions
    assert spark_rows(df) == consume(broker, topic_name)


def test_slices_cover_each_offset_once() -> None:
    ranges = [OffsetRange(0, 5, 17), OffsetRange(1, 0, 0), OffsetRange(2, 3, 4), OffsetRange(3, 0, 30)]
    for n in (1, 2, 3, 4, 7, 100):
        slices = split_ranges(ranges, n)
        assert len(slices) == min(n, 12 + 1 + 30)
        covered = sorted((r.partition, o) for s in slices for r in s for o in range(r.start, r.end))
        assert covered == sorted((r.partition, o) for r in ranges for o in range(r.start, r.end))
        spans = [sum(r.span for r in s) for s in slices]
        assert max(spans) - min(spans) <= 1
    assert split_ranges([OffsetRange(0, 4, 4)], 3) == []


def slice_queries(snap, num_partitions: int) -> list[str]:  # type: ignore[no-untyped-def]
    """The statement each slice runs in PostgreSQL, as Spark's JDBC source sends it."""
    return [f"SELECT * FROM ({snap.select_sql()}) AS t WHERE {slice_predicate(s)}" for s in snap.slices(num_partitions)]


def test_each_slice_query_is_served_by_the_primary_key(broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE txlog.records")
        conn.execute(SLICE_SESSION_INIT)  # as on every JDBC connection Spark opens for a slice
        for isolation in ("read_committed", "read_uncommitted"):
            snap = snapshot(db_url, topic_name, isolation)  # type: ignore[arg-type]
            for n in (1, 2, 4):
                for sql in slice_queries(snap, n):
                    plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql))
                    assert "records_pkey" in plan, plan
                    assert "Seq Scan on records" not in plan, plan


def test_incremental_reads_from_group_offsets(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    open_txn = mixed_log(broker, topic_name)
    first = snapshot(db_url, topic_name, group_id="g1")
    assert spark_rows(first.read(spark)) == consume(broker, topic_name)
    commit_offsets(db_url, "g1", first.committable())
    assert group_offsets(broker, "g1") == first.committable()
    assert snapshot(db_url, topic_name, group_id="g1").is_empty()

    open_txn.commit()  # its records (and the late ones behind it) become visible
    plain(broker, topic_name, 0, rec("new-0"))
    df = read_topic(spark, db_url, topic_name, group_id="g1")
    values = sorted(r[3].decode() for r in spark_rows(df))
    assert values == sorted(["open-0", "open-1", "open-2", "late-0", "late-1", "late-2", "new-0"])
    assert spark_rows(df) == consume(broker, topic_name, start=first.end_offsets)

    commit_offsets(db_url, "g1", {0: 1}, topic=topic_name)  # {partition: offset} with a topic
    assert group_offsets(broker, "g1")[(topic_name, 0)] == 1
    again = snapshot(db_url, topic_name, group_id="g1", partitions=[0])
    assert list(again.start_offsets) == [0] and again.start_offsets[0] == 1


def test_explicit_offsets_and_partitions(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    lso = {s.partition: s.last_stable_offset for s in topics.describe_topic(broker, topic_name)}
    snap = snapshot(db_url, topic_name, partitions=[1], start_offsets={1: 2}, end_offsets={1: 10**9})
    assert snap.end_offsets == {1: lso[1]}  # never past the last stable offset
    expected = [r for r in consume(broker, topic_name) if r[0] == 1 and r[1] >= 2]
    assert spark_rows(snap.read(spark)) == expected
    assert read_topic(spark, db_url, topic_name, end_offsets={0: 0}).count() == 0
    with pytest.raises(TxlogError) as err:
        snapshot(db_url, topic_name, partitions=[7])
    assert err.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(TxlogError) as err:
        snapshot(db_url, "no-such-topic")
    assert err.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_jdbc_url_from_a_txlog_url() -> None:
    assert jdbc_url("postgresql://postgres@127.0.0.1:5433/txlog") == "jdbc:postgresql://127.0.0.1:5433/txlog?user=postgres"
    assert (
        jdbc_url("postgresql+psycopg://u%40x:p%2Fw%26@db.example:6000/logs?sslmode=require")
        == "jdbc:postgresql://db.example:6000/logs?user=u%40x&password=p%2Fw%26&sslmode=require"
    )
    assert jdbc_url("postgresql://u@[::1]/d") == "jdbc:postgresql://[::1]:5432/d?user=u"
    # several hosts (a primary and its standby): the same list, and the writable one wanted
    assert (
        jdbc_url("postgresql://u:pw@10.0.0.1:5001,10.0.0.2/txlog?target_session_attrs=read-write")
        == "jdbc:postgresql://10.0.0.1:5001,10.0.0.2:5432/txlog?user=u&password=pw&targetServerType=primary"
    )
    assert jdbc_url("postgresql+psycopg://u@/txlog?host=h1:7&host=h2:8") == "jdbc:postgresql://h1:7,h2:8/txlog?user=u"
    with pytest.raises(TxlogError):
        jdbc_url("postgresql:///txlog?host=/var/run/postgresql")
