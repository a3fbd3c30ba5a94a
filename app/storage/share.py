"""Share groups' delivery state (KIP-932): per share partition its start and end offsets and its
in-flight runs of records; the share groups' configs.

A share partition's row lock (``share_partition_lock``) is held for every change of its state, so
two members, served by any two processes, never hold the same record. Its in-flight rows are read
by one primary-key range scan bounded by its window; the locks due to expire are found by a
partial index over the acquired runs alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from psycopg.types.numeric import Int4, Int8
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.share_partition import InFlightRange, RecordState, SharePartitionState, row_changes
from app.storage.db import driver
from app.storage.log import NOTIFY_CHANNEL


@dataclass(frozen=True)
class SharePartitionRow:
    group_id: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    state_epoch: int


_LOCK = """
SELECT start_offset, end_offset, state_epoch FROM txlog.share_partitions
WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s
FOR UPDATE
"""
_LOCK_SKIP = _LOCK + " SKIP LOCKED"

_CREATE = """
INSERT INTO txlog.share_partitions (group_id, topic, partition, start_offset, end_offset)
VALUES (%(g)s, %(t)s, %(p)s, %(start)s, %(start)s)
ON CONFLICT (group_id, topic, partition) DO NOTHING
"""

_IN_FLIGHT = """
SELECT first_offset, last_offset, state, delivery_count, member_id, lock_deadline_ms
FROM txlog.share_in_flight
WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s AND first_offset >= %(start)s
ORDER BY first_offset
"""


def _key(group_id: str, topic: str, partition: int) -> dict:
    return {"g": group_id, "t": topic, "p": Int4(partition)}


def share_partition_lock(
    conn: Connection, group_id: str, topic: str, partition: int, skip_locked: bool = False
) -> tuple[SharePartitionState, int] | None:
    """The share partition's state and state epoch, its row locked until the database transaction
    ends (None: the group never read the partition, or, with ``skip_locked``, another holds it)."""
    key = _key(group_id, topic, partition)
    pg = driver(conn)
    row = pg.execute(_LOCK_SKIP if skip_locked else _LOCK, key).fetchone()
    if row is None:
        return None
    start, end, epoch = row
    rows = pg.execute(_IN_FLIGHT, {**key, "start": Int8(start)}).fetchall()
    ranges = [InFlightRange(f, last, RecordState(s), dc, m, d) for f, last, s, dc, m, d in rows]
    return SharePartitionState.from_rows(start, end, ranges), epoch


def share_partition_create(conn: Connection, group_id: str, topic: str, partition: int, start_offset: int) -> None:
    """A share partition starting at ``start_offset`` with nothing in flight, unless one exists (a
    concurrent first reader made it: the caller locks it next and reads that one)."""
    driver(conn).execute(_CREATE, {**_key(group_id, topic, partition), "start": Int8(start_offset)})


_UPDATE = """
UPDATE txlog.share_partitions SET start_offset = %(start)s, end_offset = %(end)s, updated_at = now()
WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s
"""
_DELETE_RANGES = """
DELETE FROM txlog.share_in_flight
WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s AND first_offset = ANY(%(firsts)s)
"""
_UPSERT_RANGES = """
INSERT INTO txlog.share_in_flight
    (group_id, topic, partition, first_offset, last_offset, state, member_id, lock_deadline_ms, delivery_count)
SELECT %(g)s, %(t)s, %(p)s, u.first_offset, u.last_offset, u.state, u.member_id, u.deadline, u.delivery_count
FROM unnest(CAST(%(firsts)s AS bigint[]), CAST(%(lasts)s AS bigint[]), CAST(%(states)s AS smallint[]),
            CAST(%(members)s AS text[]), CAST(%(deadlines)s AS bigint[]), CAST(%(counts)s AS int[]))
     AS u(first_offset, last_offset, state, member_id, deadline, delivery_count)
ON CONFLICT (group_id, topic, partition, first_offset) DO UPDATE
SET last_offset = EXCLUDED.last_offset, state = EXCLUDED.state, member_id = EXCLUDED.member_id,
    lock_deadline_ms = EXCLUDED.lock_deadline_ms, delivery_count = EXCLUDED.delivery_count
"""
_NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"


def share_partition_write(
    conn: Connection,
    group_id: str,
    topic: str,
    partition: int,
    old: SharePartitionState,
    new: SharePartitionState,
    records_available: bool = False,
) -> None:
    """Persist the move from ``old`` (as locked) to ``new``: the window, and only the in-flight
    rows that changed (``row_changes``). ``records_available``: records became available again
    (released, or their lock expired), so share fetches waiting on the partition are woken, as
    an append wakes them (the notification arrives once this commits)."""
    key = _key(group_id, topic, partition)
    pg = driver(conn)
    deleted, upserted = row_changes(old, new)
    if (old.start_offset, old.end_offset) != (new.start_offset, new.end_offset):
        pg.execute(_UPDATE, {**key, "start": Int8(new.start_offset), "end": Int8(new.end_offset)})
    if deleted:
        pg.execute(_DELETE_RANGES, {**key, "firsts": list(deleted)})
    if upserted:
        pg.execute(
            _UPSERT_RANGES,
            {
                **key,
                "firsts": [r.first_offset for r in upserted],
                "lasts": [r.last_offset for r in upserted],
                "states": [r.state.value for r in upserted],
                "members": [r.member_id for r in upserted],
                "deadlines": [r.lock_deadline_ms for r in upserted],
                "counts": [r.delivery_count for r in upserted],
            },
        )
    if records_available:
        pg.execute(_NOTIFY, {"channel": NOTIFY_CHANNEL, "payload": f"{topic}:{partition}"})


_RESET = """
INSERT INTO txlog.share_partitions (group_id, topic, partition, start_offset, end_offset)
VALUES (%(g)s, %(t)s, %(p)s, %(start)s, %(start)s)
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET start_offset = EXCLUDED.start_offset, end_offset = EXCLUDED.end_offset,
    state_epoch = txlog.share_partitions.state_epoch + 1, updated_at = now()
"""
_DROP_IN_FLIGHT = "DELETE FROM txlog.share_in_flight WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s"


def share_partition_reset(conn: Connection, group_id: str, topic: str, partition: int, start_offset: int) -> None:
    """The share partition starts over at ``start_offset`` with nothing in flight, its state epoch
    raised (AlterShareGroupOffsets); made if the group never read the partition."""
    key = _key(group_id, topic, partition)
    pg = driver(conn)
    pg.execute(_RESET, {**key, "start": Int8(start_offset)})
    pg.execute(_DROP_IN_FLIGHT, key)


_DELETE_PARTITIONS = text(
    """
    DELETE FROM txlog.share_partitions s
    USING unnest(CAST(:topics AS text[]), CAST(:parts AS int[])) AS w(topic, partition)
    WHERE s.group_id = :g AND s.topic = w.topic AND s.partition = w.partition
    RETURNING s.topic, s.partition
    """
)
_DELETE_GROUP = text("DELETE FROM txlog.share_partitions WHERE group_id = :g RETURNING topic, partition")


def share_partitions_delete(
    conn: Connection, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
) -> list[tuple[str, int]]:
    """Forget the group's state of ``partitions`` (all of them: None), in-flight rows with it; the
    partitions that had one."""
    if partitions is None:
        rows = conn.execute(_DELETE_GROUP, {"g": group_id})
    else:
        rows = conn.execute(
            _DELETE_PARTITIONS, {"g": group_id, "topics": [t for t, _ in partitions], "parts": [p for _, p in partitions]}
        )
    return sorted((r[0], r[1]) for r in rows)


_DUE = text(
    """
    SELECT group_id, topic, partition FROM txlog.share_in_flight
    WHERE state = 1 AND lock_deadline_ms <= :now
    GROUP BY group_id, topic, partition
    ORDER BY min(lock_deadline_ms)
    LIMIT :limit
    """
)


def share_partitions_with_expired_locks(conn: Connection, now_ms: int, limit: int) -> list[tuple[str, str, int]]:
    """Share partitions holding a lock expired by ``now_ms``, earliest first, at most ``limit``
    (the partial index over acquired runs: the expired locks are all it reads)."""
    return [(r[0], r[1], r[2]) for r in conn.execute(_DUE, {"now": now_ms, "limit": limit})]


_HELD_BY = text(
    """
    SELECT DISTINCT topic, partition FROM txlog.share_in_flight
    WHERE group_id = :g AND state = 1 AND member_id = :m
    ORDER BY topic, partition
    """
)


def share_partitions_held_by(conn: Connection, group_id: str, member_id: str) -> list[tuple[str, int]]:
    """The group's share partitions where ``member_id`` holds records (reads the group's in-flight
    rows: bounded by its windows)."""
    return [(r[0], r[1]) for r in conn.execute(_HELD_BY, {"g": group_id, "m": member_id})]


_GROUP_PARTITIONS = text(
    """
    SELECT group_id, topic, partition, start_offset, end_offset, state_epoch FROM txlog.share_partitions
    WHERE group_id = :g ORDER BY topic, partition
    """
)
_GROUP_IN_FLIGHT = text(
    """
    SELECT f.topic, f.partition, f.first_offset, f.last_offset, f.state, f.delivery_count, f.member_id, f.lock_deadline_ms
    FROM txlog.share_in_flight f
    WHERE f.group_id = :g
    ORDER BY f.topic, f.partition, f.first_offset
    """
)


def share_group_state(conn: Connection, group_id: str) -> list[tuple[SharePartitionRow, list[InFlightRange]]]:
    """Every share partition of the group with its in-flight runs (bounded by the windows)."""
    ranges: dict[tuple[str, int], list[InFlightRange]] = {}
    for t, p, f, last, s, dc, m, d in conn.execute(_GROUP_IN_FLIGHT, {"g": group_id}):
        ranges.setdefault((t, p), []).append(InFlightRange(f, last, RecordState(s), dc, m, d))
    return [(SharePartitionRow(*r), ranges.get((r[1], r[2]), [])) for r in conn.execute(_GROUP_PARTITIONS, {"g": group_id})]


_GROUP_IDS = text(
    """
    SELECT group_id FROM (
        SELECT DISTINCT group_id FROM txlog.share_partitions
        UNION SELECT DISTINCT group_id FROM txlog.share_group_configs
    ) g ORDER BY group_id
    """
)


def share_group_ids(conn: Connection) -> list[str]:
    """The groups with share-partition state or share configs."""
    return list(conn.execute(_GROUP_IDS).scalars())


_CONFIGS = text("SELECT name, value FROM txlog.share_group_configs WHERE group_id = :g")
_CONFIG_SET = text(
    """
    INSERT INTO txlog.share_group_configs (group_id, name, value) VALUES (:g, :name, :value)
    ON CONFLICT (group_id, name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
    """
)
_CONFIG_DELETE = text("DELETE FROM txlog.share_group_configs WHERE group_id = :g AND name = :name")
_CONFIGS_DELETE = text("DELETE FROM txlog.share_group_configs WHERE group_id = :g")


def share_group_configs(conn: Connection, group_id: str) -> dict[str, str]:
    """The configs the group has set (a primary-key range read)."""
    return {r[0]: r[1] for r in conn.execute(_CONFIGS, {"g": group_id})}


def share_group_configs_alter(conn: Connection, group_id: str, changes: Mapping[str, str | None]) -> None:
    """Set each config given a value, remove each given None (back to its default)."""
    for name, value in sorted(changes.items()):
        if value is None:
            conn.execute(_CONFIG_DELETE, {"g": group_id, "name": name})
        else:
            conn.execute(_CONFIG_SET, {"g": group_id, "name": name, "value": value})


def share_group_configs_delete(conn: Connection, group_id: str) -> None:
    conn.execute(_CONFIGS_DELETE, {"g": group_id})
