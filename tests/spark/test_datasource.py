"""The ``txlog`` Python data source: batch and Structured Streaming reads give the same rows as the
JDBC reader and a read_committed consumer."""

from __future__ import annotations

from app.services import topics
from spark.reader import read_topic
from tests.spark.logdata import consume, group_offsets, mixed_log, plain, rec, spark_rows


def test_batch_read_equals_jdbc_read(spark, broker, db_url, topic_name) -> None:  # type: ignore[no-untyped-def]
    mixed_log(broker, topic_name)
    df = spark.read.format("txlog").option("url", db_url).option("topic", topic_name).option("numPartitions", "3").load()
    rows = spark_rows(df)
    assert rows == spark_rows(read_topic(spark, db_url, topic_name)) == consume(broker, topic_name)
    assert df.schema == read_topic(spark, db_url, topic_name).schema
    uncommitted = (
        spark.read.format("txlog")
        .option("url", db_url)
        .option("topic", topic_name)
        .option("isolationLevel", "read_uncommitted")
        .load()
    )
    assert spark_rows(uncommitted) == consume(broker, topic_name, "read_uncommitted")


def test_stream_reads_committed_records_and_resumes_from_its_checkpoint(spark, broker, db_url, topic_name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    open_txn = mixed_log(broker, topic_name)

    def run() -> None:
        stream = (
            spark.readStream.format("txlog")
            .option("url", db_url)
            .option("topic", topic_name)
            .option("group", "dash")
            .option("maxOffsetsPerTrigger", "25")
            .load()
        )
        query = (
            stream.writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        assert not query.isActive

    run()
    first = consume(broker, topic_name)
    assert spark_rows(spark.read.parquet(str(tmp_path / "out"))) == first
    # Spark tells a source a batch is done (commit) when it plans the next one: with batches of at
    # most 25 offsets, all but the last are committed to the group by now.
    lso = {(topic_name, s.partition): s.last_stable_offset for s in topics.describe_topic(broker, topic_name)}
    committed = group_offsets(broker, "dash")
    assert 0 < sum(committed.values()) < sum(lso.values())
    assert all(committed.get(tp, 0) <= o for tp, o in lso.items())

    open_txn.commit()
    plain(broker, topic_name, 1, rec("after"))
    run()
    assert spark_rows(spark.read.parquet(str(tmp_path / "out"))) == consume(broker, topic_name)
    assert all(group_offsets(broker, "dash")[tp] >= o for tp, o in lso.items())
