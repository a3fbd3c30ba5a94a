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
from typing import Sequence

from app.domain.log import PartitionLogSize, RetainedPartition
from app.domain.retention import log_start_for_retention
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import log as log_store
from app.storage import retention as retention_store

log = logging.getLogger("txlog.retention")

TRIM_BATCH = 1000  # offsets one delete takes at most
TIME_SCAN_WINDOW = 10_000  # offsets one read for retention.ms looks at


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
        raise TxlogError(
            ErrorCode.OFFSET_OUT_OF_RANGE, f"before_offset {before_offset} is negative (-1 means the last stable offset)"
        )
    with broker.db.transaction() as conn:
        status = retention_store.partition_lock(conn, topic, partition)
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
            retention_store.log_start_advance(conn, topic, partition, target)
        return DeleteRecordsResult(topic, partition, max(target, status.log_start_offset))


def log_sizes(broker: Broker, topics: Sequence[str] | None = None) -> list[PartitionLogSize]:
    """The size in bytes of each partition's log (of ``topics`` only, when given), as
    retention.bytes measures it: from the log start to the high watermark. Read from the
    partition's next position and the position of its log start's record, not by summing records:
    the same cost for any log's length. Kafka's DescribeLogDirs and the admin pages answer it."""
    with broker.db.read() as conn:
        return retention_store.partition_log_sizes(conn, topics)


@dataclass
class RetentionReport:
    log_start_moved: int = 0  # partitions whose log start moved
    records_deleted: int = 0
    failed: int = 0  # partitions left for the next round after an error


def enforce_limits(broker: Broker, report: RetentionReport, deadline: float) -> None:
    """Move the log start of every partition past what its retention.ms / retention.bytes no longer
    keeps (never past the last stable offset). One partition that fails is logged and left for the
    next round."""
    now = broker.now()
    with broker.db.read() as conn:
        partitions = retention_store.partitions_with_retention(
            conn, broker.settings.log_retention_ms, broker.settings.log_retention_bytes
        )
    for p in partitions:
        if time.monotonic() >= deadline:
            return
        try:
            _enforce(broker, p, now, deadline, report)
        except Exception as exc:  # one partition (a lock wait, say) does not end the round
            report.failed += 1
            log.warning("retention of %s-%d failed: %s", p.topic, p.partition, exc)


def _enforce(broker: Broker, p: RetainedPartition, now: int, deadline: float, report: RetentionReport) -> None:
    by_time = by_size = None
    with broker.db.read() as conn:
        cutoff = None if p.retention_ms is None else now - p.retention_ms
        if cutoff is not None and cutoff > 0:  # no record is older than 1970
            # Past every record older than the cutoff, from the log start up to the first young one
            # (a record is kept while any before it is young, as Kafka keeps a segment while its
            # newest record is). Read a window at a time; a window that is all old is passed.
            by_time = p.log_start_offset
            while by_time < p.last_stable_offset and time.monotonic() < deadline:
                end = min(by_time + TIME_SCAN_WINDOW, p.last_stable_offset)
                found = log_store.partition_offset_at_time(conn, p.topic, p.partition, by_time, end, cutoff)
                by_time = found
                if found < end:
                    break
        if p.retention_bytes is not None and p.size_bytes > p.retention_bytes:
            # the first offset from which the log holds at most retention.bytes
            keep_from = p.next_position - p.retention_bytes
            by_size = log_store.partition_offset_at_position(conn, p.topic, p.partition, keep_from)
    wanted = log_start_for_retention(p.log_start_offset, p.last_stable_offset, by_time, by_size)
    if wanted is None:
        return
    with broker.db.transaction() as conn:
        status = retention_store.partition_lock(conn, p.topic, p.partition)
        target = min(wanted, status.last_stable_offset)
        if target > status.log_start_offset:
            retention_store.log_start_advance(conn, p.topic, p.partition, target)
            report.log_start_moved += 1
            log.info("log start of %s-%d moved to %d (retention)", p.topic, p.partition, target)


def trim(broker: Broker, report: RetentionReport, deadline: float, deleted_topic: str | None = None) -> None:
    """Delete records below each log start, and the records of deleted topics, a batch per database
    transaction, until none is left or the time is up (with ``deleted_topic``: only that deleted
    topic's). A partition another process is trimming (or one that failed) is left alone for the
    rest of this round; with ``deleted_topic``, one another process is trimming is waited for."""
    passed: set[tuple[str, int, bool]] = set()
    while time.monotonic() < deadline:
        with broker.db.read() as conn:
            todo = [(t, p, True) for t, p in retention_store.deleted_partitions_to_trim(conn, deleted_topic)]
            if deleted_topic is None:
                todo += [(t, p, False) for t, p in retention_store.partitions_to_trim(conn)]
        todo = [item for item in todo if item not in passed]
        if not todo:
            return
        for item in todo:
            topic, partition, deleted = item
            if time.monotonic() >= deadline:
                return
            trim_batch = retention_store.deleted_log_trim if deleted else retention_store.log_trim
            try:
                with broker.db.transaction() as conn:
                    count = trim_batch(conn, topic, partition, TRIM_BATCH)
            except Exception as exc:
                passed.add(item)
                report.failed += 1
                log.warning("trimming %s-%d%s failed: %s", topic, partition, " (deleted)" if deleted else "", exc)
                continue
            if count is None:
                if deleted_topic is None:
                    passed.add(item)
                else:  # a DeleteTopics request waits for the sweeper's batch, to answer with its records gone
                    time.sleep(0.05)
            else:
                report.records_deleted += count


def apply(broker: Broker, budget_s: float) -> RetentionReport:
    """One round of retention: move log starts, then delete below them, within ``budget_s``."""
    report = RetentionReport()
    deadline = time.monotonic() + budget_s
    enforce_limits(broker, report, deadline)
    trim(broker, report, deadline)
    return report
