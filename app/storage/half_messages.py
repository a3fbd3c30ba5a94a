"""The SQL of half messages, producer groups and check-backs, one function per statement, named
noun-first (``half_message_insert``, ``half_message_lock``, ``half_check_start``). Services call
these inside the transaction scopes they open."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.half_messages import CheckChannel, DecidedBy, HalfMessage, HalfState, ProducerGroup
from app.domain.records import Encoding, Headers, NewRecord


def _ms(col: str) -> str:
    return f"(extract(epoch FROM {col}) * 1000)::bigint"


def _ts(param: str) -> str:
    return f"to_timestamp(CAST(:{param} AS bigint) / 1000.0)"


# --- producer groups ------------------------------------------------------------------------------

_GROUP_COLUMNS = f"producer_group, check_url, check_interval_ms, check_immunity_ms, max_checks, {_ms('updated_at')}"


def _group(row: Any) -> ProducerGroup:
    return ProducerGroup(row[0], row[1], row[2], row[3], row[4], row[5])


def producer_group_get(conn: Connection, producer_group: str) -> ProducerGroup | None:
    row = conn.execute(
        text(f"SELECT {_GROUP_COLUMNS} FROM txlog.producer_groups WHERE producer_group = :g"), {"g": producer_group}
    ).first()
    return _group(row) if row else None


def producer_group_put(conn: Connection, group: ProducerGroup, now_ms: int) -> ProducerGroup:
    row = conn.execute(
        text(
            f"""
            INSERT INTO txlog.producer_groups (producer_group, check_url, check_interval_ms, check_immunity_ms, max_checks, updated_at)
            VALUES (:g, :url, :interval, :immunity, :max_checks, {_ts("now")})
            ON CONFLICT (producer_group) DO UPDATE
            SET check_url = EXCLUDED.check_url, check_interval_ms = EXCLUDED.check_interval_ms,
                check_immunity_ms = EXCLUDED.check_immunity_ms, max_checks = EXCLUDED.max_checks,
                updated_at = EXCLUDED.updated_at
            RETURNING {_GROUP_COLUMNS}
            """
        ),
        {
            "g": group.producer_group,
            "url": group.check_url,
            "interval": group.check_interval_ms,
            "immunity": group.check_immunity_ms,
            "max_checks": group.max_checks,
            "now": now_ms,
        },
    ).one()
    return _group(row)


def producer_group_list(conn: Connection, limit: int = 1000) -> list[ProducerGroup]:
    rows = conn.execute(
        text(f"SELECT {_GROUP_COLUMNS} FROM txlog.producer_groups ORDER BY producer_group LIMIT :n"), {"n": limit}
    )
    return [_group(r) for r in rows]


# --- half messages --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredHalfMessage:
    """A half message with the record it holds, as its producer sent it (``encoding``: how the
    producer sent key and value, and how its check-backs show them)."""

    msg: HalfMessage
    record: NewRecord
    encoding: Encoding  # as it was accepted: utf8 or base64


_HALF_COLUMNS = f"""
    h.transaction_id, h.producer_group, h.topic, h.partition, h.state, h.check_count, {_ms("h.created_at")},
    {_ms("h.next_check_at")}, {_ms("h.decided_at")}, h.decided_by, h.reason, h."offset",
    h.key, h.value, h.header_keys, h.header_values, h.encoding, h.check_channel
"""


def _half(row: Any) -> StoredHalfMessage:
    msg = HalfMessage(
        row[0],
        row[1],
        row[2],
        row[3],
        HalfState(row[4]),
        row[5],
        row[6],
        row[7],
        row[8],
        DecidedBy(row[9]) if row[9] else None,
        row[10],
        row[11],
        CheckChannel(row[17]),
    )
    headers: Headers = tuple(zip(row[14], row[15])) if row[14] else ()
    return StoredHalfMessage(msg, NewRecord(row[12], row[13], headers, row[6]), row[16])


def half_message_insert(conn: Connection, stored: StoredHalfMessage) -> bool:
    """Store a new half message (False: its transaction id is taken)."""
    m, r = stored.msg, stored.record
    row = conn.execute(
        text(
            f"""
            INSERT INTO txlog.half_messages (transaction_id, producer_group, topic, partition, key, value, header_keys,
                                             header_values, encoding, created_at, state, check_count, next_check_at,
                                             check_channel)
            VALUES (:tid, :g, :topic, :partition, :key, :value, :hk, :hv, :encoding, {_ts("created")}, :state, 0, {_ts("next_check")},
                    :channel)
            ON CONFLICT (transaction_id) DO NOTHING
            RETURNING 1
            """
        ),
        {
            "tid": m.transaction_id,
            "g": m.producer_group,
            "topic": m.topic,
            "partition": m.partition,
            "key": r.key,
            "value": r.value,
            "hk": [k for k, _ in r.headers] or None,
            "hv": [v for _, v in r.headers] or None,
            "encoding": stored.encoding,
            "created": m.created_at_ms,
            "state": m.state.value,
            "next_check": m.next_check_at_ms,
            "channel": m.check_channel.value,
        },
    ).first()
    return row is not None


_HALF_GET = text("SELECT " + _HALF_COLUMNS + " FROM txlog.half_messages h WHERE h.transaction_id = :tid")
_HALF_GET_LOCKED = text("SELECT " + _HALF_COLUMNS + " FROM txlog.half_messages h WHERE h.transaction_id = :tid FOR UPDATE")


def half_message_get(conn: Connection, transaction_id: str, for_update: bool = False) -> StoredHalfMessage | None:
    """One half message; with ``for_update`` its row lock, which every decision takes (waiting for
    a racing one, then reading what it decided)."""
    row = conn.execute(_HALF_GET_LOCKED if for_update else _HALF_GET, {"tid": transaction_id}).first()
    return _half(row) if row else None


def half_message_decide(conn: Connection, msg: HalfMessage) -> None:
    """Record a decision taken (``msg`` as the domain's ``Decided.applied`` made it)."""
    conn.execute(
        text(
            f"""
            UPDATE txlog.half_messages
            SET state = :state, next_check_at = NULL, decided_at = {_ts("at")}, decided_by = :by, reason = :reason, "offset" = :offset
            WHERE transaction_id = :tid
            """
        ),
        {
            "tid": msg.transaction_id,
            "state": msg.state.value,
            "at": msg.decided_at_ms,
            "by": msg.decided_by.value if msg.decided_by else None,
            "reason": msg.reason,
            "offset": msg.offset,
        },
    )


def half_messages_due(
    conn: Connection, now_ms: int, limit: int, channel: CheckChannel = CheckChannel.HTTP, producer_groups: list[str] | None = None
) -> list[tuple[StoredHalfMessage, ProducerGroup | None]]:
    """Claim up to ``limit`` undecided half messages of one check channel whose next check is due
    (of the producer groups named, when ``producer_groups`` is given), oldest due first, skipping
    those another checker holds right now; each with its producer group's settings."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_HALF_COLUMNS}, g.producer_group, g.check_url, g.check_interval_ms, g.check_immunity_ms, g.max_checks,
                   {_ms("g.updated_at")}
            FROM txlog.half_messages h
            LEFT JOIN txlog.producer_groups g ON g.producer_group = h.producer_group
            WHERE h.state = 'Prepared' AND h.check_channel = :channel AND h.next_check_at <= {_ts("now")}
              AND (CAST(:groups AS text[]) IS NULL OR h.producer_group = ANY(CAST(:groups AS text[])))
            ORDER BY h.next_check_at
            LIMIT :n
            FOR UPDATE OF h SKIP LOCKED
            """
        ),
        {"now": now_ms, "n": limit, "channel": channel.value, "groups": producer_groups},
    )
    return [(_half(r), _group(r[18:]) if r[18] is not None else None) for r in rows]


def half_check_start(
    conn: Connection, transaction_id: str, check_no: int, lease_until_ms: int, now_ms: int, check_url: str | None
) -> None:
    """Count a check-back and record that it started; no other checker asks before ``lease_until_ms``."""
    params = {"tid": transaction_id, "n": check_no, "lease": lease_until_ms, "now": now_ms, "url": check_url}
    conn.execute(
        text(f"UPDATE txlog.half_messages SET check_count = :n, next_check_at = {_ts('lease')} WHERE transaction_id = :tid"),
        params,
    )
    conn.execute(
        text(
            f"""
            INSERT INTO txlog.half_message_checks (transaction_id, check_no, started_at, check_url)
            VALUES (:tid, :n, {_ts("now")}, :url)
            ON CONFLICT (transaction_id, check_no) DO NOTHING
            """
        ),
        params,
    )


def half_check_release(conn: Connection, transaction_id: str, check_no: int, retry_at_ms: int) -> bool:
    """Take back check ``check_no`` claimed but never sent (no live producer to send it to): not
    counted, its record gone, the half message due again at ``retry_at_ms``. False when the half
    message moved on meanwhile (decided, or another check counted)."""
    params = {"tid": transaction_id, "n": check_no, "retry": retry_at_ms}
    moved = conn.execute(
        text(
            f"""
            UPDATE txlog.half_messages SET check_count = :n - 1, next_check_at = {_ts("retry")}
            WHERE transaction_id = :tid AND check_count = :n AND state = 'Prepared'
            """
        ),
        params,
    ).rowcount
    if moved:
        conn.execute(
            text("DELETE FROM txlog.half_message_checks WHERE transaction_id = :tid AND check_no = :n AND finished_at IS NULL"),
            params,
        )
    return bool(moved)


def half_check_finish(
    conn: Connection, transaction_id: str, check_no: int, now_ms: int, answer: str | None, error: str | None, outcome: str
) -> None:
    conn.execute(
        text(
            f"""
            UPDATE txlog.half_message_checks
            SET finished_at = {_ts("now")}, answer = :answer, error = :error, outcome = :outcome
            WHERE transaction_id = :tid AND check_no = :n
            """
        ),
        {"tid": transaction_id, "n": check_no, "now": now_ms, "answer": answer, "error": error, "outcome": outcome},
    )


@dataclass(frozen=True)
class CheckRecord:
    check_no: int
    started_at_ms: int
    finished_at_ms: int | None
    check_url: str | None
    answer: str | None
    error: str | None
    outcome: str | None


def half_checks(conn: Connection, transaction_id: str) -> list[CheckRecord]:
    rows = conn.execute(
        text(
            f"""
            SELECT check_no, {_ms("started_at")}, {_ms("finished_at")}, check_url, answer, error, outcome
            FROM txlog.half_message_checks WHERE transaction_id = :tid ORDER BY check_no
            """
        ),
        {"tid": transaction_id},
    )
    return [CheckRecord(*r) for r in rows]


def half_messages_page(
    conn: Connection, state: str | None, producer_group: str | None, after: str | None, limit: int
) -> list[StoredHalfMessage]:
    """Half messages by transaction id (after ``after``), optionally of one state and group."""
    rows = conn.execute(
        text(
            f"""
            SELECT {_HALF_COLUMNS} FROM txlog.half_messages h
            WHERE (CAST(:state AS text) IS NULL OR h.state = :state)
              AND (CAST(:g AS text) IS NULL OR h.producer_group = :g)
              AND (CAST(:after AS text) IS NULL OR h.transaction_id > :after)
            ORDER BY h.transaction_id
            LIMIT :n
            """
        ),
        {"state": state, "g": producer_group, "after": after, "n": limit},
    )
    return [_half(r) for r in rows]


def half_message_counts(conn: Connection) -> dict[str, int]:
    rows = conn.execute(text("SELECT state, count(*) FROM txlog.half_messages GROUP BY state"))
    return {r[0]: r[1] for r in rows}


def half_messages_forget(conn: Connection, decided_before_ms: int, limit: int) -> int:
    """Delete up to ``limit`` half messages decided before the time given (their checks go with them)."""
    return conn.execute(
        text(
            f"""
            DELETE FROM txlog.half_messages WHERE transaction_id IN (
                SELECT transaction_id FROM txlog.half_messages
                WHERE state <> 'Prepared' AND decided_at < {_ts("before")}
                ORDER BY decided_at LIMIT :n
            )
            """
        ),
        {"before": decided_before_ms, "n": limit},
    ).rowcount


def half_checks_of(conn: Connection, transaction_ids: list[str]) -> dict[str, list[CheckRecord]]:
    """The check histories of several half messages at once."""
    rows = conn.execute(
        text(
            f"""
            SELECT transaction_id, check_no, {_ms("started_at")}, {_ms("finished_at")}, check_url, answer, error, outcome
            FROM txlog.half_message_checks WHERE transaction_id = ANY(:tids) ORDER BY transaction_id, check_no
            """
        ),
        {"tids": transaction_ids},
    )
    out: dict[str, list[CheckRecord]] = {tid: [] for tid in transaction_ids}
    for r in rows:
        out[r[0]].append(CheckRecord(*r[1:]))
    return out
