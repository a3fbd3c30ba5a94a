"""Retention, as Kafka's ``retention.ms``, ``retention.bytes`` and DeleteRecords.

The log start offset moves forward — by a DeleteRecords request, or by the sweeper when records
are older than ``retention.ms`` or the partition holds more than ``retention.bytes`` — and never
past the last stable offset, so no open transaction loses records and no reader of committed data
misses a decided one. A fetch below the log start is ``OFFSET_OUT_OF_RANGE``; the views, the Spark
reader and the admin pages start there too. The records below it (and the aborted ranges that
end below it) are then deleted by the sweeper in batches, each its own database transaction.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from app.domain.retention import log_start_for_retention
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import queries as q

log = logging.getLogger("txlog.retention")

TRIM_BATCH = 1000  # records one delete takes at most


@dataclass(frozen=True)
class DeleteRecordsResult:
    topic: str
    partition: int
    log_start_offset: int  # Kafka's low watermark


def delete_records(broker: Broker, topic: str, partition: int, before_offset: int) -> DeleteRecordsResult:
    """Kafka's DeleteRecords: the log start moves to ``before_offset`` (-1: the last stable offset).
    Records below it are gone for every reader at once; the space is freed by the sweeper. An
    offset past the last stable offset is ``OFFSET_OUT_OF_RANGE``; one below the log start changes
    nothing."""
    if before_offset < -1:
        raise TxlogError(ErrorCode.OFFSET_OUT_OF_RANGE, f"before_offset {before_offset} is negative (-1 means the last stable offset)")
    with broker.db.transaction() as conn:
        status = q.partition_lock(conn, topic, partition)
        target = status.last_stable_offset if before_offset == -1 else before_offset
        if target > status.last_stable_offset:
            raise TxlogError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"Cannot delete records of {topic}-{partition} before {target}: past the last stable offset "
                f"{status.last_stable_offset} (high watermark {status.high_watermark})",
                log_start_offset=status.log_start_offset,
                last_stable_offset=status.last_stable_offset,
                high_watermark=status.high_watermark,
            )
        if target > status.log_start_offset:
            q.log_start_advance(conn, topic, partition, target)
        return DeleteRecordsResult(topic, partition, max(target, status.log_start_offset))


@dataclass
class RetentionReport:
    log_start_moved: int = 0  # partitions whose log start moved
    records_deleted: int = 0


def enforce_limits(broker: Broker, report: RetentionReport) -> None:
    """Move the log start of every partition past what its retention.ms / retention.bytes no longer
    keeps (never past the last stable offset)."""
    now = broker.now()
    with broker.db.read() as conn:
        partitions = q.partitions_with_retention(conn, broker.settings.log_retention_ms, broker.settings.log_retention_bytes)
        by_time: dict[tuple[str, int], int] = {}
        for p in partitions:
            if p.retention_ms is not None:
                found = q.partition_offsets_at(conn, [now - p.retention_ms], p.topic, p.partition)
                by_time[(p.topic, p.partition)] = found[(p.topic, p.partition)][0]
        by_size: dict[tuple[str, int], int] = {}
        for p in partitions:
            if p.retention_bytes is not None and p.size_bytes > p.retention_bytes:
                # the first offset from which the log holds at most retention.bytes
                keep_from = p.next_position - p.retention_bytes
                by_size[(p.topic, p.partition)] = q.partition_offset_at_position(conn, p.topic, p.partition, keep_from)
    for p in partitions:
        key = (p.topic, p.partition)
        wanted = log_start_for_retention(p.log_start_offset, p.last_stable_offset, by_time.get(key), by_size.get(key))
        if wanted is None:
            continue
        with broker.db.transaction() as conn:
            status = q.partition_lock(conn, p.topic, p.partition)
            target = min(wanted, status.last_stable_offset)
            if target > status.log_start_offset:
                q.log_start_advance(conn, p.topic, p.partition, target)
                report.log_start_moved += 1
                log.info("log start of %s-%d moved to %d (retention)", p.topic, p.partition, target)


def trim(broker: Broker, report: RetentionReport, budget_s: float) -> None:
    """Delete records below each log start, a batch per database transaction, until none is left
    or the budget is spent."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        with broker.db.read() as conn:
            todo = q.partitions_to_trim(conn)
        if not todo:
            return
        for topic, partition, stored_start, log_start in todo:
            if time.monotonic() >= deadline:
                return
            end = min(log_start, stored_start + TRIM_BATCH)
            with broker.db.transaction() as conn:
                report.records_deleted += q.log_trim(conn, topic, partition, stored_start, end)


def apply(broker: Broker, budget_s: float) -> RetentionReport:
    report = RetentionReport()
    enforce_limits(broker, report)
    trim(broker, report, budget_s)
    return report
