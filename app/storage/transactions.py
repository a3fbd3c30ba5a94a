"""Transactions as the coordinator keeps them: a transactional id's current state (its row, its
partitions and groups), the history of its transitions (events), recorded in one statement; the
limits on partitions and open transactions; and the sweeper's reads (claims, overdue ones)."""

from __future__ import annotations

import json
from typing import Any, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.transactions import TopicPartition, TxnEvent, TxnMetadata, TxnState
from app.storage._sql import ONGOING_SQL, OPEN_STATES_SQL, PREPARED_STATES_SQL, _compact, _int8, _ms
from app.storage.db import driver
from app.storage.statements import Statement

# The columns of a transactions row as ``txn_from_row`` reads them (alias ``t``): its state, then
# its partitions and groups, then what its last transaction left.
_TXN_STATE_COLUMNS = f"""
t.transactional_id, t.producer_id, t.producer_epoch, t.state, t.timeout_ms, t.version,
{_ms("t.updated_at")}, {_ms("t.epoch_changed_at")}, {_ms("t.started_at")}, """
_TXN_LAST_COLUMNS = """,
t.last_producer_id, t.last_producer_epoch, t.last_result, t.fence_reason, t.transaction_version
"""

# The transaction's partitions and groups, all of them (read from their own rows).
_TXN_MEMBERS = (
    "(SELECT jsonb_agg(jsonb_build_array(m.topic, m.partition) ORDER BY m.topic, m.partition) "
    "FROM txlog.transaction_partitions m WHERE m.transactional_id = t.transactional_id ), "
    "(SELECT jsonb_agg(g.group_id ORDER BY g.group_id) "
    "FROM txlog.transaction_groups g WHERE g.transactional_id = t.transactional_id )"
)

# Only those of them among the parameters ``m_topics``/``m_parts`` and ``m_groups`` (psycopg
# placeholders: ``txn_get`` runs on the driver).
_TXN_MEMBERS_ASKED = (
    "(SELECT jsonb_agg(jsonb_build_array(m.topic, m.partition) ORDER BY m.topic, m.partition) "
    "FROM txlog.transaction_partitions m WHERE m.transactional_id = t.transactional_id "
    "AND (m.topic, m.partition) IN "
    "(SELECT * FROM unnest(CAST(%(m_topics)s AS text[]), CAST(%(m_parts)s AS int[])))), "
    "(SELECT jsonb_agg(g.group_id ORDER BY g.group_id) "
    "FROM txlog.transaction_groups g WHERE g.transactional_id = t.transactional_id "
    "AND g.group_id = ANY(CAST(%(m_groups)s AS text[])))"
)

TXN_COLUMNS = _TXN_STATE_COLUMNS + _TXN_MEMBERS + _TXN_LAST_COLUMNS
TXN_COLUMNS_ASKED_MEMBERS = _TXN_STATE_COLUMNS + _TXN_MEMBERS_ASKED + _TXN_LAST_COLUMNS
TXN_COLUMNS_NO_MEMBERS = _TXN_STATE_COLUMNS + "NULL::jsonb, NULL::jsonb" + _TXN_LAST_COLUMNS


def txn_from_row(row) -> TxnMetadata:
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


TXN_READ = "SELECT " + TXN_COLUMNS + " FROM txlog.transactions t WHERE t.transactional_id = %(tid)s"


def txn_read(transactional_id: str) -> Statement[TxnMetadata | None]:
    """``txn_get`` without a lock, all members read, as a statement: what a transition planned
    ahead starts from when this process does not remember the transaction."""
    return Statement(TXN_READ, {"tid": transactional_id}, lambda row: txn_from_row(row) if row else None)


# The version as of the statement's snapshot: when the row lock was waited for while another
# transition committed, PostgreSQL re-reads the locked row but not the members, which are from
# before that transition. ``txn_get`` reads again when the two differ, now that the lock is held.
_LOCKED_VERSION = ", (SELECT s.version FROM txlog.transactions s WHERE s.transactional_id = t.transactional_id)"
TXN_READ_LOCKED = (
    "SELECT " + TXN_COLUMNS + _LOCKED_VERSION + " FROM txlog.transactions t WHERE t.transactional_id = %(tid)s FOR UPDATE OF t"
)
TXN_READ_LOCKED_ASKED = (
    "SELECT " + TXN_COLUMNS_ASKED_MEMBERS + _LOCKED_VERSION + " FROM txlog.transactions t "
    "WHERE t.transactional_id = %(tid)s FOR UPDATE OF t"
)


def txn_get(
    conn: Connection,
    transactional_id: str,
    for_update: bool = False,
    partitions: Sequence[TopicPartition] | None = None,
    groups: Sequence[str] | None = None,
) -> TxnMetadata | None:
    """A transactional id's state, with ``for_update`` under its row lock. Locked, its partitions
    and groups can be only those of them asked for (``partitions``/``groups``: what a produce or an
    offset commit needs to know, is this one already in the transaction?) — a read that does not
    grow with the transaction. Every transactional produce and EndTxn starts here: it runs on the
    driver, rows as plain tuples."""
    asked = partitions is not None or groups is not None
    if asked and not for_update:
        raise ValueError("only a locked read asks for some members")
    params: dict[str, object] = {"tid": transactional_id}
    if asked:
        params.update(
            m_topics=[t for t, _ in partitions or ()], m_parts=[p for _, p in partitions or ()], m_groups=list(groups or ())
        )
    statement = (TXN_READ_LOCKED_ASKED if asked else TXN_READ_LOCKED) if for_update else TXN_READ
    pg = driver(conn)
    row = pg.execute(statement, params).fetchone()
    if row is not None and for_update and row[-1] != row[5]:
        row = pg.execute(statement, params).fetchone()
        assert row is not None and row[-1] == row[5]
    return txn_from_row(row) if row else None


# The CTEs that record transitions (``txn_record``): the events, the partitions and groups they
# add, and the current-state row (``recorded``, which returns the new version), each written only
# if the statement's ``txn_gate`` holds: true alone (``txn_record``), or the condition that
# transitions planned ahead put on themselves and their batches (``append.txn_append_if_unchanged``).
# Psycopg placeholders: ``txn_record`` runs on the driver.
TXN_RECORD_CTES = f"""events AS (
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
        WHERE (SELECT go FROM txn_gate)
    ), members_added AS (
        INSERT INTO txlog.transaction_partitions (transactional_id, topic, partition)
        SELECT %(tid)s, u.topic, u.partition
        FROM unnest(CAST(%(added_topics)s AS text[]), CAST(%(added_parts)s AS int[])) AS u(topic, partition)
        WHERE (SELECT go FROM txn_gate)
        ON CONFLICT DO NOTHING
    ), groups_added AS (
        INSERT INTO txlog.transaction_groups (transactional_id, group_id)
        SELECT %(tid)s, u.group_id FROM unnest(CAST(%(added_groups)s AS text[])) AS u(group_id)
        WHERE (SELECT go FROM txn_gate)
        ON CONFLICT DO NOTHING
    ), recorded AS (
        INSERT INTO txlog.transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, version,
            started_at, updated_at, epoch_changed_at, deadline, last_producer_id,
            last_producer_epoch, last_result, fence_reason, coordinator, transaction_version, principal)
        SELECT %(tid)s, %(pid)s, %(epoch)s, %(state)s, %(timeout)s, %(version)s, to_timestamp(%(started)s / 1000.0),
            to_timestamp(%(updated)s / 1000.0), to_timestamp(%(epoch_changed)s / 1000.0),
            to_timestamp(%(deadline)s / 1000.0), %(last_pid)s, %(last_epoch)s, %(last_result)s, %(reason)s,
            %(coordinator)s, %(txn_version)s, CAST(%(principal)s AS text)
        WHERE (SELECT go FROM txn_gate)
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
                 AND o.state IN {OPEN_STATES_SQL} AND o.principal IS NOT NULL)
                < CAST(%(max_open)s AS int) END
        RETURNING version
    )"""

_TXN_RECORD = _compact("WITH txn_gate AS (SELECT true AS go), " + TXN_RECORD_CTES + " SELECT version FROM recorded")


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
    conn: Connection,
    events: Sequence[TxnEvent],
    meta: TxnMetadata,
    coordinator: int,
    deadline_ms: int | None,
    *,
    max_partitions: int | None = None,
    principal: str | None = None,
    starts: bool = False,
    max_open: int | None = None,
) -> bool:
    """Append consecutive transitions to the transactional id's events and store the state they
    lead to (``meta``, the fold of the events), in one statement: the events, the current-state row,
    and a row for each partition or group an event adds. A second writer of the same version fails
    on the events' primary key. ``starts``: the events start a transaction, which records
    ``principal`` as its starter. False, with the state row unchanged, when the transaction would
    have more than ``max_partitions`` partitions or its principal more than ``max_open`` open
    transactions; the caller must then fail the database transaction (the events and members were
    written)."""
    params = txn_record_params(
        events,
        meta,
        coordinator,
        deadline_ms,
        max_partitions=max_partitions,
        principal=principal,
        starts=starts,
        max_open=max_open,
    )
    return driver(conn).execute(_TXN_RECORD, params).fetchone() is not None


def txn_record_params(
    events: Sequence[TxnEvent],
    meta: TxnMetadata,
    coordinator: int,
    deadline_ms: int | None,
    *,
    max_partitions: int | None = None,
    principal: str | None = None,
    starts: bool = False,
    max_open: int | None = None,
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
            f"AND state IN {OPEN_STATES_SQL} AND principal IS NOT NULL)"
        ),
        {"tid": transactional_id, "p": principal},
    ).one()
    return int(row[0]), int(row[1])


_EVENT_COLUMNS = f"""
transactional_id, version, from_state, to_state, producer_id, producer_epoch, timeout_ms,
{_ms("at")}, partitions_added, groups_added, last_producer_id, last_producer_epoch, result, reason,
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


def like_prefix(prefix: str | None) -> str:
    return (prefix or "").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# What is overdue, in SQL (the domain's ``is_timed_out`` and ``is_stuck_prepared``, held equal by
# tests/integration/test_sweeper.py): kind: (the predicate, the order it is served in by its
# partial index — transactions_deadline, transactions_prepared).
OVERDUE = {
    # Ongoing past its deadline (started_at + timeout, stored while Ongoing) at ``:now``.
    "timed_out": (f"t.state = {ONGOING_SQL} AND t.deadline < to_timestamp(:now / 1000.0)", "t.deadline"),
    # Prepared and not completed since before ``:before``.
    "prepared": (f"t.state IN {PREPARED_STATES_SQL} AND t.updated_at < to_timestamp(:before / 1000.0)", "t.updated_at"),
}

# The sweeper's claims: the next due transaction that nobody holds, locked, in the caller's
# database transaction. Several sweepers on several hosts each take a different one.
_CLAIM = {  # kind: (what is due, in which order)
    **OVERDUE,
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
            f"SELECT {TXN_COLUMNS} FROM txlog.transactions t "
            f"WHERE {due} AND t.transactional_id <> ALL(CAST(:skip AS text[])) "
            f"ORDER BY {order} LIMIT 1 FOR UPDATE OF t SKIP LOCKED"
        ),
        {"now": now_ms, "before": before_ms, "states": list(states), "skip": list(skip)},
    ).first()
    return txn_from_row(row) if row else None


def txn_state_counts(conn: Connection) -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute(text("SELECT state, count(*) FROM txlog.transactions GROUP BY state"))}


def txns_overdue(conn: Connection, now_ms: int, prepared_before_ms: int, limit: int = 100) -> list[TxnMetadata]:
    """Ongoing transactions past their timeout (the sweeper's deadline index) and prepared ones
    not completed since ``prepared_before_ms`` (the prepared index)."""
    rows = conn.execute(
        text(
            " UNION ALL ".join(
                f"(SELECT {TXN_COLUMNS} FROM txlog.transactions t WHERE {due} ORDER BY {order} LIMIT :limit)"
                for due, order in (OVERDUE["timed_out"], OVERDUE["prepared"])
            )
        ),
        {"now": now_ms, "before": prepared_before_ms, "limit": limit},
    )
    return [txn_from_row(r) for r in rows]


_TXN_PAGE = text(
    f"""
    SELECT {TXN_COLUMNS} FROM txlog.transactions t
    WHERE (CAST(:states AS text[]) IS NULL OR t.state = ANY(CAST(:states AS text[])))
      AND (CAST(:pids AS bigint[]) IS NULL OR t.producer_id = ANY(CAST(:pids AS bigint[])))
      AND (CAST(:before AS bigint) IS NULL OR t.started_at < to_timestamp(CAST(:before AS bigint) / 1000.0))
      AND (CAST(:after AS text) IS NULL OR t.transactional_id > :after)
    ORDER BY t.transactional_id LIMIT :limit
    """
)


def txn_page(
    conn: Connection,
    states: Sequence[str] | None = None,
    producer_ids: Sequence[int] | None = None,
    started_before_ms: int | None = None,
    after: str | None = None,
    limit: int = 1000,
) -> list[TxnMetadata]:
    """Transactional ids in id order from after ``after`` (keyset paging on the primary key), with
    their members: those in ``states``, of ``producer_ids`` and whose transaction started before
    ``started_before_ms``, each filter when given."""
    rows = conn.execute(
        _TXN_PAGE, {"states": states, "pids": producer_ids, "before": started_before_ms, "after": after, "limit": limit}
    )
    return [txn_from_row(r) for r in rows]
