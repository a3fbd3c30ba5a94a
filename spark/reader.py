"""Read a txlog topic into Spark straight from PostgreSQL over JDBC.

A read is a snapshot: the end offset of every partition is fixed once, before Spark runs (the last
stable offset for ``read_committed``, the high watermark for ``read_uncommitted``, as Kafka's
``endOffsets()``). Below the last stable offset every transaction is decided and its markers are
written, so the rows of ``[start, end)`` never change afterwards: each slice, read later over its
own connection, sees exactly what a ``read_committed`` consumer saw at the start.

The filtering happens in PostgreSQL: Spark never receives control records, records of aborted
transactions or records of open ones. The range is cut into slices of about equal offset span; each
slice is a predicate on ``(partition, offset)`` served by the records' primary key, and Spark reads
the slices in parallel, one JDBC connection each.

    spark = spark_session("report")
    df = read_topic(spark, "postgresql://postgres@127.0.0.1:5432/txlog", "orders")

Incremental jobs take a snapshot from a consumer group's committed offsets and commit its end
offsets once the job has succeeded::

    snap = snapshot(url, "orders", group_id="nightly")
    snap.read(spark).write.parquet(...)
    commit_offsets(url, "nightly", snap.committable())
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Literal, Mapping, Sequence
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from app.domain.records import validate_topic_name
from app.errors import ErrorCode, TxlogError
from app.storage.db import libpq_url

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from app.services import Broker

IsolationLevel = Literal["read_committed", "read_uncommitted"]

JDBC_DRIVER_CLASS = "org.postgresql.Driver"
JDBC_FETCH_SIZE = 10_000  # rows per round trip; also makes the driver stream instead of buffering a slice

COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "producer_id")


def record_schema() -> "StructType":
    """The columns of a topic read: the contract's ``txlog.committed_records`` columns (headers as
    JSON text)."""
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

    return StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", StringType()),
            StructField("timestamp", TimestampType()),
            StructField("producer_id", LongType()),
        ]
    )


# --- the pushed-down SQL --------------------------------------------------------------------------

# What a read_committed reader may see, as txlog.committed_records, minus the last-stable-offset
# bound (a snapshot brings its own end offsets, all at or below the LSO). Read from
# txlog.log_records, whose ``aborted`` column is the one definition of an aborted record.
_SELECT = """
SELECT r.topic, r.partition, r."offset", r.key, r.value, r.headers::text AS headers, r."timestamp", r.producer_id
FROM txlog.log_records r
WHERE r.topic = {topic} AND r.control_type IS NULL
"""

_NOT_ABORTED = """
  AND NOT r.aborted
"""


# Each slice is a bounded (partition, offset) range: read it through the records' primary key, never
# by scanning the whole table (which holds every topic), and in one process per slice (Spark runs the
# slices in parallel already). Applied to every JDBC connection Spark opens for a slice.
SLICE_SETTINGS = {"enable_seqscan": "off", "max_parallel_workers_per_gather": "0"}
SLICE_SESSION_INIT = "SELECT " + ", ".join(f"set_config('{k}', '{v}', false)" for k, v in SLICE_SETTINGS.items())


def sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def records_select(isolation_level: IsolationLevel, topic_sql: str) -> str:
    """The filtered select for a topic (no offset bounds). ``topic_sql`` is a SQL literal or a
    bind parameter."""
    sql = _SELECT.format(topic=topic_sql)
    if isolation_level == "read_committed":
        sql += _NOT_ABORTED
    return sql


# --- offsets and slices ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int

    @property
    def span(self) -> int:
        return max(0, self.end - self.start)

    def predicate(self) -> str:
        return f'("partition" = {int(self.partition)} AND "offset" >= {int(self.start)} AND "offset" < {int(self.end)})'


def split_ranges(ranges: Sequence[OffsetRange], num_slices: int) -> list[list[OffsetRange]]:
    """Cut the ranges into ``num_slices`` slices (fewer only when there are fewer offsets) whose
    offset spans differ by at most one (control and aborted records count too: they cost a read).
    A slice may cover pieces of several partitions."""
    if num_slices < 1:
        raise ValueError("num_slices must be at least 1")
    total = sum(r.span for r in ranges)
    n = min(num_slices, total)
    bounds = [total * i // n for i in range(n + 1)] if n else []
    slices: list[list[OffsetRange]] = [[] for _ in range(n)]
    position = 0  # where the current range starts, counting the offsets of all ranges in order
    for r in ranges:
        if r.span == 0:
            continue
        lo, hi = position, position + r.span
        for i in range(n):
            a, b = max(lo, bounds[i]), min(hi, bounds[i + 1])
            if a < b:
                slices[i].append(OffsetRange(r.partition, r.start + a - lo, r.start + b - lo))
        position = hi
    return slices


def slice_predicate(ranges: Sequence[OffsetRange]) -> str:
    return " OR ".join(r.predicate() for r in ranges)


@dataclass(frozen=True)
class TopicSnapshot:
    """What one read covers, fixed before Spark runs: per partition, offsets ``[start, end)``."""

    url: str = field(repr=False)  # may hold a password
    topic: str
    isolation_level: IsolationLevel
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]
    group_id: str | None = None
    ranges: tuple[OffsetRange, ...] = field(init=False)

    def __post_init__(self) -> None:
        ranges = tuple(
            OffsetRange(p, self.start_offsets[p], max(self.start_offsets[p], self.end_offsets[p]))
            for p in sorted(self.end_offsets)
        )
        object.__setattr__(self, "ranges", ranges)

    @property
    def span(self) -> int:
        """Offsets covered (data, control and aborted records alike)."""
        return sum(r.span for r in self.ranges)

    def is_empty(self) -> bool:
        return self.span == 0

    def committable(self) -> dict[tuple[str, int], int]:
        """The end offsets as a group commits them: where the next read starts."""
        return {(self.topic, p): end for p, end in self.end_offsets.items()}

    def slices(self, num_partitions: int) -> list[list[OffsetRange]]:
        return split_ranges([r for r in self.ranges if r.span], num_partitions)

    def select_sql(self) -> str:
        return records_select(self.isolation_level, sql_literal(self.topic))

    def read(self, spark: "SparkSession", num_partitions: int | None = None) -> "DataFrame":
        return read_snapshot(spark, self, num_partitions)


def _default_parallelism(spark: "SparkSession") -> int:
    try:
        return max(1, spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        return 2


@contextlib.contextmanager
def service_broker(url: str) -> Iterator["Broker"]:
    """txlog's services over ``url`` for the length of a job (one small connection pool)."""
    from app.config import Settings
    from app.services import Broker
    from app.storage.db import Database

    broker = Broker(Database(url, pool_size=1, max_overflow=1), Settings(database_url=url))
    try:
        yield broker
    finally:
        broker.db.dispose()


def snapshot(
    url: str,
    topic: str,
    isolation_level: IsolationLevel = "read_committed",
    partitions: Sequence[int] | None = None,
    start_offsets: Mapping[int, int] | None = None,
    group_id: str | None = None,
    end_offsets: Mapping[int, int] | Literal["latest_stable", "latest"] = "latest_stable",
) -> TopicSnapshot:
    """Fix the offsets of one read, from one PostgreSQL snapshot of the partition status and the
    group's offsets.

    - ``end_offsets``: ``"latest_stable"`` (or its synonym ``"latest"``) is the end a consumer of
      that isolation level sees, as Kafka's ``endOffsets()``: the last stable offset under
      ``read_committed``, the high watermark under ``read_uncommitted``. A mapping gives explicit
      ends (a partition left out is not read); a ``read_committed`` end above the last stable offset
      is lowered to it.
    - start: ``start_offsets[p]`` if given, else the group's committed offset (``group_id``), else
      the log start offset (Kafka's ``auto.offset.reset=earliest``). Never below the log start.
    """
    from app.services import groups, topics

    validate_topic_name(topic)
    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise TxlogError(
            ErrorCode.INVALID_REQUEST, f"isolation_level must be read_committed or read_uncommitted, not {isolation_level!r}"
        )
    if isinstance(end_offsets, str) and end_offsets not in ("latest_stable", "latest"):
        raise TxlogError(
            ErrorCode.INVALID_REQUEST, f"end_offsets must be 'latest_stable', 'latest' or a mapping, not {end_offsets!r}"
        )
    with service_broker(url) as broker:
        statuses = {s.partition: s for s in topics.describe_topic(broker, topic)}
        committed: dict[int, int] = {}
        if group_id is not None:
            # KIP-447: a read_committed consumer waits for offsets pending in open transactions.
            stable = isolation_level == "read_committed"
            committed = {
                o.partition: o.offset for o in groups.offset_fetch(broker, group_id, require_stable=stable) if o.topic == topic
            }
    wanted = sorted(statuses) if partitions is None else sorted(set(partitions))
    for p in wanted:
        if p not in statuses:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic-partition {topic}-{p} does not exist")
    if isinstance(end_offsets, Mapping):
        wanted = [p for p in wanted if p in end_offsets]
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for p in wanted:
        s = statuses[p]
        visible_end = s.last_stable_offset if isolation_level == "read_committed" else s.high_watermark
        end = visible_end if isinstance(end_offsets, str) else min(int(end_offsets[p]), visible_end)
        if start_offsets is not None and p in start_offsets:
            start = int(start_offsets[p])
        else:
            start = committed.get(p, s.log_start_offset)
        starts[p] = max(start, s.log_start_offset)
        ends[p] = max(end, starts[p])
    return TopicSnapshot(url, topic, isolation_level, starts, ends, group_id)


def read_snapshot(spark: "SparkSession", snap: TopicSnapshot, num_partitions: int | None = None) -> "DataFrame":
    """The snapshot's records as a DataFrame, read over JDBC in ``num_partitions`` parallel slices
    (default: Spark's default parallelism)."""
    n = num_partitions or _default_parallelism(spark)
    slices = snap.slices(n)
    if not slices:
        return spark.createDataFrame([], record_schema())
    df = spark.read.jdbc(
        url=jdbc_url(snap.url),
        table=f"({snap.select_sql()}) AS t",
        predicates=[slice_predicate(s) for s in slices],
        properties={"driver": JDBC_DRIVER_CLASS, "fetchsize": str(JDBC_FETCH_SIZE), "sessionInitStatement": SLICE_SESSION_INIT},
    )
    return df.select(*[df[c].cast(f.dataType).alias(c) for c, f in zip(COLUMNS, record_schema().fields)])


def read_topic(
    spark: "SparkSession",
    url: str,
    topic: str,
    isolation_level: IsolationLevel = "read_committed",
    partitions: Sequence[int] | None = None,
    start_offsets: Mapping[int, int] | None = None,
    group_id: str | None = None,
    end_offsets: Mapping[int, int] | Literal["latest_stable", "latest"] = "latest_stable",
    num_partitions: int | None = None,
) -> "DataFrame":
    """A topic's records as a DataFrame with columns topic, partition, offset, key, value, headers,
    timestamp, producer_id — exactly what a consumer of ``isolation_level`` sees between the start
    offsets and the end offsets fixed now (see :func:`snapshot`)."""
    snap = snapshot(url, topic, isolation_level, partitions, start_offsets, group_id, end_offsets)
    return read_snapshot(spark, snap, num_partitions)


def commit_offsets(
    url: str,
    group_id: str,
    end_offsets: Mapping[tuple[str, int], int] | Mapping[int, int] | TopicSnapshot,
    topic: str | None = None,
    metadata: str = "",
) -> None:
    """Commit offsets to a consumer group once a job has succeeded: a snapshot's end offsets
    (``snap`` or ``snap.committable()``), or ``{partition: offset}`` with ``topic``."""
    from app.domain.groups.offsets import GroupOffset
    from app.services import groups

    if isinstance(end_offsets, TopicSnapshot):
        end_offsets = end_offsets.committable()
    offsets = []
    for k, v in end_offsets.items():
        if isinstance(k, tuple):
            t, p = k
        else:
            if topic is None:
                raise TxlogError(ErrorCode.INVALID_REQUEST, "commit_offsets: give topic= with {partition: offset}")
            t, p = topic, k
        offsets.append(GroupOffset(t, int(p), int(v), metadata))
    with service_broker(url) as broker:
        groups.offset_commit(broker, group_id, offsets)


# --- JDBC -------------------------------------------------------------------------------------------


def jdbc_url(url: str) -> str:
    """A txlog database URL (``postgresql://user:password@host:port/db``, as ``txlog db-url``
    prints) as the PostgreSQL JDBC driver wants it: ``jdbc:postgresql://host:port/db?user=…``."""
    parts = urlsplit(libpq_url(url))
    query = dict(parse_qsl(parts.query))
    userinfo, _, netloc_hosts = parts.netloc.rpartition("@")
    if "," in netloc_hosts:
        # libpq's several hosts (h1:p1,h2:p2): JDBC takes the same list; target_session_attrs=read-write
        # is its targetServerType=primary
        address = ",".join(h if ":" in h else f"{h}:5432" for h in netloc_hosts.split(","))
        parts = urlsplit(f"postgresql://{userinfo}{'@' if userinfo else ''}localhost{parts.path}")
    else:
        host = parts.hostname or query.pop("host", "")
        if not host or host.startswith("/"):
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"JDBC needs a TCP host; {url!r} has none (a unix socket cannot be used)")
        if ":" in host:
            host = f"[{host}]"
        address = f"{host}:{parts.port or int(query.pop('port', 5432))}"
    database = unquote(parts.path.lstrip("/")) or (unquote(parts.username) if parts.username else "postgres")
    params: list[tuple[str, str]] = []
    if parts.username:
        params.append(("user", unquote(parts.username)))
    if parts.password is not None:
        params.append(("password", unquote(parts.password)))
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "options", "connect_timeout"):
        if key in query:
            params.append(("connectTimeout" if key == "connect_timeout" else key, query[key]))
    if query.get("target_session_attrs") in ("read-write", "primary"):
        params.append(("targetServerType", "primary"))
    suffix = "&".join(f"{k}={quote(v, safe='')}" for k, v in params)
    return f"jdbc:postgresql://{address}/{quote(database, safe='')}" + (f"?{suffix}" if suffix else "")
