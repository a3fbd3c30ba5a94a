"""Appending to partitions' logs: the append lock and what a batch is planned against
(``partition_lock_for_append``), and the append itself — plain under the caller's locks
(``log_append``), or conditional, taking its locks itself (``log_append_if_unchanged``,
``txn_append_if_unchanged`` with the transitions of the batches' transaction), each one statement,
one round trip."""

from __future__ import annotations

import itertools
import json
from typing import Any, Sequence

from psycopg.types.numeric import Int8
from sqlalchemy.engine import Connection

from app.domain.log import AppendBatch, AppendPosition, ProducerOwner, unknown_partition
from app.domain.producer_state import BatchMetadata, ProducerStateEntry
from app.domain.records import headers_object
from app.domain.transactions import TxnEvent, TxnMetadata
from app.storage._sql import ONGOING_SQL, _compact, _ms
from app.storage.arrays import bytea_array, int4_array, int8_array, text_array
from app.storage.db import driver
from app.storage.groups import PENDING_OFFSETS_CTES
from app.storage.log import NOTIFY_CHANNEL, is_partition_number
from app.storage.statements import Statement
from app.storage.transactions import TXN_COLUMNS_NO_MEMBERS, TXN_RECORD_CTES, txn_from_row, txn_record_params


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
        "parts": int4_array([p if is_partition_number(p) else -1 for _, p, _ in wanted]),
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
    next_offset, log_start_offset, next_position, _, pp_epoch, pp_batches, pp_txn_first, pp_last_ts, owner_tid, retire_reason = (
        row[:10]
    )
    entry = None
    if pp_epoch is not None and producer_id is not None:
        entry = ProducerStateEntry(
            producer_id, pp_epoch, tuple(BatchMetadata.from_json(b) for b in pp_batches), pp_txn_first, pp_last_ts
        )
    owner = None
    if owner_tid is not None:
        txn_row = row[_LOCK_OWNER_COLUMNS:]
        meta = txn_from_row(txn_row) if txn_row[0] is not None else None
        owner = ProducerOwner(owner_tid, retire_reason, meta)
    return AppendPosition(next_offset, log_start_offset, next_position, entry, owner)


_LOCK_OWNER_COLUMNS = 11  # the transaction's columns start here, after the ordinal

_LOCK_FOR_APPEND = f"""
    SELECT w.i, p.next_offset, p.log_start_offset, p.next_position,
           (SELECT s.next_offset FROM txlog.partitions s
            WHERE s.topic = p.topic AND s.partition = p.partition) AS seen_next_offset,  -- the statement's snapshot
           pp.producer_epoch AS pp_epoch, pp.batches AS pp_batches, pp.txn_first_offset AS pp_txn_first_offset,
           {_ms("pp.last_timestamp")} AS pp_last_timestamp,
           pi.transactional_id AS owner_tid, pi.retire_reason, pi.retired_at,
           {TXN_COLUMNS_NO_MEMBERS}
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


# One statement, one round trip, for any number of batches on distinct partitions, parameters sent
# binary (packed arrays: bytes as they are, no hex text to build and parse): the batches' fields as
# arrays of one element per batch (``b``), their records as arrays of one element per record, each
# with its batch's ordinal. Long-polling fetches are notified only when some process has registered
# to listen on the partition (``fetch_listeners``, see ``fetch_listeners_register``): an append
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
# The three forms are sent without their indentation (``_compact``).

# The batches' fields, one row per batch (``b``), numbered by their order in the arrays (``i``).
_BATCHES = """unnest(
            CAST(%(b_topic)b AS text[]), CAST(%(b_partition)b AS int[]), CAST(%(b_base)b AS bigint[]),
            CAST(%(b_next)b AS bigint[]), CAST(%(b_base_position)b AS bigint[]), CAST(%(b_next_position)b AS bigint[]),
            CAST(%(b_pid)b AS bigint[]), CAST(%(b_epoch)b AS int[]), CAST(%(b_seq)b AS bigint[]), CAST(%(b_txn)b AS int[]),
            CAST(%(b_control)b AS int[]), CAST(%(b_txn_first)b AS bigint[]), CAST(%(b_state_epoch)b AS int[]),
            CAST(%(b_state)b AS text[]), CAST(%(b_state_txn_first)b AS bigint[]), CAST(%(b_aborted_first)b AS bigint[]),
            CAST(%(b_append_ts)b AS bigint[]), CAST(%(b_was_epoch)b AS int[]), CAST(%(b_was_state)b AS text[]),
            CAST(%(b_was_txn_first)b AS bigint[]), CAST(%(b_marker)b AS int[])
        ) WITH ORDINALITY AS b(topic, partition, base, next, base_position, next_position, pid, epoch, seq, txn,
                               control, txn_first, state_epoch, state, state_txn_first, aborted_first, append_ts,
                               was_epoch, was_state, was_txn_first, marker, i)"""

# The conditional forms' batches: each kept only if its partition (locked here) and its producer
# are as it was planned against, and a transactional batch's transaction is in ``t`` (below) with
# the batch's producer id and epoch — and, unless ``t`` is the transaction as planned (whose
# version pins its members), with the batch's partition among its members.
_BATCHES_IF_UNCHANGED = (
    "(SELECT * FROM "
    + _BATCHES
    + """ LIMIT %(n)s) b
        JOIN txlog.partitions p ON p.topic = b.topic AND p.partition = b.partition
                                AND p.next_offset = b.base AND p.next_position = b.base_position
        WHERE b.pid IS NULL OR (
            CASE WHEN (CAST(%(b_tid)b AS text[]))[b.i] IS NULL
                THEN NOT EXISTS (SELECT 1 FROM txlog.producer_ids pi WHERE pi.producer_id = b.pid AND pi.transactional_id IS NOT NULL)
                ELSE EXISTS (SELECT 1 FROM t WHERE t.transactional_id = (CAST(%(b_tid)b AS text[]))[b.i]
                                AND t.producer_id = b.pid AND t.producer_epoch = b.epoch
                                AND (t.planned OR EXISTS (SELECT 1 FROM txlog.transaction_partitions m
                                                          WHERE m.transactional_id = t.transactional_id
                                                            AND m.topic = b.topic AND m.partition = b.partition)))
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
)

# The transactions of transactional batches, locked (shared) before any partition, as
# everywhere; evaluated once, by the first batch that asks. Recording transitions, the
# transaction's row is locked to be updated, and only as they were planned against (its
# version, state, producer id and epoch); every batch must be kept, or none is (``ok``: the
# transitions too), every partition added must exist, and the members of the transaction that
# ended are forgotten when the first transition starts the next one (``resets``) — but for
# those it adds again, which stay. Ending a transaction (``end_offsets``), its pending group
# offsets are applied or dropped.
_ONGOING_TXNS = f"""t AS MATERIALIZED (
            SELECT t.transactional_id, t.producer_id, t.producer_epoch, false AS planned FROM txlog.transactions t
            WHERE t.transactional_id = ANY(CAST(%(b_tid)b AS text[])) AND t.state = {ONGOING_SQL}
            FOR SHARE SKIP LOCKED
        ), """
_PLANNED_TXN = """t AS MATERIALIZED (
            SELECT t.transactional_id, t.producer_id, t.producer_epoch, true AS planned FROM txlog.transactions t
            WHERE t.transactional_id = %(tid)s AND t.version = %(was_version)s AND t.state = %(was_state)s
              AND t.producer_id = %(was_pid)s AND t.producer_epoch = %(was_epoch)s
            FOR UPDATE SKIP LOCKED
        ), """
_KEPT_WITH_TXN = """b AS MATERIALIZED (SELECT * FROM kept WHERE (SELECT count(*) FROM kept) = %(n)s
        ), ok AS MATERIALIZED (
            SELECT EXISTS (SELECT 1 FROM t) AND (SELECT count(*) FROM b) = %(n)s AND NOT EXISTS (
                SELECT 1 FROM unnest(CAST(%(added_topics)s AS text[]), CAST(%(added_parts)s AS int[])) AS u(topic, partition)
                WHERE NOT EXISTS (SELECT 1 FROM txlog.partitions p WHERE p.topic = u.topic AND p.partition = u.partition)
            ) AS go
        ), txn_gate AS (SELECT go FROM ok
        ), offsets_gate AS (SELECT CAST(%(end_offsets)s AS boolean) AND go AS go FROM ok
        ), members_reset AS (
            DELETE FROM txlog.transaction_partitions m
            WHERE m.transactional_id = %(tid)s AND CAST(%(resets)s AS boolean) AND (SELECT go FROM ok)
              AND (m.topic, m.partition) NOT IN (
                  SELECT * FROM unnest(CAST(%(added_topics)s AS text[]), CAST(%(added_parts)s AS int[])))
        ), groups_reset AS (
            DELETE FROM txlog.transaction_groups g
            WHERE g.transactional_id = %(tid)s AND CAST(%(resets)s AS boolean) AND (SELECT go FROM ok)
              AND g.group_id <> ALL(CAST(%(added_groups)s AS text[]))
        ), """

# What an append writes: the records (a batch's last one its transaction's marker when the batch
# ends its transaction: ``marker``), each partition's next offset and log position, the producers'
# states, the aborted transactions' index.
_APPENDED = """, appended AS (
        INSERT INTO txlog.records (topic, partition, "offset", key, value, headers, header_keys, header_values,
                                   "timestamp", producer_id, producer_epoch, sequence, is_transactional,
                                   control_type, position, txn_first_offset)
        SELECT b.topic, b.partition, u.off, u.k, u.v, CAST(u.h AS jsonb),
               CASE WHEN u.hs IS NOT NULL THEN (CAST(%(hk)b AS text[]))[u.hs:u.he] END,
               CASE WHEN u.hs IS NOT NULL THEN (CAST(%(hv)b AS bytea[]))[u.hs:u.he] END,
               to_timestamp(u.ts / CAST(1000 AS float8)), b.pid, b.epoch,
               CASE WHEN b.seq IS NULL OR (b.marker IS NOT NULL AND u.off = b.next - 1) THEN NULL
                    ELSE ((b.seq + u.off - b.base) %% 2147483648)::int END,
               b.txn = 1, CASE WHEN b.marker IS NOT NULL AND u.off = b.next - 1 THEN b.marker ELSE b.control END,
               u.pos, b.txn_first
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
    )"""

# The answer: the batches appended, their partitions' log start offsets, the notifications sent.
_APPENDED_ANSWER = """
    SELECT (SELECT array_agg(b.i ORDER BY b.i) FROM b),
           (SELECT array_agg(p.log_start_offset ORDER BY b.i)
            FROM b JOIN txlog.partitions p ON p.topic = b.topic AND p.partition = b.partition),
           (SELECT count(pg_notify(%(channel)b, l.topic || ':' || l.partition))
            FROM txlog.fetch_listeners l JOIN b ON l.topic = b.topic AND l.partition = b.partition
            WHERE l.expires_at > now())"""

_LOG_APPEND = _compact("WITH b AS MATERIALIZED (SELECT b.* FROM " + _BATCHES + ")" + _APPENDED + _APPENDED_ANSWER)

_LOG_APPEND_IF_UNCHANGED = _compact(
    "WITH " + _ONGOING_TXNS + "b AS MATERIALIZED (SELECT b.* FROM " + _BATCHES_IF_UNCHANGED + ")" + _APPENDED + _APPENDED_ANSWER
)

# Batches and the transitions of their transaction, in one statement (``txn_append_if_unchanged``).
_TXN_APPEND_IF_UNCHANGED = _compact(
    "WITH "
    + _PLANNED_TXN
    + "kept AS MATERIALIZED (SELECT b.* FROM "
    + _BATCHES_IF_UNCHANGED
    + "), "
    + _KEPT_WITH_TXN
    + PENDING_OFFSETS_CTES
    + _APPENDED
    + ", "
    + TXN_RECORD_CTES
    + _APPENDED_ANSWER
    + ", (SELECT count(*) FROM recorded)"
)


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
    batches: Sequence[AppendBatch], planned_against: Sequence[ProducerStateEntry | None], transactional_ids: Sequence[str | None]
) -> Statement[dict[int, int]]:
    """Append each of ``batches`` (distinct partitions) whose partition still ends at the batch's
    base offset and position and whose producer's state there is still the one it was planned
    against; write nothing of the others, nor of a batch whose partition or transaction another
    database transaction holds (not waited for). A batch of no transactional id (None in
    ``transactional_ids``) needs a producer id that still has none; a transactional batch, its
    transactional id's transaction still Ongoing, of its producer id and epoch, with the batch's
    partition in it already. Takes the locks itself (a transaction's row, shared, before
    partitions): on a connection in autocommit the statement is the whole database transaction,
    one round trip, and no lock is held between round trips. Reads, for each batch appended (by
    its index in ``batches``), its partition's log start offset."""
    params = _log_append_if_unchanged_params(batches, planned_against, transactional_ids)
    return Statement(_LOG_APPEND_IF_UNCHANGED, params, _appended)


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
    hstart: list[int | None] | None = None
    hend: list[int | None] | None = None
    hk: list[str] | None = None
    hv: list[bytes | None] | None = None
    headers_json: list[str | None] | None = None
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
        "b_marker": int4_array([b.trailing_marker for b in batches]),
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


def txn_append_if_unchanged(
    batches: Sequence[AppendBatch],
    planned_against: Sequence[ProducerStateEntry | None],
    events: Sequence[TxnEvent],
    was: TxnMetadata,
    meta: TxnMetadata,
    coordinator: int,
    deadline_ms: int | None,
    resets_members: bool,
    ends: str | None = None,
) -> Statement[list[int] | None]:
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
    On a connection in autocommit it is the whole database transaction, one round trip. Reads
    each batch's partition's log start offset if written, None if not. No limit is checked: the
    caller checked them against ``was``, which is exact at its version."""
    n = len(batches)
    params = _log_append_params(batches, planned_against)
    params.update(txn_record_params(events, meta, coordinator, deadline_ms))
    params.update(
        n=Int8(n),
        b_tid=text_array([was.transactional_id] * n),
        was_version=Int8(was.version),
        was_state=was.state.value,
        was_pid=Int8(was.producer_id),
        was_epoch=Int8(was.producer_epoch),
        resets=resets_members,
        end_offsets=ends is not None and bool(was.groups),
        commit_offsets=ends == "commit",
    )
    return Statement(_TXN_APPEND_IF_UNCHANGED, params, lambda row: _txn_appended(row, n))


def _txn_appended(row: Any, batches: int) -> list[int] | None:
    kept, log_starts, _, recorded = row
    assert recorded in (0, 1) and (not recorded or len(kept or ()) == batches), (kept, recorded)
    return list(log_starts or ()) if recorded else None
