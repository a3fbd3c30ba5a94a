"""read_topic after DeleteRecords: Spark reads from the new log start, before and after the sweeper
deleted what lies below it, exactly what a read_committed consumer fetches from there."""

from __future__ import annotations

from app.services import retention, sweeper, topics
from spark.reader import read_topic
from tests.spark.logdata import Txn, consume, plain, rec, spark_rows


def test_read_topic_starts_at_the_log_start_after_delete_records(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    topics.create_topic(broker, topic_name, 2)
    for p in (0, 1):
        plain(broker, topic_name, p, *(rec(f"plain-{p}-{i}") for i in range(4)))  # 0-3
    aborted = Txn(broker)
    aborted.send(topic_name, 0, rec("aborted-first"))  # 4: below the new log start
    plain(broker, topic_name, 0, rec("kept"))  # 5
    aborted.send(topic_name, 0, rec("aborted-kept"))  # 6: above it, still hidden
    aborted.abort()  # 7
    retention.delete_records(broker, topic_name, 0, 5)
    expected = [(0, 5, None, b"kept", None)] + [(1, i, None, f"plain-1-{i}".encode(), None) for i in range(4)]
    assert consume(broker, topic_name) == expected
    assert spark_rows(read_topic(spark, db_url, topic_name, num_partitions=2)) == expected
    assert sweeper.sweep(broker, budget_s=30).records_deleted == 5
    assert spark_rows(read_topic(spark, db_url, topic_name, start_offsets={0: 0}, num_partitions=2)) == expected
