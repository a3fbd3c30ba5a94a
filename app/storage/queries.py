"""The SQL of txlog, one function per statement, named noun-first (``partition_lock``,
``producer_state_get``, ``txn_record``). Every statement is served by an index; none scans a
log. Services call these inside the transaction scopes they open."""

from __future__ import annotations

import contextlib
import itertools
import json
import operator
import re
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, NamedTuple, Sequence

import psycopg
from psycopg.types.numeric import Int4, Int8
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.producer_state import BatchMetadata, ProducerStateEntry
from app.domain.records import Headers, NewRecord, headers_object, record_size, record_sizes
from app.domain.transactions import TopicPartition, TxnEvent, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError
from app.storage.arrays import bytea_array, int4_array, int8_array, text_array
from app.storage.db import driver, libpq_url
from app.storage.views import page_aborted

NOTIFY_CHANNEL = "txlog_append"


def _int8(value: int | None) -> Int8 | None:
    """A number sent binary as a bigint whatever its size (one prepared statement serves all)."""
    return None if value is None else Int8(value)


def _partition(topic: str, partition: int) -> Int4:
    """A partition number sent binary; one that no int column can hold names no partition."""
    if not -(2**31) <= partition < 2**31:
        raise unknown_partition(topic, partition)
    return Int4(partition)


def _ms(col: str) -> str:
    return f"(extract(epoch FROM {col}) * 1000)::bigint"


def _txn_columns(alias: str, members: str = "all") -> str:
    """The columns of a transactions row as ``_txn_from_row`` reads them. ``members``: "all" the
    transaction's partitions and groups (read from their own rows), "asked" only those among the
    parameters ``m_topics``/``m_parts`` and ``m_groups`` (psycopg placeholders: ``txn_get`` runs on
    the driver), "none" neither."""
    a = alias
    if members == "none":
        parts, groups = "NULL::jsonb", "NULL::jsonb"
    else:
        part_filter = group_filter = ""
        if members == "asked":
            part_filter = (
                "AND (m.topic, m.partition) IN "
                "(SELECT * FROM unnest(CAST(%(m_topics)s AS text[]), CAST(%(m_parts)s AS int[])))"
            )
            group_filter = "AND g.group_id = ANY(CAST(%(m_groups)s AS text[]))"
        parts = (
            f"(SELECT jsonb_agg(jsonb_build_array(m.topic, m.partition) ORDER BY m.topic, m.partition) "
            f"FROM txlog.transaction_partitions m WHERE m.transactional_id = {a}.transactional_id {part_filter})"
        )
        groups = (
            f"(SELECT jsonb_agg(g.group_id ORDER BY g.group_id) "
            f"FROM txlog.transaction_groups g WHERE g.transactional_id = {a}.transactional_id {group_filter})"
        )
    return f"""
{a}.transactional_id, {a}.producer_id, {a}.producer_epoch, {a}.state, {a}.timeout_ms, {a}.version,
{_ms(a + '.updated_at')}, {_ms(a + '.epoch_changed_at')}, {_ms(a + '.started_at')}, {parts}, {groups},
{a}.last_producer_id, {a}.last_producer_epoch, {a}.last_result, {a}.fence_reason, {a}.transaction_version
"""


_TXN_COLUMNS = _txn_columns("t")


def _txn_from_row(row) -> TxnMetadata:  # type: ignore[no-untyped-def]
    return TxnMetadata(
        transactional_id=row[0],
        producer_id=row[1],
        producer_epoch=row[2],
        state=TxnState(row[3]),
        timeout_ms=row[4],
        version=row[5],
        updated_at_ms=row[6],
        epoch_changed_at_ms=row[7],
        started_at_ms=row[8],
        partitions=tuple((t, p) for t, p in row[9] or ()),
        groups=tuple(row[10] or ()),
        last_producer_id=row[11],
        last_producer_epoch=row[12],
        last_result=row[13],
        fence_reason=row[14],
        transaction_version=row[15],
    )


# --- topics and partitions ------------------------------------------------------------------------

def topic_insert(conn: Connection, name: str, partitions: int, config: dict) -> bool:
    row = conn.execute(
        text(
            "INSERT INTO txlog.topics (name, partitions, config) VALUES (:name, :n, CAST(:config AS jsonb)) "
            "ON CONFLICT (name) DO NOTHING RETURNING name"
        ),
        {"name": name, "n": partitions, "config": json.dumps(config)},
    ).first()
    if row is None:
        return False
    conn.execute(
        text(
            "INSERT INTO txlog.partitions (topic, partition) "
            "SELECT :name, g FROM generate_series(0, :n - 1) AS g"
        ),
        {"name": name, "n": partitions},
    )
    return True


def topic_list(conn: Connection) -> list[tuple[str, int]]:
    return [tuple(r) for r in conn.execute(text("SELECT name, partitions FROM txlog.topics ORDER BY name"))]  # type: ignore[misc]


def topic_config_get(conn: Connection, name: str, for_update: bool = False) -> dict | None:
    row = conn.execute(
        text("SELECT config FROM txlog.topics WHERE name = :name" + (" FOR UPDATE" if for_update else "")), {"name": name}
    ).first()
    return dict(row[0]) if row else None


def topic_config_set(conn: Connection, name: str, config: dict) -> None:
    conn.execute(text("UPDATE txlog.topics SET config = CAST(:config AS jsonb) WHERE name = :name"), {"name": name, "config": json.dumps(config)})


def topic_partitions(conn: Connection, name: str) -> int | None:
    return conn.execute(text("SELECT partitions FROM txlog.topics WHERE name = :name"), {"name": name}).scalar()


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    partitions: int
    topic_id: uuid.UUID


def topics_metadata(
    conn: Connection, names: Sequence[str] | None = None, topic_ids: Sequence[uuid.UUID] | None = None
) -> list[TopicMetadata]:
    """Topics with their partition counts and ids, in name order: every one, or those named in
    ``names`` or identified in ``topic_ids`` that exist."""
    if names is None and topic_ids is None:
        rows = conn.execute(text("SELECT name, partitions, topic_id FROM txlog.topics ORDER BY name"))
    else:
        rows = conn.execute(
            text(
                "SELECT name, partitions, topic_id FROM txlog.topics "
                "WHERE name = ANY(CAST(:names AS text[])) OR topic_id = ANY(CAST(:ids AS uuid[])) ORDER BY name"
            ),
            {"names": list(names or ()), "ids": list(topic_ids or ())},
        )
    return [TopicMetadata(*r) for r in rows]


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    open_transactions: int = 0


_STATUS_SELECT = """
SELECT topic, partition, log_start_offset, high_watermark, last_stable_offset, open_transactions
FROM txlog.partition_status
"""


_STATUS_OF_PARTITION = _STATUS_SELECT + " WHERE topic = %(topic)s AND partition = %(partition)s"


def partition_status(conn: Connection, topic: str, partition: int) -> PartitionStatus:
    """One partition's status (every fetch reads it: on the driver, binary)."""
    row = driver(conn).execute(_STATUS_OF_PARTITION, {"topic": topic, "partition": _partition(topic, partition)}, binary=True).fetchone()
    if row is None:
        raise unknown_partition(topic, partition)
    return PartitionStatus(*row)


def partition_statuses(conn: Connection, wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], PartitionStatus]:
    """The status of each of ``wanted`` that exists (one statement, a primary-key lookup each)."""
    wanted = [(t, p) for t, p in wanted if -(2**31) <= p < 2**31]  # no other partition number exists
    if not wanted:
        return {}
    rows = driver(conn).execute(
        _STATUS_SELECT + " WHERE (topic, partition) IN (SELECT * FROM unnest(CAST(%(topics)s AS text[]), CAST(%(parts)s AS int[])))",
        {"topics": [t for t, _ in wanted], "parts": [p for _, p in wanted]},
        binary=True,
    ).fetchall()
    return {(r[0], r[1]): PartitionStatus(*r) for r in rows}


def partition_status_all(conn: Connection, topic: str | None = None) -> list[PartitionStatus]:
    where = " WHERE topic = :topic" if topic is not None else ""
    rows = conn.execute(text(_STATUS_SELECT + where + " ORDER BY topic, partition"), {"topic": topic})
    return [PartitionStatus(*r) for r in rows]


def unknown_partition(topic: str, partition: int) -> TxlogError:
    return TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic-partition {topic}-{partition} does not exist")


def partitions_missing(conn: Connection, wanted: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    if not wanted:
        return []
    rows = conn.execute(
        text(
            "SELECT w.topic, w.partition FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[])) AS w(topic, partition) "
            "WHERE NOT EXISTS (SELECT 1 FROM txlog.partitions p WHERE p.topic = w.topic AND p.partition = w.partition)"
        ),
        {"topics": [t for t, _ in wanted], "parts": [p for _, p in wanted]},
    )
    return [(r[0], r[1]) for r in rows]


@dataclass(frozen=True)
class AppendPosition:
    next_offset: int
    log_start_offset: int
    next_position: int
    producer_state: ProducerStateEntry | None
    # When the producer id was given to a transactional id: that transactional id's current state
    # (``None`` inside if it was removed since), and why the id was retired, if it was.
    owner: "ProducerOwner | None"


@dataclass(frozen=True)
class ProducerOwner:
    transactional_id: str
    retire_reason: str | None
    meta: TxnMetadata | None


def partition_lock_for_append(conn: Connection, topic: str, partition: int, producer_id: int | None) -> AppendPosition:
    """The append lock and, in the same round trip, the producer's state on the partition and the
    transactional id its producer id belongs to, if any, with that transactional id's state."""
    (position,) = partitions_lock_for_append(conn, [(topic, partition, producer_id)])
    if position is None:
        raise unknown_partition(topic, partition)
    return position


def partitions_lock_for_append(
    conn: Connection, wanted: Sequence[tuple[str, int, int | None]], skip_locked: bool = False
) -> list[AppendPosition | None]:
    """``partition_lock_for_append`` of several (topic, partition, producer id), distinct
    partitions, in one statement that takes the locks in (topic, partition) order (as every
    statement locking several partitions must, so that two never wait for each other). Answered in
    the order asked; None for a partition that does not exist, or with ``skip_locked`` one another
    transaction holds (not waited for)."""
    # A partition number beyond int4 names no partition; asked as -1, which none has.
    params = {
        "topics": text_array([t for t, _, _ in wanted]),
        "parts": int4_array([p if -(2**31) <= p < 2**31 else -1 for _, p, _ in wanted]),
        "pids": int8_array([pid for _, _, pid in wanted]),
    }
    raw = driver(conn)
    sql = _LOCK_FOR_APPEND_SKIP_LOCKED if skip_locked else _LOCK_FOR_APPEND
    rows = raw.execute(sql, params).fetchall()
    if any(row[4] != row[1] for row in rows):  # seen_next_offset != next_offset
        # We waited for a lock while another append committed (or, skipping locked rows, found a
        # row updated since the statement began). PostgreSQL then re-reads the locked partition
        # row (READ COMMITTED) but not the joined rows, which are from before that append: a
        # retried batch would not be seen as a duplicate, a fencing not seen. Now that the locks
        # are held, the same statement reads everything committed before it.
        rows = raw.execute(sql, params).fetchall()
    out: list[AppendPosition | None] = [None] * len(wanted)
    for row in rows:
        if row[4] == row[1]:  # a row first locked by the second statement may be stale again: left out
            out[row[0] - 1] = _append_position(row[1:], wanted[row[0] - 1][2])
    return out


def _append_position(row: Sequence[Any], producer_id: int | None) -> AppendPosition:
    next_offset, log_start_offset, next_position, _, pp_epoch, pp_batches, pp_txn_first, pp_last_ts, owner_tid, retire_reason = row[:10]
    entry = None
    if pp_epoch is not None:
        entry = ProducerStateEntry(
            producer_id, pp_epoch, tuple(BatchMetadata.from_json(b) for b in pp_batches),  # type: ignore[arg-type]
            pp_txn_first, pp_last_ts,
        )
    owner = None
    if owner_tid is not None:
        txn_row = row[_LOCK_OWNER_COLUMNS:]
        meta = _txn_from_row(txn_row) if txn_row[0] is not None else None
        owner = ProducerOwner(owner_tid, retire_reason, meta)
    return AppendPosition(next_offset, log_start_offset, next_position, entry, owner)


_LOCK_OWNER_COLUMNS = 11  # the transaction's columns start here, after the ordinal

_LOCK_FOR_APPEND = f"""
    SELECT w.i, p.next_offset, p.log_start_offset, p.next_position,
           (SELECT s.next_offset FROM txlog.partitions s
            WHERE s.topic = p.topic AND s.partition = p.partition) AS seen_next_offset,  -- the statement's snapshot
           pp.producer_epoch AS pp_epoch, pp.batches AS pp_batches, pp.txn_first_offset AS pp_txn_first_offset,
           {_ms('pp.last_timestamp')} AS pp_last_timestamp,
           pi.transactional_id AS owner_tid, pi.retire_reason, pi.retired_at,
           {_txn_columns('t', 'none')}
    FROM unnest(CAST(%(topics)b AS text[]), CAST(%(parts)b AS int[]), CAST(%(pids)b AS bigint[]))
         WITH ORDINALITY AS w(topic, partition, pid, i)
    JOIN txlog.partitions p ON p.topic = w.topic AND p.partition = w.partition
    -- a lookup by the whole primary key for each partition asked (LIMIT keeps it one: joined
    -- instead, a generic plan may scan the partition's producers, or all of them)
    LEFT JOIN LATERAL (
        SELECT * FROM txlog.producer_partitions pp
        WHERE pp.topic = w.topic AND pp.partition = w.partition AND pp.producer_id = w.pid LIMIT 1
    ) pp ON true
    LEFT JOIN txlog.producer_ids pi ON pi.producer_id = w.pid
    LEFT JOIN txlog.transactions t ON t.transactional_id = pi.transactional_id
    ORDER BY p.topic, p.partition
    FOR UPDATE OF p
    """
_LOCK_FOR_APPEND_SKIP_LOCKED = _LOCK_FOR_APPEND.rstrip() + " SKIP LOCKED\n"


# --- the log --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AppendBatch:
    """A batch to append at ``base_offset`` of a partition whose append lock the caller holds. A
    transaction marker is a batch of one control record (``control_type``); an ABORT marker also
    indexes the aborted transaction's range [``aborted_first_offset``, marker offset] (Kafka's
    .txnindex). Transactional records and markers carry ``txn_first_offset``, the first offset of
    their transaction on the partition. ``producer_state``: the producer's state after the batch,
    to save. ``sizes``: the records' sizes when the caller has them already (control records
    count 0)."""

    topic: str
    partition: int
    base_offset: int
    base_position: int
    records: Sequence[NewRecord]
    append_time_ms: int
    producer_id: int | None = None
    producer_epoch: int | None = None
    base_sequence: int | None = None
    transactional: bool = False
    producer_state: ProducerStateEntry | None = None
    control_type: int | None = None
    aborted_first_offset: int | None = None
    txn_first_offset: int | None = None
    sizes: Sequence[int] | None = None

    def record_sizes(self) -> Sequence[int]:
        """What each record adds to the partition's log position (a control record nothing)."""
        if self.control_type is not None:
            return [0] * len(self.records)
        return self.sizes if self.sizes is not None else record_sizes(self.records)


# One statement, one round trip, for any number of batches on distinct partitions, parameters sent
# binary (packed arrays: bytes as they are, no hex text to build and parse): the batches' fields as
# arrays of one element per batch (``b``), their records as arrays of one element per record, each
# with its batch's ordinal. Long-polling fetches are notified only when some process has registered
# to listen on the partition (``fetch_listeners``, see ``fetch_listener_register``): an append
# nobody waits for takes no notify lock. It answers how many batches it appended.
#
# The conditional form (``log_append_if_unchanged``, one batch) needs no lock taken before it: its
# ``b`` keeps the batch only if its partition, locked by this very statement, still ends where the
# batch begins (next offset and log position) and its producer is still as the batch was planned
# against: the same state on the partition (epoch, last batches, open transaction) and no
# transactional id — or, for a transactional batch, its transaction still Ongoing with the batch's
# partition, of the same producer id and epoch (that row locked, shared, before the partition: an
# EndTxn, which writes a marker on every partition of the transaction, waits for the statement or
# is waited for by nobody). A partition row another append changed meanwhile is read again once
# its lock is granted (READ COMMITTED re-checks a locked row), so a batch planned against a stale
# state writes nothing: every append moves the partition's next offset. The batch's row is taken with
# LIMIT 1 before it is checked, so that the generic plan is costed for one row, as the custom plans
# are, and PostgreSQL keeps it rather than planning the statement again at every execution.
# Both are sent without their indentation (``_compact``).
def _log_append_sql(if_unchanged: bool, records_txn: bool = False) -> str:
    batches = """unnest(
            CAST(%(b_topic)b AS text[]), CAST(%(b_partition)b AS int[]), CAST(%(b_base)b AS bigint[]),
            CAST(%(b_next)b AS bigint[]), CAST(%(b_base_position)b AS bigint[]), CAST(%(b_next_position)b AS bigint[]),
            CAST(%(b_pid)b AS bigint[]), CAST(%(b_epoch)b AS int[]), CAST(%(b_seq)b AS bigint[]), CAST(%(b_txn)b AS int[]),
            CAST(%(b_control)b AS int[]), CAST(%(b_txn_first)b AS bigint[]), CAST(%(b_state_epoch)b AS int[]),
            CAST(%(b_state)b AS text[]), CAST(%(b_state_txn_first)b AS bigint[]), CAST(%(b_aborted_first)b AS bigint[]),
            CAST(%(b_append_ts)b AS bigint[]), CAST(%(b_was_epoch)b AS int[]), CAST(%(b_was_state)b AS text[]),
            CAST(%(b_was_txn_first)b AS bigint[])
        ) WITH ORDINALITY AS b(topic, partition, base, next, base_position, next_position, pid, epoch, seq, txn,
                               control, txn_first, state_epoch, state, state_txn_first, aborted_first, append_ts,
                               was_epoch, was_state, was_txn_first, i)"""
    # A transactional batch's transaction: Ongoing with the batch's partition in it; or, when the
    # statement records the transaction's transitions too, the transaction as they were planned
    # against (its version pins its members).
    in_txn = """EXISTS (SELECT 1 FROM t JOIN txlog.transaction_partitions m ON m.transactional_id = t.transactional_id
                             WHERE t.transactional_id = (CAST(%(b_tid)b AS text[]))[b.i] AND t.producer_id = b.pid
                               AND t.producer_epoch = b.epoch AND m.topic = b.topic AND m.partition = b.partition)"""
    if records_txn:
        in_txn = "EXISTS (SELECT 1 FROM t WHERE t.producer_id = b.pid AND t.producer_epoch = b.epoch)"
    if if_unchanged:
        batches = f"""(SELECT * FROM {batches} LIMIT %(n)s) b
        JOIN txlog.partitions p ON p.topic = b.topic AND p.partition = b.partition
                                AND p.next_offset = b.base AND p.next_position = b.base_position
        WHERE b.pid IS NULL OR (
            CASE WHEN (CAST(%(b_tid)b AS text[]))[b.i] IS NULL
                THEN NOT EXISTS (SELECT 1 FROM txlog.producer_ids pi WHERE pi.producer_id = b.pid AND pi.transactional_id IS NOT NULL)
                ELSE {in_txn}
                END
            AND CASE WHEN b.was_epoch IS NULL
                THEN NOT EXISTS (SELECT 1 FROM txlog.producer_partitions pp
                                 WHERE pp.topic = b.topic AND pp.partition = b.partition AND pp.producer_id = b.pid)
                ELSE EXISTS (SELECT 1 FROM txlog.producer_partitions pp
                             WHERE pp.topic = b.topic AND pp.partition = b.partition AND pp.producer_id = b.pid
                               AND pp.producer_epoch = b.was_epoch AND pp.batches = CAST(b.was_state AS jsonb)
                               AND pp.txn_first_offset IS NOT DISTINCT FROM b.was_txn_first)
                END)
        FOR UPDATE OF p SKIP LOCKED"""
    # The transactions of transactional batches, locked (shared) before any partition, as
    # everywhere; evaluated once, by the first batch that asks. Recording transitions, the
    # transaction's row is locked to be updated, and only as they were planned against (its
    # version, state, producer id and epoch); every batch must be kept, or none is (``ok``: the
    # transitions too), every partition added must exist, and the members of the transaction that
    # ended are forgotten when the first transition starts the next one (``resets``) — but for
    # those it adds again, which stay. Ending a transaction (``end_offsets``), its pending group
    # offsets are applied or dropped.
    ongoing = "WITH "
    kept = f"b AS MATERIALIZED (SELECT b.* FROM {batches})"
    if records_txn:
        ongoing = """WITH t AS MATERIALIZED (
            SELECT t.transactional_id, t.producer_id, t.producer_epoch FROM txlog.transactions t
            WHERE t.transactional_id = %(tid)s AND t.version = %(was_version)s AND t.state = %(was_state)s
              AND t.producer_id = %(was_pid)s AND t.producer_epoch = %(was_epoch)s
            FOR UPDATE SKIP LOCKED
        ), """
        kept = f"""kept AS MATERIALIZED (SELECT b.* FROM {batches}
        ), b AS MATERIALIZED (SELECT * FROM kept WHERE (SELECT count(*) FROM kept) = %(n)s
        ), ok AS MATERIALIZED (
            SELECT EXISTS (SELECT 1 FROM t) AND (SELECT count(*) FROM b) = %(n)s AND NOT EXISTS (
                SELECT 1 FROM unnest(CAST(%(added_topics)s AS text[]), CAST(%(added_parts)s AS int[])) AS u(topic, partition)
                WHERE NOT EXISTS (SELECT 1 FROM txlog.partitions p WHERE p.topic = u.topic AND p.partition = u.partition)
            ) AS go
        ), members_reset AS (
            DELETE FROM txlog.transaction_partitions m
            WHERE m.transactional_id = %(tid)s AND CAST(%(resets)s AS boolean) AND (SELECT go FROM ok)
              AND (m.topic, m.partition) NOT IN (
                  SELECT * FROM unnest(CAST(%(added_topics)s AS text[]), CAST(%(added_parts)s AS int[])))
        ), groups_reset AS (
            DELETE FROM txlog.transaction_groups g
            WHERE g.transactional_id = %(tid)s AND CAST(%(resets)s AS boolean) AND (SELECT go FROM ok)
              AND g.group_id <> ALL(CAST(%(added_groups)s AS text[]))
        ), {_pending_offsets_ctes("CAST(%(end_offsets)s AS boolean) AND (SELECT go FROM ok)")}"""
    elif if_unchanged:
        ongoing = """WITH t AS MATERIALIZED (
            SELECT t.transactional_id, t.producer_id, t.producer_epoch FROM txlog.transactions t
            WHERE t.transactional_id = ANY(CAST(%(b_tid)b AS text[])) AND t.state = 'Ongoing'
            FOR SHARE SKIP LOCKED
        ), """
    recorded = f", {_txn_record_ctes('(SELECT go FROM ok)')}" if records_txn else ""
    return f"""
    {ongoing}{kept}, appended AS (
        INSERT INTO txlog.records (topic, partition, "offset", key, value, headers, header_keys, header_values,
                                   "timestamp", producer_id, producer_epoch, sequence, is_transactional,
                                   control_type, position, txn_first_offset)
        SELECT b.topic, b.partition, u.off, u.k, u.v, CAST(u.h AS jsonb),
               CASE WHEN u.hs IS NOT NULL THEN (CAST(%(hk)b AS text[]))[u.hs:u.he] END,
               CASE WHEN u.hs IS NOT NULL THEN (CAST(%(hv)b AS bytea[]))[u.hs:u.he] END,
               to_timestamp(u.ts / CAST(1000 AS float8)), b.pid, b.epoch,
               CASE WHEN b.seq IS NULL THEN NULL ELSE ((b.seq + u.off - b.base) %% 2147483648)::int END,
               b.txn = 1, b.control, u.pos, b.txn_first
        FROM unnest(CAST(%(batch)b AS int[]), CAST(%(offsets)b AS bigint[]), CAST(%(keys)b AS bytea[]),
                    CAST(%(values)b AS bytea[]), CAST(%(headers)b AS text[]), CAST(%(hstart)b AS int[]),
                    CAST(%(hend)b AS int[]), CAST(%(ts)b AS bigint[]), CAST(%(positions)b AS bigint[]))
             AS u(bi, off, k, v, h, hs, he, ts, pos)
        JOIN b ON b.i = u.bi
    ), advanced AS (
        UPDATE txlog.partitions p SET next_offset = b.next, next_position = b.next_position
        FROM b WHERE p.topic = b.topic AND p.partition = b.partition
    ), producer_state AS (
        INSERT INTO txlog.producer_partitions (topic, partition, producer_id, producer_epoch, batches,
                                               txn_first_offset, last_timestamp)
        SELECT b.topic, b.partition, b.pid, b.state_epoch, CAST(b.state AS jsonb), b.state_txn_first,
               to_timestamp(b.append_ts / 1000.0)
        FROM b WHERE b.state IS NOT NULL
        ON CONFLICT (topic, partition, producer_id) DO UPDATE
        SET producer_epoch = EXCLUDED.producer_epoch, batches = EXCLUDED.batches,
            txn_first_offset = EXCLUDED.txn_first_offset, last_timestamp = EXCLUDED.last_timestamp
    ), aborted AS (
        INSERT INTO txlog.aborted_txns (topic, partition, producer_id, first_offset, last_offset, producer_epoch)
        SELECT b.topic, b.partition, b.pid, b.aborted_first, b.base, b.epoch
        FROM b WHERE b.aborted_first IS NOT NULL
    ){recorded}
    SELECT (SELECT array_agg(b.i ORDER BY b.i) FROM b),
           (SELECT array_agg(p.log_start_offset ORDER BY b.i)
            FROM b JOIN txlog.partitions p ON p.topic = b.topic AND p.partition = b.partition),
           (SELECT count(pg_notify(%(channel)b, l.topic || ':' || l.partition))
            FROM txlog.fetch_listeners l JOIN b ON l.topic = b.topic AND l.partition = b.partition
            WHERE l.expires_at > now()){", (SELECT count(*) FROM recorded)" if records_txn else ""}
"""


def _compact(sql: str) -> str:
    """A statement without its indentation: fewer bytes to send, and to parse for placeholders
    (once: see ``db.py`` on psycopg's statement cache)."""
    return re.sub(r"[ \t]*\n[ \t]*", "\n", sql.strip())


_LOG_APPEND = _compact(_log_append_sql(False))
_LOG_APPEND_IF_UNCHANGED = _compact(_log_append_sql(True))


def log_append(conn: Connection, batches: Sequence[AppendBatch], commit: bool = False) -> None:
    """Append batches to distinct partitions (the caller holds their append locks): insert the
    records, advance each high watermark and log position, save the producers' states, index
    aborted transactions and notify long-polling fetches if any listens — one statement, one
    round trip. With ``commit`` the append is the database transaction's last statement and is
    committed here, so the caller's scope has nothing left to commit. Not in one round trip with
    the COMMIT (psycopg's pipeline mode): a process stopped between a pipelined statement and its
    Sync leaves its session active, not idle in transaction, so idle_in_transaction_session_timeout
    never ends it and its row locks stay held."""
    driver(conn).execute(_LOG_APPEND, _log_append_params(batches, [None] * len(batches)))
    if commit:
        driver(conn).commit()


def log_append_if_unchanged(
    conn: Connection, batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None],
    transactional_ids: Sequence[str | None],
) -> dict[int, int]:
    """Append each of ``batches`` (distinct partitions) whose partition still ends at the batch's
    base offset and position and whose producer's state there is still the one it was planned
    against; write nothing of the others, nor of a batch whose partition or transaction another
    database transaction holds (not waited for). A batch of no transactional id (None in
    ``transactional_ids``) needs a producer id that still has none; a transactional batch, its
    transactional id's transaction still Ongoing, of its producer id and epoch, with the batch's
    partition in it already. Takes the locks itself (a transaction's row, shared, before
    partitions): on a connection in autocommit the statement is the whole database transaction,
    one round trip, and no lock is held between round trips. Answers, for each batch appended (by
    its index in ``batches``), its partition's log start offset."""
    params = _log_append_if_unchanged_params(batches, planned_against, transactional_ids)
    return _appended(driver(conn).execute(_LOG_APPEND_IF_UNCHANGED, params).fetchone())


async def log_append_if_unchanged_awaited(
    conn: psycopg.AsyncConnection, batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None],
    transactional_ids: Sequence[str | None],
) -> dict[int, int]:
    """``log_append_if_unchanged`` on a connection of an event loop (``db.LoopConnections``, in
    autocommit): the same statement, awaited."""
    params = _log_append_if_unchanged_params(batches, planned_against, transactional_ids)
    cursor = await conn.execute(_LOG_APPEND_IF_UNCHANGED, params)
    return _appended(await cursor.fetchone())


def _log_append_if_unchanged_params(
    batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None], transactional_ids: Sequence[str | None]
) -> dict[str, Any]:
    params = _log_append_params(batches, planned_against)
    params["n"] = Int8(len(batches))
    params["b_tid"] = text_array(transactional_ids)
    return params


def _appended(row: Any) -> dict[int, int]:
    appended, log_starts, _ = row
    return dict(zip((i - 1 for i in appended or ()), log_starts or ()))


def _batches_json(state: ProducerStateEntry) -> str:
    return json.dumps([m.to_json() for m in state.batches])


def _log_append_params(batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None]) -> dict[str, Any]:
    assert len({(b.topic, b.partition) for b in batches}) == len(batches), "one batch per partition"
    batch_of: list[int] = []
    offsets: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list = []
    timestamps: list[int | None] = []
    positions: list[int] = []
    b_next, b_next_position = [], []
    for i, b in enumerate(batches, 1):
        records = b.records
        n = len(records)
        k, v, h, t = zip(*records) if n else ((), (), (), ())
        keys += k
        values += v
        headers += h
        if None in t:
            t = tuple(b.append_time_ms if x is None else x for x in t)
        timestamps += t
        acc = list(itertools.accumulate(b.record_sizes(), initial=b.base_position))
        b_next_position.append(acc.pop())
        positions += acc
        offsets += range(b.base_offset, b.base_offset + n)
        b_next.append(b.base_offset + n)
        batch_of += [i] * n
    # Header columns: NULL arrays when no record has headers (unnest pads them with NULLs).
    headers_json = hstart = hend = hk = hv = None
    if any(headers):
        hstart, hend, hk, hv, headers_json = [], [], [], [], []
        for h in headers:
            if h:
                hstart.append(len(hk) + 1)
                hk.extend(k for k, _ in h)
                hv.extend(v for _, v in h)
                hend.append(len(hk))
                headers_json.append(json.dumps(headers_object(h)))
            else:
                hstart.append(None)
                hend.append(None)
                headers_json.append(None)
    states = [b.producer_state for b in batches]
    return {
        "b_topic": text_array([b.topic for b in batches]),
        "b_partition": int4_array([b.partition for b in batches]),
        "b_base": int8_array([b.base_offset for b in batches]),
        "b_next": int8_array(b_next),
        "b_base_position": int8_array([b.base_position for b in batches]),
        "b_next_position": int8_array(b_next_position),
        "b_pid": int8_array([b.producer_id for b in batches]),
        "b_epoch": int4_array([b.producer_epoch for b in batches]),
        "b_seq": int8_array([b.base_sequence for b in batches]),
        "b_txn": int4_array([int(b.transactional) for b in batches]),
        "b_control": int4_array([b.control_type for b in batches]),
        "b_txn_first": int8_array([b.txn_first_offset for b in batches]),
        "b_state_epoch": int4_array([s.producer_epoch if s else None for s in states]),
        "b_state": text_array([_batches_json(s) if s else None for s in states]),
        "b_state_txn_first": int8_array([s.txn_first_offset if s else None for s in states]),
        "b_aborted_first": int8_array([b.aborted_first_offset for b in batches]),
        "b_append_ts": int8_array([b.append_time_ms for b in batches]),
        "b_was_epoch": int4_array([s.producer_epoch if s else None for s in planned_against]),
        "b_was_state": text_array([_batches_json(s) if s else None for s in planned_against]),
        "b_was_txn_first": int8_array([s.txn_first_offset if s else None for s in planned_against]),
        "batch": int4_array(batch_of),
        "offsets": int8_array(offsets),
        "keys": bytea_array(keys),
        "values": bytea_array(values),
        "headers": text_array(headers_json) if headers_json is not None else None,
        "hstart": int4_array(hstart) if hstart is not None else None,
        "hend": int4_array(hend) if hend is not None else None,
        "hk": text_array(hk) if hk is not None else None,
        "hv": bytea_array(hv) if hv is not None else None,
        "ts": int8_array(timestamps),
        "positions": int8_array(positions),
        "channel": NOTIFY_CHANNEL,
    }


def fetch_listener_register(conn: Connection, topic: str, partition: int, lease_ms: int) -> bool:
    """Appends to this partition notify for ``lease_ms`` from now (False: no such partition).
    Taken under a key-share lock of the partition row, so it waits for an append in flight to
    commit: every append that commits after it sees the lease, every one before is readable."""
    row = conn.execute(
        text(
            """
            WITH p AS (
                SELECT topic, partition FROM txlog.partitions
                WHERE topic = :topic AND partition = :partition
                FOR KEY SHARE
            )
            INSERT INTO txlog.fetch_listeners (topic, partition, expires_at)
            SELECT topic, partition, clock_timestamp() + make_interval(secs => :lease_ms / 1000.0) FROM p
            ON CONFLICT (topic, partition) DO UPDATE
            SET expires_at = greatest(txlog.fetch_listeners.expires_at, EXCLUDED.expires_at)
            RETURNING 1
            """
        ),
        {"topic": topic, "partition": partition, "lease_ms": lease_ms},
    ).first()
    return row is not None


@contextlib.asynccontextmanager
async def append_notifications(database_url: str) -> AsyncIterator[AsyncIterator[str]]:
    """A connection of its own LISTENing to appends (``NOTIFY txlog_append``, sent by ``log_append``
    while a partition has a listening lease): yields the stream of their payloads,
    ``"topic:partition"``, each arriving once the append committed. Ends with the connection."""
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(NOTIFY_CHANNEL)))
        yield (note.payload async for note in conn.notifies())


def _headers(keys: list[str] | None, values: list[bytes | None] | None) -> Headers:
    return tuple(zip(keys, values)) if keys else ()  # type: ignore[arg-type]


class StoredRecord(NamedTuple):
    """A record as read from the log: a row of ``_RECORD_COLUMNS`` as it comes (a tuple: a fetch
    page makes many, and builds them without a Python call per record)."""

    offset: int
    key: bytes | None
    value: bytes | None
    header_keys: list[str] | None
    header_values: list[bytes | None] | None
    timestamp_ms: int
    producer_id: int | None
    producer_epoch: int | None
    sequence: int | None
    is_transactional: bool
    control_type: int | None
    position: int  # bytes of data records before this one in the partition
    txn_first_offset: int | None  # a transactional record's: its transaction's first offset on the partition
    aborted: bool  # its transaction aborted (txlog.log_records.aborted), where the read asked

    @property
    def headers(self) -> Headers:
        return _headers(self.header_keys, self.header_values)

    @property
    def size(self) -> int:
        if not self.header_keys:  # most records: no call, no headers tuple
            return len(self.key or b"") + len(self.value or b"")
        return record_size(self.key, self.value, self.headers)


_KEY = operator.attrgetter("key")
_VALUE = operator.attrgetter("value")
_HEADER_KEYS = operator.attrgetter("header_keys")


def records_size(records: Sequence[StoredRecord]) -> int:
    """The ``size`` of ``records`` summed: by C loops over keys and values when none has headers."""
    if any(map(_HEADER_KEYS, records)):
        return sum(r.size for r in records)
    return sum(map(len, filter(None, map(_KEY, records)))) + sum(map(len, filter(None, map(_VALUE, records))))


def header_count(records: Sequence[StoredRecord]) -> int:
    """How many headers ``records`` have in all."""
    return sum(map(len, filter(None, map(_HEADER_KEYS, records))))


# What a read of the log selects, then the aborted flag (or ``false`` when it does not ask): by
# txlog.log_records, which defines "aborted", or, for a page whose extent is known before it is
# read, by the same definition's page form (``views.page_aborted``).
_RECORD_COLUMNS = f"""
r."offset", r.key, r.value, r.header_keys, r.header_values, {_ms('r."timestamp"')}, r.producer_id,
r.producer_epoch, r.sequence, r.is_transactional, r.control_type, r.position, r.txn_first_offset
"""


_RECORD_WIDTH = len(StoredRecord._fields)


def _stored(rows: Sequence[Sequence[Any]]) -> list[StoredRecord]:
    """The rows as StoredRecords, made by ``tuple.__new__`` (C, no Python call per row, twice as
    fast as ``StoredRecord._make``, whose one addition is the width check made here once)."""
    if rows and len(rows[0]) != _RECORD_WIDTH:
        raise TypeError(f"a record row has {len(rows[0])} columns, not {_RECORD_WIDTH}")
    return list(map(tuple.__new__, itertools.repeat(StoredRecord), rows))  # type: ignore[arg-type]


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
    params = {"topic": topic, "partition": _partition(topic, partition), "start": Int8(start), "upper": Int8(upper), "limit": Int8(limit)}
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


def _fetch_sql(committed_only: bool) -> str:
    aborted = page_aborted("r", "%(topic)s", "%(partition)s", "%(start)s", "%(upper)s")
    return f"""
        SELECT {_RECORD_COLUMNS}, false  -- not flagged: left out when asked, or not asked
        FROM txlog.records r
        WHERE r.topic = %(topic)s AND r.partition = %(partition)s
          AND r."offset" >= %(start)s AND r."offset" < %(upper)s
          AND r.control_type IS NULL
          {f"AND NOT COALESCE({aborted}, false)" if committed_only else ""}
        ORDER BY r."offset"
        LIMIT %(limit)s
    """


_FETCH_COMMITTED = _fetch_sql(True)
_FETCH_UNCOMMITTED = _fetch_sql(False)


def _fetch_log_sql(with_aborted: bool) -> str:
    # The page ends at the first offset whose log position lies past the byte budget's end (the
    # first record's position + max_bytes), found by bisecting [start + 1, end): positions grow
    # with offsets, so that costs about log2(end - start) primary-key lookups, and the page itself
    # is then one range scan of exactly the rows it returns. Rows of no bytes (markers, empty
    # records) at the budget's very end are in. Only the page's last row can end past the budget
    # (the caller drops it unless it is the first).
    page_end = "(SELECT c.lo FROM cut c WHERE c.lo = c.hi)"
    aborted = (
        page_aborted("r", "%(topic)s", "%(partition)s", "%(start)s", page_end) if with_aborted
        else "false  -- not asked: read_uncommitted reads no aborted-transaction index"
    )
    return f"""
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
        SELECT {_RECORD_COLUMNS}, {aborted}
        FROM txlog.records r
        WHERE r.topic = %(topic)s AND r.partition = %(partition)s
          AND r."offset" >= %(start)s AND r."offset" < {page_end}
        ORDER BY r."offset"
    """


_FETCH_LOG_WITH_ABORTED = _fetch_log_sql(True)
_FETCH_LOG = _fetch_log_sql(False)


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
        "topic": topic, "partition": _partition(topic, partition), "start": Int8(start), "end": Int8(end),
        "max_bytes": Int8(max_bytes),
    }
    sql = _FETCH_LOG_WITH_ABORTED if with_aborted else _FETCH_LOG
    return _stored(driver(conn).execute(sql, params, binary=True).fetchall())


def records_browse(conn: Connection, topic: str, partition: int, start: int, limit: int) -> list[StoredRecord]:
    """Every record from ``start`` (control records too), each flagged if its transaction aborted."""
    sql = f"""
        SELECT {_RECORD_COLUMNS}, r.aborted
        FROM txlog.log_records r
        WHERE r.topic = :topic AND r.partition = :partition AND r."offset" >= :start
        ORDER BY r."offset"
        LIMIT :limit
    """
    rows = conn.execute(text(sql), {"topic": topic, "partition": partition, "start": start, "limit": limit}).all()
    return _stored(rows)


# --- retention ------------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class RetainedPartition:
    topic: str
    partition: int
    log_start_offset: int
    last_stable_offset: int
    retention_ms: int | None
    retention_bytes: int | None
    next_position: int  # the log position of the high watermark
    size_bytes: int  # bytes of data from the log start to the high watermark


def partitions_with_retention(conn: Connection, default_ms: int, default_bytes: int) -> list[RetainedPartition]:
    """Every partition with a time or size limit (its topic's retention.ms / retention.bytes, else
    the defaults; -1 is none) and some log above its log start. A config value that is not an
    integer (stored before configs were validated) counts as unset: it cannot stop retention."""
    rows = conn.execute(
        text(
            """
            SELECT s.topic, s.partition, s.log_start_offset, s.last_stable_offset,
                   CASE WHEN c.ms >= 0 THEN c.ms END, CASE WHEN c.bytes >= 0 THEN c.bytes END,
                   p.next_position,
                   p.next_position - COALESCE((SELECT r.position FROM txlog.records r
                       WHERE r.topic = p.topic AND r.partition = p.partition AND r."offset" = p.log_start_offset), p.next_position)
            FROM txlog.topics t
            CROSS JOIN LATERAL (
                SELECT COALESCE(CASE WHEN t.config->>'retention.ms' ~ '^-?[0-9]{1,19}$'
                                     THEN LEAST((t.config->>'retention.ms')::numeric, 9223372036854775807)::bigint END,
                                CAST(:default_ms AS bigint)) AS ms,
                       COALESCE(CASE WHEN t.config->>'retention.bytes' ~ '^-?[0-9]{1,19}$'
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
    key = f"txlog.log_trim/{topic}/{partition}"
    if not conn.execute(text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": key}).scalar_one():
        return None
    row = conn.execute(
        text("SELECT stored_start_offset, log_start_offset FROM txlog.partitions WHERE topic = :topic AND partition = :partition"),
        {"topic": topic, "partition": partition},
    ).first()
    if row is None or row[0] >= row[1]:
        return 0
    start, end = row[0], min(row[1], row[0] + batch)
    params = {"topic": topic, "partition": partition, "start": start, "end": end}
    deleted = conn.execute(
        text('DELETE FROM txlog.records WHERE topic = :topic AND partition = :partition AND "offset" >= :start AND "offset" < :end'),
        params,
    ).rowcount
    # An aborted range is dropped with its ABORT marker (its last offset); one that straddles the
    # log start stays, and keeps hiding its producer's records above it.
    conn.execute(
        text("DELETE FROM txlog.aborted_txns WHERE topic = :topic AND partition = :partition AND last_offset < :end"),
        params,
    )
    conn.execute(
        text(
            "UPDATE txlog.partitions SET stored_start_offset = GREATEST(stored_start_offset, :end) "
            "WHERE topic = :topic AND partition = :partition"
        ),
        params,
    )
    return deleted


# --- producer state -------------------------------------------------------------------------------

def producer_id_next(conn: Connection) -> int:
    return conn.execute(text("SELECT nextval('txlog.producer_id_seq')")).scalar_one()


def producer_state_get(conn: Connection, topic: str, partition: int, producer_id: int) -> ProducerStateEntry | None:
    row = conn.execute(
        text(
            f"SELECT producer_epoch, batches, txn_first_offset, {_ms('last_timestamp')} FROM txlog.producer_partitions "
            "WHERE topic = :topic AND partition = :partition AND producer_id = :pid"
        ),
        {"topic": topic, "partition": partition, "pid": producer_id},
    ).first()
    if row is None:
        return None
    return ProducerStateEntry(producer_id, row[0], tuple(BatchMetadata.from_json(b) for b in row[1]), row[2], row[3])


def producer_states_expire(conn: Connection, older_than_ms: int, limit: int = 1000) -> int:
    return conn.execute(
        text(
            """
            DELETE FROM txlog.producer_partitions WHERE ctid IN (
                SELECT ctid FROM txlog.producer_partitions
                WHERE txn_first_offset IS NULL AND last_timestamp < to_timestamp(:t / 1000.0)
                LIMIT :limit FOR UPDATE SKIP LOCKED)
            """
        ),
        {"t": older_than_ms, "limit": limit},
    ).rowcount


def producer_states_of(conn: Connection, producer_id: int | None = None, limit: int = 500) -> list[dict]:
    where = "WHERE producer_id = :pid" if producer_id is not None else ""
    rows = conn.execute(
        text(
            f"SELECT topic, partition, producer_id, producer_epoch, batches, txn_first_offset, {_ms('last_timestamp')} "
            f"FROM txlog.producer_partitions {where} ORDER BY producer_id DESC, topic, partition LIMIT :limit"
        ),
        {"pid": _int8(producer_id), "limit": limit},
    )
    return [dict(r._mapping) for r in rows]


# --- transactions ---------------------------------------------------------------------------------

def txn_get(
    conn: Connection,
    transactional_id: str,
    for_update: bool = False,
    skip_locked: bool = False,
    partitions: Sequence[TopicPartition] | None = None,
    groups: Sequence[str] | None = None,
) -> TxnMetadata | None:
    """A transactional id's state. Its partitions and groups are all of them, or with
    ``partitions``/``groups`` only those of them asked for (what a produce or an offset commit
    needs to know: is this one already in the transaction?) — a read that does not grow with the
    transaction. Every transactional produce and EndTxn starts here: it runs on the driver, rows
    as plain tuples."""
    lock = " FOR UPDATE OF t" + (" SKIP LOCKED" if skip_locked else "") if for_update else ""
    asked = partitions is not None or groups is not None
    # The version as of the statement's snapshot: when we waited for the row lock while another
    # transition committed, PostgreSQL re-reads the locked row but not the members, which are from
    # before that transition. Read again, now that the lock is held.
    seen = ", (SELECT s.version FROM txlog.transactions s WHERE s.transactional_id = t.transactional_id)" if for_update else ""
    statement = (
        f"SELECT {_txn_columns('t', 'asked' if asked else 'all')}{seen} FROM txlog.transactions t "
        f"WHERE t.transactional_id = %(tid)s{lock}"
    )
    params: dict[str, object] = {"tid": transactional_id}
    if asked:
        params.update(
            m_topics=[t for t, _ in partitions or ()], m_parts=[p for _, p in partitions or ()], m_groups=list(groups or ())
        )
    pg = driver(conn)
    row = pg.execute(statement, params).fetchone()
    if row is not None and for_update and row[-1] != row[5]:
        row = pg.execute(statement, params).fetchone()
        assert row is not None and row[-1] == row[5]
    return _txn_from_row(row) if row else None


def _txn_record_ctes(gate: str = "true") -> str:
    """The CTEs that record transitions (``txn_record``): the events, the partitions and groups they
    add, and the current-state row (``recorded``, which returns the new version), each written only
    if ``gate`` holds — the condition that transitions planned ahead put on themselves and their
    batches (``txn_append_if_unchanged``). Psycopg placeholders: ``txn_record`` runs on the driver."""
    return f"""events AS (
        INSERT INTO txlog.transaction_events (transactional_id, version, from_state, to_state, producer_id,
            producer_epoch, timeout_ms, at, partitions_added, groups_added, last_producer_id,
            last_producer_epoch, result, reason, transaction_version)
        SELECT %(tid)s, e.version, e.from_state, e.to_state, e.producer_id, e.producer_epoch, e.timeout_ms,
            to_timestamp(e.at_ms / 1000.0), e.partitions_added, e.groups_added, e.last_producer_id,
            e.last_producer_epoch, e.result, e.reason, e.transaction_version
        FROM jsonb_to_recordset(CAST(%(events)s AS jsonb)) AS e(
            version int, from_state text, to_state text, producer_id bigint, producer_epoch smallint, timeout_ms int,
            at_ms bigint, partitions_added jsonb, groups_added jsonb, last_producer_id bigint,
            last_producer_epoch smallint, result text, reason text, transaction_version smallint)
        WHERE {gate}
    ), members_added AS (
        INSERT INTO txlog.transaction_partitions (transactional_id, topic, partition)
        SELECT %(tid)s, u.topic, u.partition
        FROM unnest(CAST(%(added_topics)s AS text[]), CAST(%(added_parts)s AS int[])) AS u(topic, partition)
        WHERE {gate}
        ON CONFLICT DO NOTHING
    ), groups_added AS (
        INSERT INTO txlog.transaction_groups (transactional_id, group_id)
        SELECT %(tid)s, u.group_id FROM unnest(CAST(%(added_groups)s AS text[])) AS u(group_id)
        WHERE {gate}
        ON CONFLICT DO NOTHING
    ), recorded AS (
        INSERT INTO txlog.transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, version,
            started_at, updated_at, epoch_changed_at, deadline, last_producer_id,
            last_producer_epoch, last_result, fence_reason, coordinator, transaction_version, principal)
        SELECT %(tid)s, %(pid)s, %(epoch)s, %(state)s, %(timeout)s, %(version)s, to_timestamp(%(started)s / 1000.0),
            to_timestamp(%(updated)s / 1000.0), to_timestamp(%(epoch_changed)s / 1000.0),
            to_timestamp(%(deadline)s / 1000.0), %(last_pid)s, %(last_epoch)s, %(last_result)s, %(reason)s,
            %(coordinator)s, %(txn_version)s, CAST(%(principal)s AS text)
        WHERE {gate}
        ON CONFLICT (transactional_id) DO UPDATE SET
            producer_id = EXCLUDED.producer_id, producer_epoch = EXCLUDED.producer_epoch, state = EXCLUDED.state,
            timeout_ms = EXCLUDED.timeout_ms, version = EXCLUDED.version, started_at = EXCLUDED.started_at,
            updated_at = EXCLUDED.updated_at, epoch_changed_at = EXCLUDED.epoch_changed_at,
            deadline = EXCLUDED.deadline,
            last_producer_id = EXCLUDED.last_producer_id, last_producer_epoch = EXCLUDED.last_producer_epoch,
            last_result = EXCLUDED.last_result, fence_reason = EXCLUDED.fence_reason,
            transaction_version = EXCLUDED.transaction_version,
            principal = CASE WHEN CAST(%(starts)s AS boolean) THEN EXCLUDED.principal ELSE txlog.transactions.principal END
        -- The limits, against the rows as they were before this statement: the partitions already in
        -- the transaction, and the open transactions of the principal starting this one. Not updated
        -- (no row returned) when one is exceeded; the caller then fails the database transaction.
        WHERE CASE WHEN CAST(%(max_partitions)s AS int) IS NULL THEN true ELSE
                (SELECT count(*) FROM txlog.transaction_partitions m WHERE m.transactional_id = %(tid)s)
                + CAST(%(n_added)s AS int) <= CAST(%(max_partitions)s AS int) END
            AND CASE WHEN CAST(%(max_open)s AS int) IS NULL THEN true ELSE
                (SELECT count(*) FROM txlog.transactions o WHERE o.principal = CAST(%(principal)s AS text)
                 AND o.state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort') AND o.principal IS NOT NULL)
                < CAST(%(max_open)s AS int) END
        RETURNING version
    )"""


_TXN_RECORD = _compact(f"WITH {_txn_record_ctes()} SELECT version FROM recorded")


def _pending_offsets_ctes(gate: str = "true") -> str:
    """The CTEs that end a transaction's pending offsets, if ``gate`` holds: removed, and when
    ``%(commit_offsets)s`` made its groups' offsets (group offset rows written in (group, topic,
    partition) order)."""
    return f"""offsets_taken AS (
        DELETE FROM txlog.pending_group_offsets WHERE transactional_id = %(tid)s AND {gate}
        RETURNING group_id, topic, partition, "offset", metadata
    ), offsets_applied AS (
        INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata, committed_at)
        SELECT group_id, topic, partition, "offset", metadata, now() FROM offsets_taken
        WHERE CAST(%(commit_offsets)s AS boolean)
        ORDER BY group_id, topic, partition
        ON CONFLICT (group_id, topic, partition) DO UPDATE
        SET "offset" = EXCLUDED."offset", metadata = EXCLUDED.metadata, committed_at = EXCLUDED.committed_at
    )"""


_PENDING_OFFSETS_APPLY = _compact(f"WITH {_pending_offsets_ctes()} SELECT 1")


# Batches and the transitions of their transaction, in one statement (``txn_append_if_unchanged``).
_TXN_APPEND_IF_UNCHANGED = _compact(_log_append_sql(True, records_txn=True))


def txn_append_if_unchanged(
    conn: Connection, batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None],
    events: Sequence[TxnEvent], was: TxnMetadata, meta: TxnMetadata, coordinator: int, deadline_ms: int | None,
    resets_members: bool, ends: str | None = None,
) -> list[int] | None:
    """Batches of one transaction (distinct partitions: its markers, or the batch that adds its
    partition to the transaction; or none, AddPartitionsToTxn alone) and the transitions planned
    with them (``events``, leading from ``was`` to ``meta``; with ``resets_members`` the first
    starts a transaction, leaving the previous one's members behind; with ``ends``, "commit" or
    "abort", they end it, and its pending group offsets are applied or dropped), in one statement
    that takes its locks itself. Written only if the transaction's row is still ``was`` (its
    version, state, producer id and epoch), every batch's partition and producer state still as
    planned against (as ``log_append_if_unchanged`` checks them), and every partition added exists;
    a row or partition another database transaction holds writes nothing either. Only group offset
    rows, last in the lock order, are waited for.
    On a connection in autocommit it is the whole database transaction, one round trip. Answers
    each batch's partition's log start offset if written, None if not. No limit is checked: the
    caller checked them against ``was``, which is exact at its version."""
    params = _txn_append_if_unchanged_params(
        batches, planned_against, events, was, meta, coordinator, deadline_ms, resets_members, ends
    )
    return _txn_appended(driver(conn).execute(_TXN_APPEND_IF_UNCHANGED, params).fetchone(), len(batches))


async def txn_append_if_unchanged_awaited(
    conn: psycopg.AsyncConnection, batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None],
    events: Sequence[TxnEvent], was: TxnMetadata, meta: TxnMetadata, coordinator: int, deadline_ms: int | None,
    resets_members: bool, ends: str | None = None,
) -> list[int] | None:
    """``txn_append_if_unchanged`` on a connection of an event loop (``db.LoopConnections``, in
    autocommit): the same statement, awaited."""
    params = _txn_append_if_unchanged_params(
        batches, planned_against, events, was, meta, coordinator, deadline_ms, resets_members, ends
    )
    cursor = await conn.execute(_TXN_APPEND_IF_UNCHANGED, params)
    return _txn_appended(await cursor.fetchone(), len(batches))


def _txn_append_if_unchanged_params(
    batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None], events: Sequence[TxnEvent],
    was: TxnMetadata, meta: TxnMetadata, coordinator: int, deadline_ms: int | None, resets_members: bool,
    ends: str | None,
) -> dict[str, Any]:
    params = _log_append_params(batches, planned_against)
    params.update(_txn_record_params(events, meta, coordinator, deadline_ms))
    params.update(
        n=Int8(len(batches)), b_tid=text_array([was.transactional_id] * len(batches)), was_version=Int8(was.version),
        was_state=was.state.value, was_pid=Int8(was.producer_id), was_epoch=Int8(was.producer_epoch),
        resets=resets_members, end_offsets=ends is not None and bool(was.groups), commit_offsets=ends == "commit",
    )
    return params


def _txn_appended(row: Any, batches: int) -> list[int] | None:
    kept, log_starts, _, recorded = row
    assert recorded in (0, 1) and (not recorded or len(kept or ()) == batches), (kept, recorded)
    return list(log_starts or ()) if recorded else None


def txn_members_clear(conn: Connection, transactional_id: str) -> None:
    """Forget the partitions and groups of the transactional id's previous transaction (a new one
    starts, or a producer re-initialises): as many rows as that transaction had, once. One
    statement."""
    conn.execute(
        text(
            "WITH partitions_cleared AS (DELETE FROM txlog.transaction_partitions WHERE transactional_id = :tid) "
            "DELETE FROM txlog.transaction_groups WHERE transactional_id = :tid"
        ),
        {"tid": transactional_id},
    )


def txn_record(
    conn: Connection, events: Sequence[TxnEvent], meta: TxnMetadata, coordinator: int, deadline_ms: int | None,
    *, max_partitions: int | None = None, principal: str | None = None, starts: bool = False, max_open: int | None = None,
) -> bool:
    """Append consecutive transitions to the transactional id's events and store the state they
    lead to (``meta``, the fold of the events), in one statement: the events, the current-state row,
    and a row for each partition or group an event adds. A second writer of the same version fails
    on the events' primary key. ``starts``: the events start a transaction, which records
    ``principal`` as its starter. False, with the state row unchanged, when the transaction would
    have more than ``max_partitions`` partitions or its principal more than ``max_open`` open
    transactions; the caller must then fail the database transaction (the events and members were
    written)."""
    params = _txn_record_params(
        events, meta, coordinator, deadline_ms, max_partitions=max_partitions, principal=principal, starts=starts,
        max_open=max_open,
    )
    return driver(conn).execute(_TXN_RECORD, params).fetchone() is not None


def _txn_record_params(
    events: Sequence[TxnEvent], meta: TxnMetadata, coordinator: int, deadline_ms: int | None,
    *, max_partitions: int | None = None, principal: str | None = None, starts: bool = False, max_open: int | None = None,
) -> dict[str, Any]:
    assert events and all(e.transactional_id == meta.transactional_id for e in events)
    assert [e.version for e in events] == list(range(meta.version - len(events) + 1, meta.version + 1))
    assert events[-1].to_state is meta.state
    added = [tp for e in events for tp in e.partitions_added]
    return {
        "tid": meta.transactional_id,
        "events": json.dumps(
            [
                {
                    "version": e.version,
                    "from_state": e.from_state.value if e.from_state else None,
                    "to_state": e.to_state.value,
                    "producer_id": e.producer_id,
                    "producer_epoch": e.producer_epoch,
                    "timeout_ms": e.timeout_ms,
                    "at_ms": e.at_ms,
                    "partitions_added": e.partitions_added,
                    "groups_added": e.groups_added,
                    "last_producer_id": e.last_producer_id,
                    "last_producer_epoch": e.last_producer_epoch,
                    "result": e.result,
                    "reason": e.reason,
                    "transaction_version": e.transaction_version,
                }
                for e in events
            ]
        ),
        "version": _int8(meta.version),
        "state": meta.state.value,
        "pid": _int8(meta.producer_id),
        "epoch": _int8(meta.producer_epoch),
        "timeout": _int8(meta.timeout_ms),
        "started": _int8(meta.started_at_ms),
        "updated": _int8(meta.updated_at_ms),
        "epoch_changed": _int8(meta.epoch_changed_at_ms),
        "deadline": _int8(deadline_ms),
        "added_topics": [t for t, _ in added],
        "added_parts": [p for _, p in added],
        "added_groups": [g for e in events for g in e.groups_added],
        "last_pid": _int8(meta.last_producer_id),
        "last_epoch": _int8(meta.last_producer_epoch),
        "last_result": meta.last_result,
        "reason": meta.fence_reason,
        "coordinator": _int8(coordinator),
        "txn_version": _int8(meta.transaction_version),
        "principal": principal,
        "starts": starts,
        "max_partitions": _int8(max_partitions),
        "n_added": _int8(len(added)),
        "max_open": _int8(max_open),
    }


def txn_principal_lock(conn: Connection, principal: str) -> None:
    """Transactions of ``principal`` start one at a time (a transaction-level advisory lock), so
    that each counts the others' open transactions exactly."""
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('txlog.principal'), hashtext(:p))"), {"p": principal})


def txn_limit_usage(conn: Connection, transactional_id: str, principal: str | None) -> tuple[int, int]:
    """The partitions in the transactional id's transaction, and the open transactions ``principal``
    started: what ``txn_record``'s limits found."""
    row = conn.execute(
        text(
            "SELECT (SELECT count(*) FROM txlog.transaction_partitions WHERE transactional_id = :tid), "
            "(SELECT count(*) FROM txlog.transactions WHERE principal = CAST(:p AS text) "
            "AND state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort') AND principal IS NOT NULL)"
        ),
        {"tid": transactional_id, "p": principal},
    ).one()
    return int(row[0]), int(row[1])


def producer_id_assign(conn: Connection, producer_id: int, transactional_id: str, now_ms: int) -> None:
    """Record that ``producer_id`` is now the transactional id's (InitProducerId, or a new id once
    the epoch is exhausted)."""
    conn.execute(
        text(
            "INSERT INTO txlog.producer_ids (producer_id, transactional_id, created_at) "
            "VALUES (:pid, :tid, to_timestamp(:now / 1000.0))"
        ),
        {"pid": _int8(producer_id), "tid": transactional_id, "now": now_ms},
    )


def producer_ids_retire(conn: Connection, transactional_id: str, keep: int | None, reason: str, now_ms: int) -> None:
    """Every producer id of the transactional id but ``keep`` is no longer its: each epoch of them
    is fenced, for ``reason``."""
    conn.execute(
        text(
            "UPDATE txlog.producer_ids SET retired_at = to_timestamp(:now / 1000.0), retire_reason = :reason "
            "WHERE transactional_id = :tid AND retired_at IS NULL AND producer_id IS DISTINCT FROM CAST(:keep AS bigint)"
        ),
        {"tid": transactional_id, "keep": keep, "reason": reason, "now": now_ms},
    )


def producer_ids_forget(conn: Connection, retired_before_ms: int, limit: int = 1000) -> int:
    """Forget producer ids retired longer ago than producer.id.expiration.ms."""
    return conn.execute(
        text(
            """
            DELETE FROM txlog.producer_ids WHERE producer_id IN (
                SELECT producer_id FROM txlog.producer_ids
                WHERE retired_at < to_timestamp(:t / 1000.0) LIMIT :limit FOR UPDATE SKIP LOCKED)
            """
        ),
        {"t": retired_before_ms, "limit": limit},
    ).rowcount


_EVENT_COLUMNS = f"""
transactional_id, version, from_state, to_state, producer_id, producer_epoch, timeout_ms,
{_ms('at')}, partitions_added, groups_added, last_producer_id, last_producer_epoch, result, reason,
transaction_version
"""


def txn_events(
    conn: Connection, transactional_id: str, limit: int | None = None, before_version: int | None = None
) -> list[TxnEvent]:
    """A transactional id's events, oldest first; with ``limit``, only the last ``limit`` of them,
    and with ``before_version`` only those older than that version (a backward primary-key scan:
    one page costs its size, however long the history)."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_EVENT_COLUMNS} FROM txlog.transaction_events
            WHERE transactional_id = :tid AND (CAST(:before AS int) IS NULL OR version < CAST(:before AS int))
            ORDER BY version DESC LIMIT :limit
            """
        ),
        {"tid": transactional_id, "limit": limit, "before": before_version},
    )
    events = [
        TxnEvent(
            transactional_id=r[0],
            version=r[1],
            from_state=TxnState(r[2]) if r[2] else None,
            to_state=TxnState(r[3]),
            producer_id=r[4],
            producer_epoch=r[5],
            timeout_ms=r[6],
            at_ms=r[7],
            partitions_added=tuple((t, p) for t, p in r[8]),
            groups_added=tuple(r[9]),
            last_producer_id=r[10],
            last_producer_epoch=r[11],
            result=r[12],
            reason=r[13],
            transaction_version=r[14],
        )
        for r in rows
    ]
    return events[::-1]


def txn_delete(conn: Connection, transactional_id: str) -> None:
    for table in ("pending_group_offsets", "transaction_partitions", "transaction_groups", "transaction_events", "transactions"):
        conn.execute(text(f"DELETE FROM txlog.{table} WHERE transactional_id = :tid"), {"tid": transactional_id})


def txn_list(
    conn: Connection, state: str | None, started_before_ms: int | None, prefix: str | None = None, limit: int = 1000
) -> list[TxnMetadata]:
    clauses = ["true"]
    if state is not None:
        clauses.append("t.state = :state")
    if started_before_ms is not None:
        clauses.append("t.started_at < to_timestamp(:before / 1000.0)")
    if prefix:
        clauses.append("t.transactional_id LIKE :prefix ESCAPE '\\'")
    rows = conn.execute(
        text(f"SELECT {_TXN_COLUMNS} FROM txlog.transactions t WHERE {' AND '.join(clauses)} ORDER BY t.transactional_id LIMIT :limit"),
        {
            "state": state,
            "before": started_before_ms,
            "prefix": _like_prefix(prefix),
            "limit": limit,
        },
    )
    return [_txn_from_row(r) for r in rows]


def _like_prefix(prefix: str | None) -> str:
    return (prefix or "").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# The sweeper's claims: the next due transaction that nobody holds, locked, in the caller's
# database transaction. Several sweepers on several hosts each take a different one.
_CLAIM = {  # kind: (what is due, in which order)
    "timed_out": ("t.state = 'Ongoing' AND t.deadline < to_timestamp(:now / 1000.0)", "t.deadline"),
    "prepared": ("t.state IN ('PrepareCommit', 'PrepareAbort') AND t.updated_at < to_timestamp(:before / 1000.0)", "t.updated_at"),
    "idle": ("t.state = ANY(CAST(:states AS text[])) AND t.updated_at < to_timestamp(:before / 1000.0)", "t.updated_at"),
}


def txn_claim(
    conn: Connection, kind: str, now_ms: int = 0, before_ms: int = 0, states: Sequence[str] = (), skip: Sequence[str] = ()
) -> TxnMetadata | None:
    """Lock and return the next due transaction of ``kind`` ("timed_out": Ongoing past its
    deadline; "prepared": PrepareCommit/PrepareAbort not completed since ``before_ms``; "idle": in
    one of ``states`` since before ``before_ms``), skipping those locked by others and ``skip``."""
    due, order = _CLAIM[kind]
    row = conn.execute(
        text(
            f"SELECT {_TXN_COLUMNS} FROM txlog.transactions t "
            f"WHERE {due} AND t.transactional_id <> ALL(CAST(:skip AS text[])) "
            f"ORDER BY {order} LIMIT 1 FOR UPDATE OF t SKIP LOCKED"
        ),
        {"now": now_ms, "before": before_ms, "states": list(states), "skip": list(skip)},
    ).first()
    return _txn_from_row(row) if row else None


def txn_state_counts(conn: Connection) -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute(text("SELECT state, count(*) FROM txlog.transactions GROUP BY state"))}


# --- consumer group offsets -----------------------------------------------------------------------

@dataclass(frozen=True)
class GroupOffset:
    topic: str
    partition: int
    offset: int
    metadata: str


def group_offsets_upsert(conn: Connection, group_id: str, offsets: Sequence[GroupOffset]) -> None:
    offsets = sorted(offsets, key=lambda o: (o.topic, o.partition))  # fixed lock order
    conn.execute(
        text(
            """
            INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata, committed_at)
            SELECT :group_id, u.topic, u.partition, u.off, u.meta, now()
            FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[]), CAST(:offs AS bigint[]), CAST(:metas AS text[]))
                 AS u(topic, partition, off, meta)
            ON CONFLICT (group_id, topic, partition) DO UPDATE
            SET "offset" = EXCLUDED."offset", metadata = EXCLUDED.metadata, committed_at = EXCLUDED.committed_at
            """
        ),
        {
            "group_id": group_id,
            "topics": [o.topic for o in offsets],
            "parts": [o.partition for o in offsets],
            "offs": [o.offset for o in offsets],
            "metas": [o.metadata for o in offsets],
        },
    )


class GroupOffsetRow(NamedTuple):
    topic: str
    partition: int
    offset: int | None  # None: nothing committed
    metadata: str | None
    pending: bool  # a transaction has an offset pending for the partition


_GROUP_OFFSET_COLUMNS = """
    k.topic, k.partition, g."offset", g.metadata,
    EXISTS (SELECT 1 FROM txlog.pending_group_offsets p
            WHERE p.group_id = :g AND p.topic = k.topic AND p.partition = k.partition) AS pending
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


def group_offsets_fetch(conn: Connection, group_id: str, partitions: Sequence[tuple[str, int]] | None = None) -> list[GroupOffsetRow]:
    """A group's committed offset of each of ``partitions`` (in their order), or of every partition
    with a committed or pending offset (in (topic, partition) order), each flagged if a transaction
    has an offset pending for it (a primary-key lookup per partition in each table)."""
    if partitions is None:
        rows = conn.execute(_GROUP_OFFSETS_ALL, {"g": group_id})
    else:
        rows = conn.execute(
            _GROUP_OFFSETS_OF, {"g": group_id, "topics": [t for t, _ in partitions], "parts": [p for _, p in partitions]}
        )
    return [GroupOffsetRow(*r) for r in rows]


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


def pending_offsets_upsert(
    conn: Connection, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int, offsets: Sequence[GroupOffset]
) -> None:
    offsets = sorted(offsets, key=lambda o: (o.topic, o.partition))
    conn.execute(
        text(
            """
            INSERT INTO txlog.pending_group_offsets (group_id, topic, partition, transactional_id, producer_id,
                                                     producer_epoch, "offset", metadata)
            SELECT :group_id, u.topic, u.partition, :tid, :pid, :epoch, u.off, u.meta
            FROM unnest(CAST(:topics AS text[]), CAST(:parts AS int[]), CAST(:offs AS bigint[]), CAST(:metas AS text[]))
                 AS u(topic, partition, off, meta)
            ON CONFLICT (group_id, topic, partition, transactional_id) DO UPDATE
            SET "offset" = EXCLUDED."offset", metadata = EXCLUDED.metadata, producer_id = EXCLUDED.producer_id,
                producer_epoch = EXCLUDED.producer_epoch, committed_at = now()
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
            "metas": [o.metadata for o in offsets],
        },
    )


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
    return [dict(r._mapping) for r in rows]


def pending_offsets_of_txn(conn: Connection, transactional_id: str) -> list[dict]:
    rows = conn.execute(
        text(
            'SELECT group_id, topic, partition, "offset", metadata FROM txlog.pending_group_offsets '
            "WHERE transactional_id = :tid ORDER BY group_id, topic, partition"
        ),
        {"tid": transactional_id},
    )
    return [dict(r._mapping) for r in rows]


# --- read side of the admin pages (inspection only; every statement is index-served) --------------

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


@dataclass(frozen=True)
class LogRecord:
    """A record as an operator browses it: data or control, with what became of its transaction."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    producer_id: int | None
    producer_epoch: int | None
    sequence: int | None
    is_transactional: bool
    control_type: int | None
    aborted: bool  # its transaction aborted (txlog.log_records.aborted)
    open: bool  # its transaction has no marker yet on this partition


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
        SELECT {_RECORD_COLUMNS}, r.aborted,
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
    records = [LogRecord(r[0], r[1], r[2], _headers(r[3], r[4]), *r[5:11], *r[13:]) for r in rows]
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
        text(f"SELECT {_TXN_COLUMNS} FROM txlog.transactions t WHERE {' AND '.join(clauses)} ORDER BY t.transactional_id LIMIT :limit"),
        {
            "states": list(states or ()),
            "before": started_before_ms,
            "prefix": _like_prefix(prefix),
            "after": after,
            "limit": limit,
        },
    )
    return [_txn_from_row(r) for r in rows]


def txns_overdue(conn: Connection, now_ms: int, prepared_before_ms: int, limit: int = 100) -> list[TxnMetadata]:
    """Ongoing transactions past their timeout (the sweeper's deadline index) and prepared ones
    not completed since ``prepared_before_ms`` (the prepared index)."""
    rows = conn.execute(
        text(
            f"""
            (SELECT {_TXN_COLUMNS} FROM txlog.transactions t
             WHERE t.state = 'Ongoing' AND t.deadline < to_timestamp(:now / 1000.0) ORDER BY t.deadline LIMIT :limit)
            UNION ALL
            (SELECT {_TXN_COLUMNS} FROM txlog.transactions t
             WHERE t.state IN ('PrepareCommit', 'PrepareAbort') AND t.updated_at < to_timestamp(:before / 1000.0)
             ORDER BY t.updated_at LIMIT :limit)
            """
        ),
        {"now": now_ms, "before": prepared_before_ms, "limit": limit},
    )
    return [_txn_from_row(r) for r in rows]


@dataclass(frozen=True)
class LsoHolder:
    """The open transaction whose first offset is a partition's last stable offset."""

    topic: str
    partition: int
    last_stable_offset: int
    high_watermark: int
    producer_id: int
    producer_epoch: int
    transactional_id: str | None
    state: str | None
    started_at_ms: int | None
    last_append_ms: int


def lso_holders(conn: Connection) -> list[LsoHolder]:
    """Per partition with an open transaction, the one holding its last stable offset back. Reads
    only the partial index of open transactions' first offsets, then primary-key lookups."""
    rows = conn.execute(
        text(
            f"""
            SELECT h.topic, h.partition, h.txn_first_offset, p.next_offset, h.producer_id, h.producer_epoch,
                   t.transactional_id, t.state, {_ms('t.started_at')}, {_ms('h.last_timestamp')}
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
                WHERE t.producer_id = h.producer_id AND t.state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort')
                LIMIT 1
            ) t ON true
            ORDER BY h.topic, h.partition
            """
        )
    )
    return [LsoHolder(*r) for r in rows]


def _producer_row(r) -> dict:  # type: ignore[no-untyped-def]
    return dict(r._mapping)


_PRODUCER_COLUMNS = f"""
pp.topic, pp.partition, pp.producer_id, pp.producer_epoch, pp.batches, pp.txn_first_offset,
{_ms('pp.last_timestamp')} AS last_timestamp_ms,
(SELECT pi.transactional_id FROM txlog.producer_ids pi WHERE pi.producer_id = pp.producer_id) AS transactional_id
"""


def producer_states_page(
    conn: Connection,
    after: tuple[str, int, int] | None,
    limit: int,
    topic: str | None = None,
    open_only: bool = False,
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
                   COALESCE(c.lag, 0)::bigint AS lag, {_ms('c.last_commit')} AS last_commit_ms,
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
            SELECT g.topic, g.partition, g."offset", g.metadata, {_ms('g.committed_at')} AS committed_at_ms,
                   s.log_start_offset, s.last_stable_offset, s.high_watermark
            FROM txlog.group_offsets g
            LEFT JOIN txlog.partition_status s ON s.topic = g.topic AND s.partition = g.partition
            WHERE g.group_id = :g
            ORDER BY g.topic, g.partition
            """
        ),
        {"g": group_id},
    )
    return [dict(r._mapping) for r in rows]


# --- the Kafka wire gateway's cluster -------------------------------------------------------------

def cluster_id_get(conn: Connection) -> str | None:
    return conn.execute(text("SELECT cluster_id FROM txlog.cluster WHERE id = 1")).scalar()


def cluster_id_create(conn: Connection) -> None:
    """Make the cluster id if there is none yet (the migration that creates the table makes it; a
    schema built from the tables alone has none): a random UUID as Kafka writes one, URL-safe
    base64 without padding."""
    conn.execute(
        text(
            "INSERT INTO txlog.cluster (id, cluster_id) "
            "VALUES (1, translate(rtrim(encode(uuid_send(gen_random_uuid()), 'base64'), '='), '+/', '-_')) "
            "ON CONFLICT (id) DO NOTHING"
        )
    )


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    host: str
    port: int
    expires_at_ms: int


def kafka_node_claim(conn: Connection, node_id: int, host: str, port: int, token: str, lease_ms: int) -> bool:
    """Take or renew ``node_id`` for the process ``token`` until ``lease_ms`` from now (the
    database's clock): granted when the id is free, its lease has ended, or ``token`` holds it
    already (a renewal, also after its lease ended if nobody took the id meanwhile). False when
    another process holds it, its lease running."""
    row = conn.execute(
        text(
            """
            INSERT INTO txlog.kafka_nodes (node_id, host, port, process_token, registered_at, expires_at)
            VALUES (:node_id, :host, :port, :token, clock_timestamp(), clock_timestamp() + make_interval(secs => :lease_ms / 1000.0))
            ON CONFLICT (node_id) DO UPDATE
            SET host = EXCLUDED.host, port = EXCLUDED.port, process_token = EXCLUDED.process_token,
                registered_at = CASE WHEN txlog.kafka_nodes.process_token = EXCLUDED.process_token
                                     THEN txlog.kafka_nodes.registered_at ELSE EXCLUDED.registered_at END,
                expires_at = EXCLUDED.expires_at
            WHERE txlog.kafka_nodes.process_token = EXCLUDED.process_token OR txlog.kafka_nodes.expires_at <= clock_timestamp()
            RETURNING node_id
            """
        ),
        {"node_id": node_id, "host": host, "port": port, "token": token, "lease_ms": lease_ms},
    ).first()
    return row is not None


def kafka_node_release(conn: Connection, node_id: int, token: str) -> None:
    conn.execute(text("DELETE FROM txlog.kafka_nodes WHERE node_id = :node_id AND process_token = :token"), {"node_id": node_id, "token": token})


def kafka_node_get(conn: Connection, node_id: int) -> KafkaNode | None:
    row = conn.execute(
        text(f"SELECT node_id, host, port, {_ms('expires_at')} FROM txlog.kafka_nodes WHERE node_id = :node_id"),
        {"node_id": node_id},
    ).first()
    return KafkaNode(*row) if row else None


def kafka_nodes_live(conn: Connection) -> list[KafkaNode]:
    """The nodes whose lease runs, in node id order."""
    rows = conn.execute(
        text(
            f"SELECT node_id, host, port, {_ms('expires_at')} FROM txlog.kafka_nodes "
            "WHERE expires_at > clock_timestamp() ORDER BY node_id"
        )
    )
    return [KafkaNode(*r) for r in rows]
