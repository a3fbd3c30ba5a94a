"""The SQL of the in-database outbox: which partitions have rows waiting, the per-partition drain
lock, taking a partition's rows in order and deleting them, and the backlog. Rows are written by
the SQL function ``txlog.send`` (migration 0004), inside applications' own transactions."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.records import NewRecord


def outbox_partitions(conn: Connection, limit: int = 10_000) -> list[tuple[str, int]]:
    """The partitions that have committed rows waiting: one index probe per partition (a skip scan
    over ``outbox_partition``), however long the backlog."""
    rows = conn.execute(
        text(
            """
            WITH RECURSIVE tp AS (
                (SELECT topic, partition FROM txlog.outbox ORDER BY topic, partition LIMIT 1)
                UNION ALL
                SELECT n.topic, n.partition FROM tp, LATERAL (
                    SELECT o.topic, o.partition FROM txlog.outbox o
                    WHERE (o.topic, o.partition) > (tp.topic, tp.partition)
                    ORDER BY o.topic, o.partition LIMIT 1
                ) n
            )
            SELECT topic, partition FROM tp LIMIT :n
            """
        ),
        {"n": limit},
    )
    return [(r[0], r[1]) for r in rows]


def outbox_lock(conn: Connection, topic: str, partition: int) -> bool:
    """The partition's drain lock (transaction-level, advisory): drainers of a partition take turns,
    and one that finds it taken moves on. The rows are read by the statements after it, so they
    see everything the previous holder appended and deleted."""
    key = f"txlog.outbox/{topic}/{partition}"
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": key}).scalar_one())


@dataclass(frozen=True)
class OutboxRow:
    id: int
    record: NewRecord


def outbox_rows(conn: Connection, topic: str, partition: int, limit: int) -> list[OutboxRow]:
    """The partition's first ``limit`` committed rows, in id order (the caller holds the drain lock)."""
    rows = conn.execute(
        text(
            """
            SELECT id, key, value, header_keys, header_values, (extract(epoch FROM created_at) * 1000)::bigint
            FROM txlog.outbox WHERE topic = :topic AND partition = :partition
            ORDER BY id LIMIT :n
            """
        ),
        {"topic": topic, "partition": partition, "n": limit},
    )
    return [OutboxRow(r[0], NewRecord(r[1], r[2], tuple(zip(r[3], r[4])) if r[3] else (), r[5])) for r in rows]


def outbox_delete(conn: Connection, ids: list[int]) -> int:
    return conn.execute(text("DELETE FROM txlog.outbox WHERE id = ANY(:ids)"), {"ids": ids}).rowcount


@dataclass(frozen=True)
class Backlog:
    topic: str
    partition: int
    rows: int
    oldest_id: int
    oldest_created_at_ms: int
    age_ms: int


def outbox_backlog(conn: Connection) -> list[Backlog]:
    rows = conn.execute(
        text(
            """
            SELECT topic, partition, "rows", oldest_id, (extract(epoch FROM oldest_created_at) * 1000)::bigint,
                   (extract(epoch FROM age) * 1000)::bigint
            FROM txlog.outbox_backlog ORDER BY topic, partition
            """
        )
    )
    return [Backlog(*r) for r in rows]
