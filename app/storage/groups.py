"""Consumer groups' offsets: those committed, and those a transaction holds pending until it ends."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.groups.offsets import GroupOffset, GroupOffsetRow
from app.storage._sql import _compact, _int8
from app.storage.db import driver


def group_offsets_upsert(conn: Connection, group_id: str, offsets: Sequence[GroupOffset]) -> None:
    offsets = sorted(offsets, key=lambda o: (o.topic, o.partition))  # fixed lock order
    conn.execute(
        text(
            """
            INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata, leader_epoch, committed_at)
            SELECT :group_id, u.topic, u.partition, u.off, u.meta, u.epoch, now()
            FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[]), CAST(:offs AS bigint[]), CAST(:metas AS bytea[]),
                        CAST(:epochs AS int[]))
                 AS u(topic, partition, off, meta, epoch)
            ON CONFLICT (group_id, topic, partition) DO UPDATE
            SET "offset" = EXCLUDED."offset", metadata = EXCLUDED.metadata, leader_epoch = EXCLUDED.leader_epoch,
                committed_at = EXCLUDED.committed_at
            """
        ),
        {
            "group_id": group_id,
            "topics": [o.topic for o in offsets],
            "parts": [o.partition for o in offsets],
            "offs": [o.offset for o in offsets],
            "metas": [o.metadata.encode() for o in offsets],
            "epochs": [o.leader_epoch for o in offsets],
        },
    )


_GROUP_OFFSET_COLUMNS = """
    k.topic, k.partition, g."offset", g.metadata,
    EXISTS (SELECT 1 FROM txlog.pending_group_offsets p
            WHERE p.group_id = :g AND p.topic = k.topic AND p.partition = k.partition) AS pending,
    g.leader_epoch
"""

_GROUP_OFFSETS_OF = text(
    f"""
    SELECT {_GROUP_OFFSET_COLUMNS}
    FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[])) WITH ORDINALITY AS k(topic, partition, i)
    LEFT JOIN txlog.group_offsets g ON g.group_id = :g AND g.topic = k.topic AND g.partition = k.partition
    ORDER BY k.i
    """
)

_GROUP_OFFSETS_ALL = text(
    f"""
    WITH k AS (
        SELECT topic, partition FROM txlog.group_offsets WHERE group_id = :g
        UNION
        SELECT topic, partition FROM txlog.pending_group_offsets WHERE group_id = :g
    )
    SELECT {_GROUP_OFFSET_COLUMNS}
    FROM k
    LEFT JOIN txlog.group_offsets g ON g.group_id = :g AND g.topic = k.topic AND g.partition = k.partition
    ORDER BY k.topic, k.partition
    """
)


def group_offsets_fetch(
    conn: Connection, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
) -> list[GroupOffsetRow]:
    """A group's committed offset of each of ``partitions`` (in their order), or of every partition
    with a committed or pending offset (in (topic, partition) order), each flagged if a transaction
    has an offset pending for it (a primary-key lookup per partition in each table)."""
    if partitions is None:
        rows = conn.execute(_GROUP_OFFSETS_ALL, {"g": group_id})
    else:
        rows = conn.execute(
            _GROUP_OFFSETS_OF, {"g": group_id, "topics": [t for t, _ in partitions], "parts": [p for _, p in partitions]}
        )
    return [GroupOffsetRow(r[0], r[1], r[2], text_of(r[3]), *r[4:]) for r in rows]


def group_ids(conn: Connection, among: Sequence[str] | None = None) -> list[str]:
    """The groups that have committed offsets, or offsets pending in a transaction: all of them, or
    those of ``among``."""
    if among is None:
        rows = conn.execute(
            text("SELECT group_id FROM txlog.group_offsets UNION SELECT group_id FROM txlog.pending_group_offsets ORDER BY 1")
        )
    else:
        rows = conn.execute(
            text(
                "SELECT group_id FROM txlog.group_offsets WHERE group_id = ANY(CAST(:ids AS text[])) "
                "UNION SELECT group_id FROM txlog.pending_group_offsets WHERE group_id = ANY(CAST(:ids AS text[])) ORDER BY 1"
            ),
            {"ids": list(among)},
        )
    return list(rows.scalars())


def group_offsets_delete(conn: Connection, group_id: str) -> int:
    """Remove a group's committed offsets and those pending in transactions: how many there were."""
    row = conn.execute(
        text(
            """
            WITH committed AS (DELETE FROM txlog.group_offsets WHERE group_id = :g RETURNING 1),
                 pending AS (DELETE FROM txlog.pending_group_offsets WHERE group_id = :g RETURNING 1)
            SELECT (SELECT count(*) FROM committed) + (SELECT count(*) FROM pending)
            """
        ),
        {"g": group_id},
    )
    return int(row.scalar_one())


def group_offsets_delete_partitions(conn: Connection, group_id: str, partitions: Sequence[tuple[str, int]]) -> None:
    """Remove a group's offsets of ``partitions``, committed and pending in transactions."""
    conn.execute(
        text(
            """
            WITH wanted AS (SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[])) AS w(topic, partition)),
                 committed AS (DELETE FROM txlog.group_offsets o USING wanted w
                               WHERE o.group_id = :g AND o.topic = w.topic AND o.partition = w.partition),
                 pending AS (DELETE FROM txlog.pending_group_offsets o USING wanted w
                             WHERE o.group_id = :g AND o.topic = w.topic AND o.partition = w.partition)
            SELECT 1
            """
        ),
        {"g": group_id, "topics": [t for t, _ in partitions], "parts": [p for _, p in partitions]},
    )


def pending_offsets_upsert(
    conn: Connection, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int, offsets: Sequence[GroupOffset]
) -> None:
    offsets = sorted(offsets, key=lambda o: (o.topic, o.partition))
    conn.execute(
        text(
            """
            INSERT INTO txlog.pending_group_offsets (group_id, topic, partition, transactional_id, producer_id,
                                                     producer_epoch, "offset", metadata, leader_epoch)
            SELECT :group_id, u.topic, u.partition, :tid, :pid, :epoch, u.off, u.meta, u.leader_epoch
            FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[]), CAST(:offs AS bigint[]), CAST(:metas AS bytea[]),
                        CAST(:leader_epochs AS int[]))
                 AS u(topic, partition, off, meta, leader_epoch)
            ON CONFLICT (group_id, topic, partition, transactional_id) DO UPDATE
            SET "offset" = EXCLUDED."offset", metadata = EXCLUDED.metadata, leader_epoch = EXCLUDED.leader_epoch,
                producer_id = EXCLUDED.producer_id, producer_epoch = EXCLUDED.producer_epoch, committed_at = now()
            """
        ),
        {
            "group_id": group_id,
            "tid": transactional_id,
            "pid": _int8(producer_id),
            "epoch": producer_epoch,
            "topics": [o.topic for o in offsets],
            "parts": [o.partition for o in offsets],
            "offs": [o.offset for o in offsets],
            "metas": [o.metadata.encode() for o in offsets],
            "leader_epochs": [o.leader_epoch for o in offsets],
        },
    )


# The CTEs that end a transaction's pending offsets, if the statement's ``offsets_gate`` holds (true
# alone, or the condition a statement ending the transaction puts on itself): removed, and when
# ``%(commit_offsets)s`` made its groups' offsets (group offset rows written in (group, topic,
# partition) order).
PENDING_OFFSETS_CTES = """offsets_taken AS (
        DELETE FROM txlog.pending_group_offsets WHERE transactional_id = %(tid)s AND (SELECT go FROM offsets_gate)
        RETURNING group_id, topic, partition, "offset", metadata, leader_epoch
    ), offsets_applied AS (
        INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata, leader_epoch, committed_at)
        SELECT group_id, topic, partition, "offset", metadata, leader_epoch, now() FROM offsets_taken
        WHERE CAST(%(commit_offsets)s AS boolean)
        ORDER BY group_id, topic, partition
        ON CONFLICT (group_id, topic, partition) DO UPDATE
        SET "offset" = EXCLUDED."offset", metadata = EXCLUDED.metadata, leader_epoch = EXCLUDED.leader_epoch,
            committed_at = EXCLUDED.committed_at
    )"""


_PENDING_OFFSETS_APPLY = _compact("WITH offsets_gate AS (SELECT true AS go), " + PENDING_OFFSETS_CTES + " SELECT 1")


def pending_offsets_apply(conn: Connection, transactional_id: str, commit: bool) -> None:
    """A transaction ends: remove its pending offsets and, when it commits, make them its groups'
    offsets — one statement."""
    driver(conn).execute(_PENDING_OFFSETS_APPLY, {"tid": transactional_id, "commit_offsets": commit})


def pending_offsets_of_group(conn: Connection, group_id: str) -> list[dict]:
    rows = conn.execute(
        text(
            'SELECT topic, partition, "offset", metadata, transactional_id, producer_id, producer_epoch '
            "FROM txlog.pending_group_offsets WHERE group_id = :g ORDER BY topic, partition"
        ),
        {"g": group_id},
    )
    return [{**r._mapping, "metadata": text_of(r.metadata)} for r in rows]


def pending_offsets_of_txn(conn: Connection, transactional_id: str) -> list[dict]:
    rows = conn.execute(
        text(
            'SELECT group_id, topic, partition, "offset", metadata FROM txlog.pending_group_offsets '
            "WHERE transactional_id = :tid ORDER BY group_id, topic, partition"
        ),
        {"tid": transactional_id},
    )
    return [{**r._mapping, "metadata": text_of(r.metadata)} for r in rows]


def text_of(metadata: bytes | None) -> str | None:
    """Offset metadata as committed: the string whose UTF-8 is kept."""
    return None if metadata is None else bytes(metadata).decode()
