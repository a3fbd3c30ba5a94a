"""Share groups' delivery state (KIP-932): per share partition its start and end offsets and its
in-flight runs of records; the share groups' configs.

A share partition's row lock (``share_partition_lock``) is held for every change of its state, so
two members, served by any two processes, never hold the same record. Its in-flight rows are read
by one primary-key range scan bounded by its window; the locks due to expire are found by a
partial index over the acquired runs alone.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from psycopg.types.numeric import Int4, Int8
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import PartitionStatus
from app.domain.share_partition import InFlightRange, RecordState, SharePartitionState, row_changes
from app.storage.db import driver
from app.storage.log import _STATUS_SELECT, NOTIFY_CHANNEL, is_partition_number


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


# Read once the share partition's row lock is held, so in one snapshot taken after it: the
# in-flight runs (which the lock's last holder may have just changed: a statement that waited for
# the lock re-reads only the locked row, so they are never read in the locking statement), the
# log's status, the topic's id, and the group's configs when asked for.
_OPENED = f"""
SELECT st.log_start_offset, st.high_watermark, st.last_stable_offset, st.open_transactions,
       f.firsts, f.lasts, f.states, f.counts, f.members, f.deadlines, c.names, c.vals,
       (SELECT topic_id FROM txlog.topics WHERE name = %(t)s) AS topic_id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL ({_STATUS_SELECT} WHERE topic = %(t)s AND partition = %(p)s) AS st ON true
CROSS JOIN LATERAL (
    SELECT array_agg(first_offset ORDER BY first_offset) AS firsts, array_agg(last_offset ORDER BY first_offset) AS lasts,
           array_agg(state ORDER BY first_offset) AS states, array_agg(delivery_count ORDER BY first_offset) AS counts,
           array_agg(member_id ORDER BY first_offset) AS members, array_agg(lock_deadline_ms ORDER BY first_offset) AS deadlines
    FROM txlog.share_in_flight
    WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s
      AND first_offset >= (SELECT start_offset FROM txlog.share_partitions WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s)
) AS f
CROSS JOIN LATERAL (
    SELECT array_agg(name) AS names, array_agg(value) AS vals FROM txlog.share_group_configs
    WHERE group_id = %(g)s AND %(configs)s
) AS c
"""


@dataclass(frozen=True)
class OpenedSharePartition:
    """A share partition as locked for an operation: its state, the log's status (None: the
    partition does not exist), the group's configs set (None: not asked for), and the id of the
    topic of that name now (None: there is none)."""

    state: SharePartitionState
    status: PartitionStatus | None
    configs: dict[str, str] | None
    topic_id: uuid.UUID | None


def share_partition_open(
    conn: Connection, group_id: str, topic: str, partition: int, with_configs: bool = False
) -> OpenedSharePartition | None:
    """``share_partitions_open`` of one share partition."""
    return share_partitions_open(conn, group_id, [(topic, partition)], with_configs)[0]


def share_partitions_open(
    conn: Connection, group_id: str, partitions: Sequence[tuple[str, int]], with_configs: bool = False
) -> list[OpenedSharePartition | None]:
    """``share_partition_lock`` for a share fetch or acknowledgement, of each of ``partitions`` in
    the order given, in two statements each: the row lock, then (in a snapshot taken once it is
    held) the in-flight runs with the partition's status, the topic's id and, ``with_configs``,
    the group's configs (read with the first partition only). All in one round trip (with the
    transaction's BEGIN, when they are its first): pipelined, each statement still starts only
    once the one before it has finished, so each reading statement's snapshot is taken with its
    lock held. None for a partition the group never read."""
    pg = driver(conn)
    sent: list[tuple[tuple[str, int], Any, Any] | None] = []
    with pg.pipeline():
        for n, (topic, partition) in enumerate(partitions):
            if not is_partition_number(partition):
                sent.append(None)
                continue
            key = _key(group_id, topic, partition)
            locking = pg.execute(_LOCK, key)
            reading = pg.execute(_OPENED, {**key, "configs": with_configs and n == 0}, binary=True)
            sent.append(((topic, partition), locking, reading))
    return [None if one is None else _opened(*one, with_configs=with_configs and n == 0) for n, one in enumerate(sent)]


def _opened(where: tuple[str, int], locking: Any, reading: Any, with_configs: bool) -> OpenedSharePartition | None:
    topic, partition = where
    row = locking.fetchone()
    if row is None:
        return None
    start, end, _epoch = row
    got = reading.fetchone()
    assert got is not None
    lso, hw, last_stable, open_txns, firsts, lasts, states, counts, members, deadlines, names, vals, topic_id = got
    ranges = (
        [
            InFlightRange(f, last, RecordState(st), dc, m, d)
            for f, last, st, dc, m, d in zip(firsts, lasts, states, counts, members, deadlines)
        ]
        if firsts
        else []
    )
    status = None if lso is None else PartitionStatus(topic, partition, lso, hw, last_stable, open_txns)
    configs = (dict(zip(names, vals)) if names else {}) if with_configs else None
    return OpenedSharePartition(SharePartitionState.from_rows(start, end, ranges), status, configs, topic_id)


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
WHERE group_id = %(g)s AND topic = %(t)s AND partition = %(p)s AND first_offset = ANY(%(firsts_deleted)s)
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


@dataclass(frozen=True)
class SharePartitionWrite:
    """A share partition's move from ``old`` (as locked) to ``new``; ``records_available``: records
    became available again (released, or their lock expired)."""

    topic: str
    partition: int
    old: SharePartitionState
    new: SharePartitionState
    records_available: bool = False


def share_partition_write(
    conn: Connection,
    group_id: str,
    topic: str,
    partition: int,
    old: SharePartitionState,
    new: SharePartitionState,
    records_available: bool = False,
) -> None:
    """``share_partitions_write`` of one share partition, not committing."""
    share_partitions_write(conn, group_id, [SharePartitionWrite(topic, partition, old, new, records_available)])


def share_partitions_write(conn: Connection, group_id: str, writes: Sequence[SharePartitionWrite], commit: bool = False) -> None:
    """Persist each move: the window, and only the in-flight rows that changed (``row_changes``),
    one statement a share partition; where records became available again, share fetches waiting
    on the partition are woken, as an append wakes them (the notification arrives once this
    commits). ``commit``: these are the database transaction's last statements, and it commits
    with them. All in one round trip, pipelined: the caller's transaction scope then ends with
    nothing left to commit (a COMMIT with no transaction open sends nothing)."""
    statements = [one for one in (_write_statement(group_id, w) for w in writes) if one is not None]
    pg = driver(conn)
    if not commit and len(statements) == 1:
        pg.execute(*statements[0])
        return
    if not statements and not commit:
        return
    with pg.pipeline():
        for sql, params in statements:
            pg.execute(sql, params)
        if commit:
            pg.commit()


def _write_statement(group_id: str, w: SharePartitionWrite) -> tuple[str, dict] | None:
    key: dict = _key(group_id, w.topic, w.partition)
    deleted, upserted = row_changes(w.old, w.new)
    parts: list[str] = []
    if (w.old.start_offset, w.old.end_offset) != (w.new.start_offset, w.new.end_offset):
        parts.append(_UPDATE)
        key.update(start=Int8(w.new.start_offset), end=Int8(w.new.end_offset))
    if deleted:
        parts.append(_DELETE_RANGES)
        key["firsts_deleted"] = list(deleted)
    if upserted:
        parts.append(_UPSERT_RANGES)
        key.update(
            firsts=[r.first_offset for r in upserted],
            lasts=[r.last_offset for r in upserted],
            states=[r.state.value for r in upserted],
            members=[r.member_id for r in upserted],
            deadlines=[r.lock_deadline_ms for r in upserted],
            counts=[r.delivery_count for r in upserted],
        )
    if not parts and not w.records_available:
        return None
    # One statement: each change a data-modifying WITH query (the rows deleted and those written
    # are distinct first offsets, so no row is changed twice), the notification its SELECT.
    sql = "WITH " + ", ".join(f"w{i} AS ({part})" for i, part in enumerate(parts)) + " " if parts else ""
    if w.records_available:
        key.update(channel=NOTIFY_CHANNEL, payload=f"{w.topic}:{w.partition}")
        sql += "SELECT pg_notify(%(channel)s, %(payload)s)"
    else:
        sql += "SELECT 1"
    return sql, key


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
