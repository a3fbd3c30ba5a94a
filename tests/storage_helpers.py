"""Reads of the store that only tests make: a partition's whole log as stored, and one producer's
state on a partition."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.log import StoredRecord
from app.domain.producer_state import BatchMetadata, ProducerStateEntry
from app.storage._sql import _ms
from app.storage.log import RECORD_COLUMNS, _stored


def records_browse(conn: Connection, topic: str, partition: int, start: int, limit: int) -> list[StoredRecord]:
    """Every record from ``start`` (control records too), each flagged if its transaction aborted."""
    sql = f"""
        SELECT {RECORD_COLUMNS}, r.aborted
        FROM txlog.log_records r
        WHERE r.topic = :topic AND r.partition = :partition AND r."offset" >= :start
        ORDER BY r."offset"
        LIMIT :limit
    """
    rows = conn.execute(text(sql), {"topic": topic, "partition": partition, "start": start, "limit": limit}).all()
    return _stored(rows)


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
