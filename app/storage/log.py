"""Reading a partition's log: its status (log start, high watermark, last stable offset), pages of
records, offsets by time or log position, record timestamps; and telling long-polling fetches
about appends (listening leases, notifications). Every statement is served by an index; none
scans a log."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, AsyncIterator, Sequence

import psycopg
from psycopg.types.numeric import Int4, Int8
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import PartitionStatus, StoredRecord, unknown_partition
from app.storage._sql import _ms
from app.storage.db import driver, libpq_url
from app.storage.views import page_aborted

NOTIFY_CHANNEL = "txlog_append"


def is_partition_number(partition: int) -> bool:
    """Whether the partition columns (int) can hold ``partition``: no other number names a partition."""
    return -(2**31) <= partition < 2**31


def _partition(topic: str, partition: int) -> Int4:
    """A partition number sent binary; one that no int column can hold names no partition."""
    if not is_partition_number(partition):
        raise unknown_partition(topic, partition)
    return Int4(partition)


_STATUS_SELECT = """
SELECT topic, partition, log_start_offset, high_watermark, last_stable_offset, open_transactions
FROM txlog.partition_status
"""


_STATUS_OF_PARTITION = _STATUS_SELECT + " WHERE topic = %(topic)s AND partition = %(partition)s"


def partition_status(conn: Connection, topic: str, partition: int) -> PartitionStatus:
    """One partition's status (every fetch reads it: on the driver, binary)."""
    row = (
        driver(conn)
        .execute(_STATUS_OF_PARTITION, {"topic": topic, "partition": _partition(topic, partition)}, binary=True)
        .fetchone()
    )
    if row is None:
        raise unknown_partition(topic, partition)
    return PartitionStatus(*row)


def partition_statuses(conn: Connection, wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], PartitionStatus]:
    """The status of each of ``wanted`` that exists (one statement, a primary-key lookup each)."""
    wanted = [(t, p) for t, p in wanted if is_partition_number(p)]
    if not wanted:
        return {}
    rows = (
        driver(conn)
        .execute(
            _STATUS_SELECT
            + " WHERE (topic, partition) IN (SELECT * FROM unnest(CAST(%(topics)s AS text[]), CAST(%(parts)s AS int[])))",
            {"topics": [t for t, _ in wanted], "parts": [p for _, p in wanted]},
            binary=True,
        )
        .fetchall()
    )
    return {(r[0], r[1]): PartitionStatus(*r) for r in rows}


def record_sizes(conn: Connection, wanted: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int, int], int]:
    """What the record at each (topic, partition, offset) of ``wanted`` that is stored adds to its
    partition's log position (keys, values and headers; a control record nothing): the position
    of the next offset, or the partition's next position past its last record, less its own. One
    statement, two primary-key lookups a partition; the rows themselves are not read out."""
    wanted = [(t, p, o) for t, p, o in wanted if is_partition_number(p)]
    if not wanted:
        return {}
    rows = (
        driver(conn)
        .execute(
            _RECORD_SIZES,
            {"topics": [t for t, _, _ in wanted], "parts": [p for _, p, _ in wanted], "offsets": [o for _, _, o in wanted]},
            binary=True,
        )
        .fetchall()
    )
    return {(r[0], r[1], r[2]): r[3] for r in rows}


_RECORD_SIZES = """
SELECT w.topic, w.partition, w."offset",
       COALESCE((SELECT n.position FROM txlog.records n
                 WHERE n.topic = w.topic AND n.partition = w.partition AND n."offset" = w."offset" + 1),
                p.next_position) - r.position
FROM unnest(CAST(%(topics)s AS text[]), CAST(%(parts)s AS int[]), CAST(%(offsets)s AS bigint[])) AS w(topic, partition, "offset")
JOIN txlog.records r ON r.topic = w.topic AND r.partition = w.partition AND r."offset" = w."offset"
JOIN txlog.partitions p ON p.topic = w.topic AND p.partition = w.partition
"""


def partition_status_all(conn: Connection, topic: str | None = None) -> list[PartitionStatus]:
    where = " WHERE topic = :topic" if topic is not None else ""
    rows = conn.execute(text(_STATUS_SELECT + where + " ORDER BY topic, partition"), {"topic": topic})
    return [PartitionStatus(*r) for r in rows]


# What a read of the log selects, then the aborted flag (or ``false`` when it does not ask): by
# txlog.log_records, which defines "aborted", or, for a page whose extent is known before it is
# read, by the same definition's page form (``views.page_aborted``).
RECORD_COLUMNS = f"""
r."offset", r.key, r.value, r.header_keys, r.header_values, {_ms('r."timestamp"')}, r.producer_id,
r.producer_epoch, r.sequence, r.is_transactional, r.control_type, r.position, r.txn_first_offset
"""


_RECORD_WIDTH = len(StoredRecord._fields)


def _stored(rows: Sequence[Sequence[Any]]) -> list[StoredRecord]:
    """The rows as StoredRecords, made by ``tuple.__new__`` (C, no Python call per row, twice as
    fast as ``StoredRecord._make``, whose one addition is the width check made here once)."""
    if rows and len(rows[0]) != _RECORD_WIDTH:
        raise TypeError(f"a record row has {len(rows[0])} columns, not {_RECORD_WIDTH}")
    return list(map(tuple.__new__, itertools.repeat(StoredRecord), rows))


def records_fetch(
    conn: Connection, topic: str, partition: int, start: int, upper: int, limit: int, committed_only: bool
) -> list[StoredRecord]:
    """Data records in [start, upper), in offset order, at most ``limit``. With ``committed_only``
    records of aborted transactions are left out (without, they are returned and not flagged).
    Reads at most ``upper - start`` rows of the log (offsets are dense): the caller bounds the
    range. Binary results (bytes as they are stored, no hex text), one tuple per record.

    A page's extent is known only as it is read, since aborted records and markers do not count
    against ``limit``; but it holds at least as many offsets as the records it still needs. So
    ``committed_only`` reads it in spans of known extent — first ``limit`` offsets and a quarter
    more, then, while records are missing and the range is not done, spans at least twice as long
    as the last — each span's aborted records found by the page form of the definition
    (``views.page_aborted``: an index probe per distinct transaction of the span, not per
    record). A page with up to a fifth of its offsets aborted or markers is one statement; any page
    is at most a logarithmic few. Every span reads in the caller's snapshot."""
    params = {
        "topic": topic,
        "partition": _partition(topic, partition),
        "start": Int8(start),
        "upper": Int8(upper),
        "limit": Int8(limit),
    }
    if not committed_only:
        return _stored(driver(conn).execute(_FETCH_UNCOMMITTED, params, binary=True).fetchall())
    rows: list[StoredRecord] = []
    span = 0
    while start < upper and len(rows) < limit:
        needed = limit - len(rows)
        span = max(needed + needed // 4 + 16, 2 * span)
        end = min(upper, start + span)
        params.update(start=Int8(start), upper=Int8(end), limit=Int8(needed))
        rows += _stored(driver(conn).execute(_FETCH_COMMITTED, params, binary=True).fetchall())
        start = end
    return rows


# ``records_fetch``: a span of data records. Read committed, the span's records of aborted
# transactions are left out, found by the page form of their definition (``views.page_aborted``).
_FETCH_SELECT = f"""
        SELECT {RECORD_COLUMNS}, false  -- not flagged: left out when asked, or not asked
        FROM txlog.records r
        WHERE r.topic = %(topic)s AND r.partition = %(partition)s
          AND r."offset" >= %(start)s AND r."offset" < %(upper)s
          AND r.control_type IS NULL
          """
_FETCH_ORDER = """
        ORDER BY r."offset"
        LIMIT %(limit)s
    """
_SPAN_ABORTED = page_aborted("r", "%(topic)s", "%(partition)s", "%(start)s", "%(upper)s")

_FETCH_COMMITTED = _FETCH_SELECT + f"AND NOT COALESCE({_SPAN_ABORTED}, false)" + _FETCH_ORDER
_FETCH_UNCOMMITTED = _FETCH_SELECT + _FETCH_ORDER


# ``records_fetch_log``: the page ends at the first offset whose log position lies past the byte
# budget's end (the first record's position + max_bytes), found by bisecting [start + 1, end):
# positions grow with offsets, so that costs about log2(end - start) primary-key lookups, and the
# page itself is then one range scan of exactly the rows it returns. Rows of no bytes (markers,
# empty records) at the budget's very end are in. Only the page's last row can end past the budget
# (the caller drops it unless it is the first). Then the aborted flag, or ``false``.
_PAGE_END = "(SELECT c.lo FROM cut c WHERE c.lo = c.hi)"
_FETCH_LOG_SELECT = f"""
        WITH RECURSIVE budget AS (
            SELECT s.position + CAST(%(max_bytes)s AS bigint) AS end_position
            FROM txlog.records s
            WHERE s.topic = %(topic)s AND s.partition = %(partition)s AND s."offset" = %(start)s
        ), cut(lo, hi) AS (
            SELECT CAST(%(start)s AS bigint) + 1, CAST(%(end)s AS bigint) FROM budget
          UNION ALL
            SELECT CASE WHEN m.pos > b.end_position THEN c.lo ELSE m.mid + 1 END,
                   CASE WHEN m.pos > b.end_position THEN m.mid ELSE c.hi END
            FROM cut c
            CROSS JOIN budget b
            CROSS JOIN LATERAL (
                SELECT (c.lo + c.hi) / 2 AS mid,
                       (SELECT s.position FROM txlog.records s
                        WHERE s.topic = %(topic)s AND s.partition = %(partition)s AND s."offset" = (c.lo + c.hi) / 2) AS pos
            ) m
            WHERE c.lo < c.hi
        )
        SELECT {RECORD_COLUMNS}, """
_FETCH_LOG_PAGE = f"""
        FROM txlog.records r
        WHERE r.topic = %(topic)s AND r.partition = %(partition)s
          AND r."offset" >= %(start)s AND r."offset" < {_PAGE_END}
        ORDER BY r."offset"
    """
_PAGE_ABORTED = page_aborted("r", "%(topic)s", "%(partition)s", "%(start)s", _PAGE_END)

_FETCH_LOG_WITH_ABORTED = _FETCH_LOG_SELECT + _PAGE_ABORTED + _FETCH_LOG_PAGE
_FETCH_LOG = _FETCH_LOG_SELECT + "false  -- not asked: read_uncommitted reads no aborted-transaction index" + _FETCH_LOG_PAGE


def records_fetch_log(
    conn: Connection, topic: str, partition: int, start: int, end: int, max_bytes: int, with_aborted: bool
) -> list[StoredRecord]:
    """Every row of the log from ``start`` (control records and records of aborted transactions
    included), in offset order, below ``end`` and within ``max_bytes`` of data counted from the
    first row's log position: the rows that start inside the budget (or at its end), the first
    always, so that only the last one may end past it (``start`` must be below ``end``, and at or
    above the log start). ``with_aborted`` flags rows of aborted transactions
    (``views.page_aborted``: an index probe per distinct transaction of the page); otherwise
    the index is not read. Reads at most ``end - start`` rows and about log2 of that in lookups;
    binary results."""
    params = {
        "topic": topic,
        "partition": _partition(topic, partition),
        "start": Int8(start),
        "end": Int8(end),
        "max_bytes": Int8(max_bytes),
    }
    sql = _FETCH_LOG_WITH_ABORTED if with_aborted else _FETCH_LOG
    return _stored(driver(conn).execute(sql, params, binary=True).fetchall())


def partition_offset_at_time(conn: Connection, topic: str, partition: int, start: int, end: int, time_ms: int) -> int:
    """The first offset in [start, end) whose timestamp is at or after ``time_ms``, else ``end``:
    the records before it are all older. Timestamps are the producers' (they need not grow with
    offsets), so this reads the records in order — a range scan of the primary key that stops at
    the first young one, at most ``end - start`` rows."""
    return conn.execute(
        text(
            """
            SELECT COALESCE((
                SELECT r."offset" FROM txlog.records r
                WHERE r.topic = :topic AND r.partition = :partition AND r."offset" >= :start AND r."offset" < :end
                  AND r."timestamp" >= to_timestamp(:t / 1000.0)
                ORDER BY r."offset"
                LIMIT 1), :end)
            """
        ),
        {"topic": topic, "partition": partition, "start": start, "end": end, "t": time_ms},
    ).scalar_one()


def partition_offset_at_position(conn: Connection, topic: str, partition: int, position: int) -> int:
    """The first offset at or after the log start whose log position is at least ``position`` (the
    high watermark if none): a binary search over the offsets (positions grow with them), one
    primary-key lookup a step."""
    row = conn.execute(
        text(
            """
            WITH RECURSIVE search(lo, hi) AS (
                SELECT p.log_start_offset, p.next_offset FROM txlog.partitions p
                WHERE p.topic = :topic AND p.partition = :partition
              UNION ALL
                SELECT CASE WHEN m.pos >= :position THEN s.lo ELSE m.mid + 1 END,
                       CASE WHEN m.pos >= :position THEN m.mid ELSE s.hi END
                FROM search s
                CROSS JOIN LATERAL (
                    SELECT (s.lo + s.hi) / 2 AS mid,
                           (SELECT r.position FROM txlog.records r
                            WHERE r.topic = :topic AND r.partition = :partition AND r."offset" = (s.lo + s.hi) / 2) AS pos
                ) m
                WHERE s.lo < s.hi
            )
            SELECT lo FROM search WHERE lo = hi
            """
        ),
        {"topic": topic, "partition": partition, "position": position},
    ).first()
    assert row is not None
    return row[0]


def fetch_listeners_register(conn: Connection, partitions: Sequence[tuple[str, int]], lease_ms: int) -> set[tuple[str, int]]:
    """Appends to each of ``partitions`` notify for ``lease_ms`` from now; the partitions that
    exist (the others get no lease), in one statement. Taken under a key-share lock of each
    partition row, in (topic, partition) order as appends lock them, so it waits for an append in
    flight to commit: every append that commits after it sees the lease, every one before is
    readable."""
    if not partitions:
        return set()
    wanted = sorted(set(partitions))
    rows = conn.execute(
        text(
            """
            WITH p AS (
                SELECT p.topic, p.partition FROM txlog.partitions p
                JOIN unnest(CAST(:topics AS text[]), CAST(:parts AS int[])) AS w(topic, partition)
                  ON p.topic = w.topic AND p.partition = w.partition
                ORDER BY p.topic, p.partition
                FOR KEY SHARE OF p
            )
            INSERT INTO txlog.fetch_listeners (topic, partition, expires_at)
            SELECT topic, partition, clock_timestamp() + make_interval(secs => :lease_ms / 1000.0) FROM p
            ON CONFLICT (topic, partition) DO UPDATE
            SET expires_at = greatest(txlog.fetch_listeners.expires_at, EXCLUDED.expires_at)
            RETURNING topic, partition
            """
        ),
        {"topics": [t for t, _ in wanted], "parts": [p for _, p in wanted], "lease_ms": lease_ms},
    ).all()
    return {(topic, partition) for topic, partition in rows}


@contextlib.asynccontextmanager
async def append_notifications(database_url: str) -> AsyncIterator[AsyncIterator[str]]:
    """A connection of its own LISTENing to appends (``NOTIFY txlog_append``, sent by ``log_append``
    while a partition has a listening lease): yields the stream of their payloads,
    ``"topic:partition"``, each arriving once the append committed. Ends with the connection."""
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(NOTIFY_CHANNEL)))
        yield (note.payload async for note in conn.notifies())


# The latest time a record's timestamp can hold (PostgreSQL's last timestamptz, 294276-12-31, to the
# whole second): a record is never later, and a later time does not convert to a timestamp.
LAST_RECORD_TIME_MS = 9_224_318_015_999_000


def partition_offsets_at(
    conn: Connection, times_ms: Sequence[int], topic: str | None = None, partition: int | None = None
) -> dict[tuple[str, int], list[int]]:
    """Per partition, the first offset whose timestamp is at or after each of ``times_ms`` — the
    partition's high watermark when there is none (Kafka's ListOffsets by timestamp). Offsets are
    dense, so the difference between two answers is the number of records appended in between.

    A binary search over the offsets (timestamps grow with offsets, as with log-append time): each
    step is one primary-key lookup, so a search costs about log2(log size) lookups and no log is
    scanned; a partition idle since before a time costs one lookup."""
    rows = conn.execute(
        text(
            """
            WITH RECURSIVE tails AS (
                SELECT p.topic, p.partition, p.log_start_offset, p.next_offset,
                       (SELECT r."timestamp" FROM txlog.records r
                        WHERE r.topic = p.topic AND r.partition = p.partition AND r."offset" = p.next_offset - 1) AS last_ts
                FROM txlog.partitions p
                WHERE (CAST(:topic AS text) IS NULL OR p.topic = CAST(:topic AS text))
                  AND (CAST(:partition AS int) IS NULL OR p.partition = CAST(:partition AS int))
            ), search(topic, partition, i, t, lo, hi) AS (
                -- A partition whose last record is older than a time needs no search for it.
                SELECT p.topic, p.partition, b.i, to_timestamp(b.t / 1000.0),
                       CASE WHEN p.last_ts >= to_timestamp(b.t / 1000.0) THEN p.log_start_offset ELSE p.next_offset END,
                       p.next_offset
                FROM tails p
                CROSS JOIN unnest(CAST(:times AS bigint[])) WITH ORDINALITY AS b(t, i)
              UNION ALL
                SELECT s.topic, s.partition, s.i, s.t,
                       CASE WHEN m.ts >= s.t THEN s.lo ELSE m.mid + 1 END,
                       CASE WHEN m.ts >= s.t THEN m.mid ELSE s.hi END
                FROM search s
                CROSS JOIN LATERAL (
                    SELECT (s.lo + s.hi) / 2 AS mid,
                           (SELECT r."timestamp" FROM txlog.records r
                            WHERE r.topic = s.topic AND r.partition = s.partition
                              AND r."offset" = (s.lo + s.hi) / 2) AS ts
                ) m
                WHERE s.lo < s.hi
            )
            SELECT topic, partition, i, lo FROM search WHERE lo = hi ORDER BY topic, partition, i
            """
        ),
        {"times": list(times_ms), "topic": topic, "partition": partition},
    )
    out: dict[tuple[str, int], list[int]] = {}
    for t, p, _, offset in rows:
        out.setdefault((t, p), []).append(offset)
    return out


def record_timestamp(conn: Connection, topic: str, partition: int, offset: int) -> int | None:
    """The timestamp (epoch ms) of the record at ``offset``, if it is stored."""
    return conn.execute(
        text(
            f"""SELECT {_ms('r."timestamp"')} FROM txlog.records r
            WHERE r.topic = :topic AND r.partition = :partition AND r."offset" = :offset"""
        ),
        {"topic": topic, "partition": partition, "offset": offset},
    ).scalar()


def partition_max_timestamp(conn: Connection, topic: str, partition: int, start: int, end: int) -> tuple[int, int] | None:
    """The data record with the largest timestamp in [start, end) — the first of them when several
    share it — as (offset, timestamp ms) (Kafka's ListOffsets MAX_TIMESTAMP). Timestamps are the
    producers' and no index orders them: this reads every record of the range once."""
    row = conn.execute(
        text(
            f"""
            SELECT r."offset", {_ms('r."timestamp"')} FROM txlog.records r
            WHERE r.topic = :topic AND r.partition = :partition AND r."offset" >= :start AND r."offset" < :end
              AND r.control_type IS NULL
            ORDER BY r."timestamp" DESC, r."offset"
            LIMIT 1
            """
        ),
        {"topic": topic, "partition": partition, "start": start, "end": end},
    ).first()
    return (row[0], row[1]) if row else None
