"""A PySpark Python data source named ``txlog``, for batch and Structured Streaming reads:

    register(spark)   # spark_session() does it for you
    df = spark.read.format("txlog").option("url", url).option("topic", "orders").load()
    stream = (spark.readStream.format("txlog").option("url", url).option("topic", "orders")
              .option("group", "dashboards").load())

Options: ``url`` and ``topic`` (required); ``isolationLevel`` (``read_committed``, the default, or
``read_uncommitted``); ``numPartitions`` (slices per read or micro-batch, default 2);
``startingOffsets`` for a stream without a checkpoint (``earliest``, the default, or ``latest``) —
or ``group``, to start from that consumer group's committed offsets; ``maxOffsetsPerTrigger``
(at most that many offsets per micro-batch); ``commitOffsets`` (``true`` by default when ``group``
is set: finished micro-batches commit their end offsets to the group, for txlog's tools to see.
Spark reports a batch finished when it plans the next one, so the group lags the query by one
batch; the Spark checkpoint remains what a restarted query resumes from).

The same pushed-down SQL as the JDBC reader runs in PostgreSQL, so the rows are the same; but they
are read by Python workers with psycopg and handed to the JVM as Arrow batches, which costs far more
per row than Spark's JDBC source reading straight into the JVM. For bulk reads prefer
:func:`spark.reader.read_topic` and ``txlog spark stream``; see docs/spark.md for measured figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Literal, Sequence

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from spark.reader import SLICE_SESSION_INIT, IsolationLevel, OffsetRange, record_schema, records_select, snapshot, split_ranges

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

BATCH_ROWS = 10_000


class TxlogSlice(InputPartition):
    """One slice of a read: offset ranges of one topic, read in one task."""

    def __init__(self, url: str, topic: str, isolation_level: IsolationLevel, ranges: Sequence[OffsetRange]) -> None:
        super().__init__([(r.partition, r.start, r.end) for r in ranges])
        self.url = url
        self.topic = topic
        self.isolation_level = isolation_level


def _arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", pa.string()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("producer_id", pa.int64()),
        ]
    )


def read_slice(part: TxlogSlice) -> Iterator:
    """Rows of a slice as Arrow record batches, range by range in offset order (runs in a Python
    worker: opens its own connection)."""
    import psycopg
    import pyarrow as pa

    from app.storage.db import libpq_url

    schema = _arrow_schema()
    sql = records_select(part.isolation_level, "%(topic)s") + (
        ' AND r.partition = %(partition)s AND r."offset" >= %(start)s AND r."offset" < %(end)s ORDER BY r."offset"'
    )
    with psycopg.connect(libpq_url(part.url), autocommit=False) as conn:
        conn.execute(SLICE_SESSION_INIT)
        for partition, start, end in part.value:
            with conn.cursor(name="txlog_slice") as cur:  # server-side: rows stream in batches
                cur.itersize = BATCH_ROWS
                cur.execute(sql, {"topic": part.topic, "partition": partition, "start": start, "end": end})
                while True:
                    rows = cur.fetchmany(BATCH_ROWS)
                    if not rows:
                        break
                    columns = list(zip(*rows))
                    yield pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


def _option(options, name: str, default: str | None = None) -> str | None:
    value = options.get(name, options.get(name.lower(), default))
    return value


def _required(options, name: str) -> str:
    value = _option(options, name)
    if not value:
        raise ValueError(f"the txlog data source needs option {name!r}")
    return value


class TxlogDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "txlog"

    def schema(self) -> "StructType":
        return record_schema()

    def reader(self, schema: "StructType") -> DataSourceReader:
        return TxlogBatchReader(self.options)

    def streamReader(self, schema: "StructType") -> DataSourceStreamReader:
        return TxlogStreamReader(self.options)


class _Options:
    def __init__(self, options) -> None:
        self.url = _required(options, "url")
        self.topic = _required(options, "topic")
        self.isolation_level: IsolationLevel = _option(options, "isolationLevel", "read_committed")  # type: ignore[assignment]  # snapshot() checks it
        self.num_partitions = int(_option(options, "numPartitions", "2"))  # type: ignore[arg-type]  # it has a default
        self.group = _option(options, "group")
        self.starting = _option(options, "startingOffsets", "earliest")
        max_offsets = _option(options, "maxOffsetsPerTrigger")
        self.max_offsets = int(max_offsets) if max_offsets else None
        self.commit_offsets = (_option(options, "commitOffsets", "true") or "").lower() == "true" and bool(self.group)

    def slices(self, ranges: Sequence[OffsetRange]) -> list[TxlogSlice]:
        return [
            TxlogSlice(self.url, self.topic, self.isolation_level, s)
            for s in split_ranges([r for r in ranges if r.span], self.num_partitions)
        ]


class TxlogBatchReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.opts = _Options(options)

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        snap = snapshot(o.url, o.topic, o.isolation_level, group_id=o.group)
        return o.slices(snap.ranges)

    def read(self, partition: InputPartition) -> Iterator:
        return read_slice(partition)  # type: ignore[arg-type]  # our partitions() made it a TxlogSlice


def _as_offsets(d: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in d.items()}


def _as_json(d: dict[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(d.items())}


class TxlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of what a consumer of the isolation level sees: each batch ends at the last
    stable offsets of the moment Spark asks (Kafka's ``endOffsets()``)."""

    def __init__(self, options) -> None:
        self.opts = _Options(options)
        self.target: dict[int, int] | None = None  # Trigger.AvailableNow: the ends fixed at its start

    def prepareForTriggerAvailableNow(self) -> None:
        o = self.opts
        self.target = dict(snapshot(o.url, o.topic, o.isolation_level).end_offsets)

    def initialOffset(self) -> dict:
        o = self.opts
        snap = snapshot(o.url, o.topic, o.isolation_level, group_id=o.group)
        start = snap.end_offsets if o.starting == "latest" and not o.group else snap.start_offsets
        return _as_json(start)

    def latestOffset(self, start: dict, limit) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        o = self.opts
        begin = _as_offsets(start)
        ends: dict[int, int] | Literal["latest_stable"] = self.target if self.target is not None else "latest_stable"
        snap = snapshot(o.url, o.topic, o.isolation_level, start_offsets=begin, end_offsets=ends)
        end = dict(snap.end_offsets)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if budget is not None:
            for p in sorted(end):
                take = min(end[p] - snap.start_offsets[p], budget)
                end[p] = snap.start_offsets[p] + take
                budget -= take
        return _as_json({p: max(end[p], begin.get(p, end[p])) for p in end})

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.opts.max_offsets) if self.opts.max_offsets else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = _as_offsets(start), _as_offsets(end)
        ranges = [OffsetRange(p, begin.get(p, 0), e) for p, e in sorted(stop.items())]
        return self.opts.slices(ranges)

    def read(self, partition: InputPartition) -> Iterator:
        return read_slice(partition)  # type: ignore[arg-type]  # our partitions() made it a TxlogSlice

    def commit(self, end: dict) -> None:
        if self.opts.commit_offsets:
            from spark.reader import commit_offsets

            commit_offsets(self.opts.url, self.opts.group, _as_offsets(end), topic=self.opts.topic)  # type: ignore[arg-type]  # commit_offsets is set only with a group


def register(spark: "SparkSession") -> None:
    """Make ``format("txlog")`` available in this session."""
    spark.dataSource.register(TxlogDataSource)
