"""Retention: the partitions with a limit, moving a log start forward, and trimming the records
left below it."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import PartitionLogSize, PartitionStatus, RetainedPartition, unknown_partition
from app.storage.log import partition_status

# The size of a partition's log (``p``, its txlog.partitions row): the bytes of data records from
# its log start to its high watermark, its next position less the position of the record at its
# log start. One primary-key lookup, whatever the log's length. retention.bytes bounds it and
# DescribeLogDirs answers it.
LOG_SIZE_BYTES = """p.next_position - COALESCE((SELECT r.position FROM txlog.records r
    WHERE r.topic = p.topic AND r.partition = p.partition AND r."offset" = p.log_start_offset), p.next_position)"""


def partition_lock(conn: Connection, topic: str, partition: int) -> PartitionStatus:
    """The append lock of a partition, and its status read under it (nothing can open a
    transaction or write a marker on it meanwhile, so its last stable offset holds until commit)."""
    row = conn.execute(
        text("SELECT 1 FROM txlog.partitions WHERE topic = :topic AND partition = :partition FOR UPDATE"),
        {"topic": topic, "partition": partition},
    ).first()
    if row is None:
        raise unknown_partition(topic, partition)
    return partition_status(conn, topic, partition)


def log_start_advance(conn: Connection, topic: str, partition: int, offset: int) -> None:
    """Move the log start offset forward (the caller holds the partition lock and has checked it
    stays at or below the last stable offset)."""
    conn.execute(
        text(
            "UPDATE txlog.partitions SET log_start_offset = GREATEST(log_start_offset, :offset) "
            "WHERE topic = :topic AND partition = :partition"
        ),
        {"topic": topic, "partition": partition, "offset": offset},
    )


def partitions_with_retention(conn: Connection, default_ms: int, default_bytes: int) -> list[RetainedPartition]:
    """Every partition with a time or size limit (its topic's retention.ms / retention.bytes, else
    the defaults; -1 is none) and some log above its log start. A config value that is not an
    integer (stored before configs were validated) counts as unset: it cannot stop retention."""
    rows = conn.execute(
        text(
            f"""
            SELECT s.topic, s.partition, s.log_start_offset, s.last_stable_offset,
                   CASE WHEN c.ms >= 0 THEN c.ms END, CASE WHEN c.bytes >= 0 THEN c.bytes END,
                   p.next_position, {LOG_SIZE_BYTES}
            FROM txlog.topics t
            CROSS JOIN LATERAL (
                SELECT COALESCE(CASE WHEN t.config->>'retention.ms' ~ '^-?[0-9]{{1,19}}$'
                                     THEN LEAST((t.config->>'retention.ms')::numeric, 9223372036854775807)::bigint END,
                                CAST(:default_ms AS bigint)) AS ms,
                       COALESCE(CASE WHEN t.config->>'retention.bytes' ~ '^-?[0-9]{{1,19}}$'
                                     THEN LEAST((t.config->>'retention.bytes')::numeric, 9223372036854775807)::bigint END,
                                CAST(:default_bytes AS bigint)) AS bytes
            ) c
            JOIN txlog.partitions p ON p.topic = t.name
            JOIN txlog.partition_status s ON s.topic = p.topic AND s.partition = p.partition
            WHERE p.log_start_offset < p.next_offset AND (c.ms >= 0 OR c.bytes >= 0)
            ORDER BY s.topic, s.partition
            """
        ),
        {"default_ms": default_ms, "default_bytes": default_bytes},
    )
    return [RetainedPartition(*r) for r in rows]


def partition_log_sizes(conn: Connection, topics: Sequence[str] | None = None) -> list[PartitionLogSize]:
    """The size of every partition's log (``LOG_SIZE_BYTES``), of ``topics`` only when given, by
    topic and partition."""
    where = "" if topics is None else "WHERE p.topic = ANY(CAST(:topics AS text[]))"
    rows = conn.execute(
        text(f"SELECT p.topic, p.partition, {LOG_SIZE_BYTES} FROM txlog.partitions p {where} ORDER BY p.topic, p.partition"),
        {"topics": list(topics or ())},
    )
    return [PartitionLogSize(*r) for r in rows]


def partitions_to_trim(conn: Connection, limit: int = 1000) -> list[tuple[str, int]]:
    """Partitions with records still stored below their log start."""
    rows = conn.execute(
        text(
            "SELECT topic, partition FROM txlog.partitions "
            "WHERE stored_start_offset < log_start_offset ORDER BY topic, partition LIMIT :limit"
        ),
        {"limit": limit},
    )
    return [(r[0], r[1]) for r in rows]


def log_trim(conn: Connection, topic: str, partition: int, batch: int) -> int | None:
    """Delete the next ``batch`` offsets of a partition stored below its log start, with the
    aborted ranges that end before them, and record that they are gone; the number of records
    deleted, or ``None`` when another sweeper is trimming the partition right now.

    The partition's trim lock (a transaction-level advisory lock: sweepers of a partition take
    turns, and one that finds it taken moves on) is taken first, then the stored start and the log
    start are read as committed — the log start only moves forward, so nothing at or above it is
    ever deleted. The append lock is not taken: the partition row is updated last, for that one
    statement until commit."""
    if not _trim_lock(conn, topic, partition):
        return None
    row = conn.execute(
        text(
            "SELECT stored_start_offset, log_start_offset FROM txlog.partitions WHERE topic = :topic AND partition = :partition"
        ),
        {"topic": topic, "partition": partition},
    ).first()
    if row is None or row[0] >= row[1]:
        return 0
    end = min(row[1], row[0] + batch)
    deleted = _records_delete(conn, topic, partition, row[0], end)
    conn.execute(
        text(
            "UPDATE txlog.partitions SET stored_start_offset = GREATEST(stored_start_offset, :end) "
            "WHERE topic = :topic AND partition = :partition"
        ),
        {"topic": topic, "partition": partition, "end": end},
    )
    return deleted


def deleted_partitions_to_trim(conn: Connection, name: str | None = None, limit: int = 1000) -> list[tuple[str, int]]:
    """Deleted topics' partitions with records still stored (of topic ``name``, or of any)."""
    rows = conn.execute(
        text(
            "SELECT topic, partition FROM txlog.deleted_partitions WHERE topic = :name OR CAST(:name AS text) IS NULL "
            "ORDER BY deleted_at, topic, partition LIMIT :limit"
        ),
        {"name": name, "limit": limit},
    )
    return [(r[0], r[1]) for r in rows]


def deleted_log_trim(conn: Connection, topic: str, partition: int, batch: int) -> int | None:
    """``log_trim`` for a deleted topic's partition (``deleted_partitions``): its next ``batch``
    offsets, with the aborted ranges that end before them; its row goes with its last batch."""
    if not _trim_lock(conn, topic, partition):
        return None
    row = conn.execute(
        text(
            "SELECT stored_start_offset, end_offset FROM txlog.deleted_partitions WHERE topic = :topic AND partition = :partition"
        ),
        {"topic": topic, "partition": partition},
    ).first()
    if row is None:
        return 0
    end = min(row[1], row[0] + batch)
    deleted = _records_delete(
        conn, topic, partition, row[0], end
    )  # an ABORT marker is below the end: the last batch takes every range
    params = {"topic": topic, "partition": partition, "end": end}
    if end >= row[1]:
        conn.execute(text("DELETE FROM txlog.deleted_partitions WHERE topic = :topic AND partition = :partition"), params)
    else:
        conn.execute(
            text(
                "UPDATE txlog.deleted_partitions SET stored_start_offset = :end WHERE topic = :topic AND partition = :partition"
            ),
            params,
        )
    return deleted


def _trim_lock(conn: Connection, topic: str, partition: int) -> bool:
    """The partition's trim lock, if no one holds it: a transaction-level advisory lock, so that
    trimmers of a partition take turns and one that finds it taken moves on."""
    key = f"txlog.log_trim/{topic}/{partition}"
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": key}).scalar_one())


def _records_delete(conn: Connection, topic: str, partition: int, start: int, end: int) -> int:
    """Delete a partition's records from ``start`` to ``end`` and the aborted ranges that end
    before ``end``: how many records. An aborted range is dropped with its ABORT marker (its last
    offset); one that straddles ``end`` stays, and keeps hiding its producer's records above it."""
    params = {"topic": topic, "partition": partition, "start": start, "end": end}
    deleted = conn.execute(
        text(
            'DELETE FROM txlog.records WHERE topic = :topic AND partition = :partition AND "offset" >= :start AND "offset" < :end'
        ),
        params,
    ).rowcount
    conn.execute(
        text("DELETE FROM txlog.aborted_txns WHERE topic = :topic AND partition = :partition AND last_offset < :end"), params
    )
    return deleted
