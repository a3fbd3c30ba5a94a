"""Producer ids (given out, owned by transactional ids, retired, forgotten) and the producers'
state on partitions as it expires."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.producer_state import BatchMetadata, ProducerStateEntry
from app.storage._sql import _int8, _ms


def producer_id_next(conn: Connection) -> int:
    return conn.execute(text("SELECT nextval('txlog.producer_id_seq')")).scalar_one()


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


def partition_producers(conn: Connection, topic: str, partition: int) -> list[ProducerStateEntry]:
    """What a partition remembers of each producer id, by producer id (its primary key's prefix)."""
    rows = conn.execute(
        text(
            f"SELECT producer_id, producer_epoch, batches, txn_first_offset, {_ms('last_timestamp')} "
            "FROM txlog.producer_partitions WHERE topic = :topic AND partition = :partition ORDER BY producer_id"
        ),
        {"topic": topic, "partition": partition},
    )
    return [
        ProducerStateEntry(pid, epoch, tuple(BatchMetadata.from_json(b) for b in batches), txn_first, last_ms)
        for pid, epoch, batches, txn_first, last_ms in rows
    ]
