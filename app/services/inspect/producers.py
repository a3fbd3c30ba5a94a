"""The producers page: Kafka's producer state of each producer id on each partition, with when it
expires.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.producer_state import BatchMetadata
from app.services import Broker
from app.storage import admin_reads


@dataclass(frozen=True)
class ProducerEntry:
    """Kafka's ProducerStateEntry of one producer id on one partition, as stored."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    transactional_id: str | None
    last_sequence: int | None
    last_offset: int | None
    batches: int
    last_timestamp_ms: int
    txn_first_offset: int | None
    expires_at_ms: int | None  # None while a transaction is open: open state never expires


@dataclass(frozen=True)
class ProducerPage:
    entries: list[ProducerEntry]
    next_after: tuple[str, int, int] | None


def _producer_entry(row: dict, expiration_ms: int) -> ProducerEntry:
    batches = [BatchMetadata.from_json(b) for b in row["batches"]]
    last = batches[-1] if batches else None
    return ProducerEntry(
        topic=row["topic"],
        partition=row["partition"],
        producer_id=row["producer_id"],
        producer_epoch=row["producer_epoch"],
        transactional_id=row["transactional_id"],
        last_sequence=last.last_seq if last else None,
        last_offset=last.last_offset if last else None,
        batches=len(batches),
        last_timestamp_ms=row["last_timestamp_ms"],
        txn_first_offset=row["txn_first_offset"],
        expires_at_ms=row["last_timestamp_ms"] + expiration_ms if row["txn_first_offset"] is None else None,
    )


def producers_page(
    broker: Broker,
    after: tuple[str, int, int] | None = None,
    limit: int = 100,
    topic: str | None = None,
    open_only: bool = False,
    producer_id: int | None = None,
) -> ProducerPage:
    expiration = broker.settings.producer_id_expiration_ms
    with broker.db.read() as conn:
        if producer_id is not None:
            rows = [
                r
                for r in admin_reads.producer_states_by_id(conn, producer_id)
                if (topic is None or r["topic"] == topic) and (not open_only or r["txn_first_offset"] is not None)
            ]
            return ProducerPage([_producer_entry(r, expiration) for r in rows], None)
        rows = admin_reads.producer_states_page(conn, after, limit + 1, topic, open_only)
    more = len(rows) > limit
    entries = [_producer_entry(r, expiration) for r in rows[:limit]]
    last = entries[-1] if more and entries else None
    return ProducerPage(entries, (last.topic, last.partition, last.producer_id) if last else None)
