"""What the admin pages read (inspection only; every statement is index-served): pages of a log
with what became of each record's transaction, transactional ids page by page, the transactions
holding last stable offsets back, producer state entries, consumer groups' summaries and offsets."""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import LogRecord, LsoHolder, stored_headers
from app.domain.transactions import TxnMetadata
from app.storage._sql import OPEN_STATES_SQL, _ms
from app.storage.groups import text_of
from app.storage.log import RECORD_COLUMNS
from app.storage.transactions import TXN_COLUMNS, like_prefix, txn_from_row


def records_page(
    conn: Connection,
    topic: str,
    partition: int,
    start: int,
    upper: int,
    limit: int,
    include_control: bool = True,
    include_aborted: bool = True,
    backwards: bool = False,
) -> list[LogRecord]:
    """Records in [start, upper), in offset order, at most ``limit``: the first ones, or with
    ``backwards`` the last ones. A range scan of the primary key; the flags are index lookups in
    the aborted-transaction index and the producer state."""
    sql = f"""
        SELECT {RECORD_COLUMNS}, r.aborted,
               r.is_transactional AND r.control_type IS NULL AND EXISTS (
                   SELECT 1 FROM txlog.producer_partitions pp
                   WHERE pp.topic = r.topic AND pp.partition = r.partition AND pp.producer_id = r.producer_id
                     AND pp.txn_first_offset <= r."offset") AS open
        FROM txlog.log_records r
        WHERE r.topic = :topic AND r.partition = :partition AND r."offset" >= :start AND r."offset" < :upper
          {"" if include_control else "AND r.control_type IS NULL"}
          {"" if include_aborted else "AND NOT r.aborted"}
        ORDER BY r."offset" {"DESC" if backwards else ""}
        LIMIT :limit
    """
    rows = conn.execute(text(sql), {"topic": topic, "partition": partition, "start": start, "upper": upper, "limit": limit})
    records = [LogRecord(r[0], r[1], r[2], stored_headers(r[3], r[4]), *r[5:11], *r[13:]) for r in rows]
    return records[::-1] if backwards else records


def txn_browse(
    conn: Connection,
    states: Sequence[str] | None,
    started_before_ms: int | None,
    prefix: str | None,
    after: str | None,
    limit: int,
) -> list[TxnMetadata]:
    """One page of transactional ids in id order (keyset paging on the primary key)."""
    clauses = ["true"]
    if states:
        clauses.append("t.state = ANY(CAST(:states AS text[]))")
    if started_before_ms is not None:
        clauses.append("t.started_at < to_timestamp(:before / 1000.0)")
    if prefix:
        clauses.append("t.transactional_id LIKE :prefix ESCAPE '\\'")
    if after is not None:
        clauses.append("t.transactional_id > :after")
    rows = conn.execute(
        text(
            f"SELECT {TXN_COLUMNS} FROM txlog.transactions t WHERE {' AND '.join(clauses)} ORDER BY t.transactional_id LIMIT :limit"
        ),
        {
            "states": list(states or ()),
            "before": started_before_ms,
            "prefix": like_prefix(prefix),
            "after": after,
            "limit": limit,
        },
    )
    return [txn_from_row(r) for r in rows]


def lso_holders(conn: Connection) -> list[LsoHolder]:
    """Per partition with an open transaction, the one holding its last stable offset back. Reads
    only the partial index of open transactions' first offsets, then primary-key lookups. The
    holder's first offset is the partition's last stable offset by the same rule as
    ``txlog.partition_status`` (held equal by tests/integration/test_lso_holders.py)."""
    rows = conn.execute(
        text(
            f"""
            SELECT h.topic, h.partition, h.txn_first_offset, p.next_offset, h.producer_id, h.producer_epoch,
                   t.transactional_id, t.state, {_ms("t.started_at")}, {_ms("h.last_timestamp")}
            FROM (
                SELECT DISTINCT ON (pp.topic, pp.partition) pp.topic, pp.partition, pp.producer_id,
                       pp.producer_epoch, pp.txn_first_offset, pp.last_timestamp
                FROM txlog.producer_partitions pp
                WHERE pp.txn_first_offset IS NOT NULL
                ORDER BY pp.topic, pp.partition, pp.txn_first_offset
            ) h
            JOIN txlog.partitions p ON p.topic = h.topic AND p.partition = h.partition
            LEFT JOIN LATERAL (
                SELECT t.transactional_id, t.state, t.started_at FROM txlog.transactions t
                WHERE t.producer_id = h.producer_id AND t.state IN {OPEN_STATES_SQL}
                LIMIT 1
            ) t ON true
            ORDER BY h.topic, h.partition
            """
        )
    )
    return [LsoHolder(*r) for r in rows]


def _producer_row(r) -> dict:
    return dict(r._mapping)


_PRODUCER_COLUMNS = f"""
pp.topic, pp.partition, pp.producer_id, pp.producer_epoch, pp.batches, pp.txn_first_offset,
{_ms("pp.last_timestamp")} AS last_timestamp_ms,
(SELECT pi.transactional_id FROM txlog.producer_ids pi WHERE pi.producer_id = pp.producer_id) AS transactional_id
"""


def producer_states_page(
    conn: Connection, after: tuple[str, int, int] | None, limit: int, topic: str | None = None, open_only: bool = False
) -> list[dict]:
    """Producer state entries in primary-key order (topic, partition, producer id), keyset-paged;
    ``open_only`` reads the partial index of open transactions instead."""
    clauses = ["true"]
    if after is not None:
        clauses.append("(pp.topic, pp.partition, pp.producer_id) > (:a_topic, :a_partition, :a_pid)")
    if topic is not None:
        clauses.append("pp.topic = :topic")
    if open_only:
        clauses.append("pp.txn_first_offset IS NOT NULL")
    rows = conn.execute(
        text(
            f"SELECT {_PRODUCER_COLUMNS} FROM txlog.producer_partitions pp WHERE {' AND '.join(clauses)} "
            "ORDER BY pp.topic, pp.partition, pp.producer_id LIMIT :limit"
        ),
        {
            "a_topic": after[0] if after else None,
            "a_partition": after[1] if after else None,
            "a_pid": after[2] if after else None,
            "topic": topic,
            "limit": limit,
        },
    )
    return [_producer_row(r) for r in rows]


def producer_states_by_id(conn: Connection, producer_id: int) -> list[dict]:
    """One producer id's state on every partition: a primary-key lookup per partition."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_PRODUCER_COLUMNS}
            FROM txlog.partitions p
            JOIN txlog.producer_partitions pp
              ON pp.topic = p.topic AND pp.partition = p.partition AND pp.producer_id = :pid
            ORDER BY pp.topic, pp.partition
            """
        ),
        {"pid": producer_id},
    )
    return [_producer_row(r) for r in rows]


def group_summaries(conn: Connection, limit: int = 1000) -> list[dict]:
    """Per consumer group: its committed partitions, total lag against the last stable offset, last
    commit, and its pending transactional offsets."""
    rows = conn.execute(
        text(
            f"""
            WITH committed AS (
                SELECT g.group_id, count(*) AS partitions,
                       sum(GREATEST(s.last_stable_offset - g."offset", 0)) AS lag,
                       max(g.committed_at) AS last_commit
                FROM txlog.group_offsets g
                JOIN txlog.partition_status s ON s.topic = g.topic AND s.partition = g.partition
                GROUP BY g.group_id
            ), pending AS (
                SELECT group_id, count(*) AS pending_offsets, count(DISTINCT transactional_id) AS pending_transactions
                FROM txlog.pending_group_offsets GROUP BY group_id
            )
            SELECT COALESCE(c.group_id, p.group_id) AS group_id, COALESCE(c.partitions, 0) AS partitions,
                   COALESCE(c.lag, 0)::bigint AS lag, {_ms("c.last_commit")} AS last_commit_ms,
                   COALESCE(p.pending_offsets, 0) AS pending_offsets,
                   COALESCE(p.pending_transactions, 0) AS pending_transactions
            FROM committed c FULL JOIN pending p ON p.group_id = c.group_id
            ORDER BY 1 LIMIT :limit
            """
        ),
        {"limit": limit},
    )
    return [dict(r._mapping) for r in rows]


def group_offsets_with_status(conn: Connection, group_id: str) -> list[dict]:
    """A group's committed offsets beside each partition's log start, last stable offset and high
    watermark (the group's primary-key prefix, then one status lookup per partition)."""
    rows = conn.execute(
        text(
            f"""
            SELECT g.topic, g.partition, g."offset", g.metadata, {_ms("g.committed_at")} AS committed_at_ms,
                   s.log_start_offset, s.last_stable_offset, s.high_watermark
            FROM txlog.group_offsets g
            LEFT JOIN txlog.partition_status s ON s.topic = g.topic AND s.partition = g.partition
            WHERE g.group_id = :g
            ORDER BY g.topic, g.partition
            """
        ),
        {"g": group_id},
    )
    return [{**r._mapping, "metadata": text_of(r.metadata)} for r in rows]
