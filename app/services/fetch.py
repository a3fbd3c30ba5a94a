"""Fetch: read a partition from an offset, read_uncommitted (up to the high watermark) or
read_committed (up to the last stable offset, aborted transactions left out) — as the HTTP API
reads it (``fetch``: data records only) and as Kafka's wire protocol does (``fetch_log``: the log
as it is stored, markers and aborted records included, with the aborted transactions a consumer
filters by) — and ListOffsets."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from sqlalchemy.engine import Connection

from app.domain.log import EpochEndOffset, PartitionStatus, StoredRecord, epoch_end_offset, unknown_partition
from app.domain.records import (
    MAX_TIMESTAMP,
    IsolationLevel,
    ListedOffset,
    check_list_offsets_timestamp,
    fetch_scan_end,
    listed_offset,
    next_offset_after_fetch,
    readable_end,
    take_within_limits,
)
from app.errors import DatabaseUnavailable, ErrorCode, TxlogError
from app.services import Broker
from app.storage import log as log_store
from app.storage.db import translate_errors


@dataclass(frozen=True)
class FetchResult:
    topic: str
    partition: int
    records: list[StoredRecord]
    next_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


def _check_offset(status: PartitionStatus, offset: int) -> None:
    if offset < status.log_start_offset or offset > status.high_watermark:
        raise TxlogError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"Offset {offset} is out of range for {status.topic}-{status.partition}: "
            f"[{status.log_start_offset}, {status.high_watermark}]",
            log_start_offset=status.log_start_offset,
            high_watermark=status.high_watermark,
        )


def fetch(
    broker: Broker,
    topic: str,
    partition: int,
    offset: int,
    max_records: int = 500,
    max_bytes: int = 1_048_576,
    isolation_level: IsolationLevel = "read_uncommitted",
) -> FetchResult:
    if max_records < 1 or max_bytes < 1:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "max_records and max_bytes must be positive")
    committed = isolation_level == "read_committed"
    with broker.db.read() as conn:  # one snapshot: status and records agree
        status = log_store.partition_status(conn, topic, partition)
        _check_offset(status, offset)
        upper = readable_end(status.high_watermark, status.last_stable_offset, isolation_level)
        # The work of one fetch is bounded by the request, however long the aborted ranges or runs
        # of markers it meets: it reads at most a window of offsets past ``offset``.
        scan_end = fetch_scan_end(offset, upper, max_records)
        rows = (
            log_store.records_fetch(conn, topic, partition, offset, scan_end, max_records + 1, committed)
            if offset < scan_end
            else []
        )
    # The property's getter mapped: no generator frame resumed per record (a 1000-record page).
    count, truncated = take_within_limits(map(StoredRecord.size.fget, rows), max_records, max_bytes)  # type: ignore[attr-defined]  # a property, typed as its value
    rows = rows[:count]
    next_offset = next_offset_after_fetch(rows[-1].offset if rows else None, scan_end, truncated, offset)
    return FetchResult(
        topic, partition, rows, next_offset, status.high_watermark, status.last_stable_offset, status.log_start_offset
    )


# Rows one ``fetch_log`` page holds at most, whatever its byte budget: markers and empty records
# count no bytes against it.
MAX_LOG_ROWS = 10_000


@dataclass(frozen=True)
class LogPage:
    """A page of a partition's log as Kafka's Fetch answers it."""

    topic: str
    partition: int
    records: list[StoredRecord]  # every row, control records and records of aborted transactions included
    # read_committed: the aborted transactions the records belong to, as (producer id, first offset
    # on the partition), in first-offset order — what a consumer skips their records by; None for
    # read_uncommitted (Kafka sends none then).
    aborted_transactions: list[tuple[int, int]] | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int

    @classmethod
    def of(cls, status: PartitionStatus, records: list[StoredRecord], isolation_level: IsolationLevel) -> LogPage:
        """The page of ``records`` read at ``status``: for read_committed, with the aborted
        transactions among them (each row's aborted flag), in first-offset order; for
        read_uncommitted, none."""
        aborted = None
        if isolation_level == "read_committed":
            aborted = sorted({(r.producer_id, r.txn_first_offset) for r in records if r.aborted}, key=lambda a: (a[1], a[0]))
        return cls(
            status.topic,
            status.partition,
            records,
            aborted,  # type: ignore[arg-type]  # aborted rows are transactional: producer id and first offset set
            status.high_watermark,
            status.last_stable_offset,
            status.log_start_offset,
        )


_T = TypeVar("_T")


class LogReader:
    """Kafka's Fetch of a request's partitions in one snapshot: one read-only transaction and one
    status statement for all of them, then a statement for each partition with records to read —
    rather than a transaction and two statements per partition, which made a Fetch of 1,000
    partitions (most with nothing new) a thousand transactions.

    A context manager whose enter and exit never raise: a database failure, on the way in or
    while reading, is the error of every page asked for after it (the transaction is lost), as each
    partition read alone would have met it. A partition's own errors (unknown, offset out of
    range) are its own."""

    def __init__(self, broker: Broker, partitions: Sequence[tuple[str, int]]) -> None:
        self._scope = broker.db.read()
        self._partitions = partitions
        self._conn: Connection | None = None
        self._statuses: dict[tuple[str, int], PartitionStatus] = {}
        self._failed: TxlogError | None = None

    def __enter__(self) -> LogReader:
        try:
            self._conn = self._scope.__enter__()
        except TxlogError as exc:
            self._failed = exc
            return self
        self._read(lambda conn: self._statuses.update(log_store.partition_statuses(conn, self._partitions)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._conn is not None:
            with contextlib.suppress(TxlogError):  # the pages were read; a lost COMMIT of a read changes none
                self._scope.__exit__(None, None, None)

    def page(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = 1_048_576,
        isolation_level: IsolationLevel = "read_uncommitted",
        max_records: int = MAX_LOG_ROWS,
    ) -> LogPage:
        """One partition's page: every stored row from ``offset`` below the reader's end (the
        last stable offset for read_committed, the high watermark for read_uncommitted) — data,
        transaction markers and records of aborted transactions alike, as a Kafka broker sends its
        log — within ``max_bytes`` of keys, values and headers (the log's positions) and
        ``max_records`` rows, the first row always, however large, so a consumer always moves on.
        For read_committed, the aborted transactions among the rows, read with them in the one
        statement that reads the page (each row's aborted flag: ``views.page_aborted_keys``).
        OFFSET_OUT_OF_RANGE below the log start or above the high watermark; at or past the
        reader's end, an empty page. ``max_bytes`` 0: no rows, the partition's status alone, read
        by no statement of its own (a Fetch's partitions once its byte budget is spent)."""
        if max_records < 1 or max_bytes < 0:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "max_records must be positive, max_bytes not negative")
        if self._failed is not None:
            raise self._failed
        status = self._statuses.get((topic, partition))
        if status is None:
            raise unknown_partition(topic, partition)
        _check_offset(status, offset)
        if max_bytes == 0:
            return LogPage.of(status, [], isolation_level)
        rows = self._read(lambda conn: log_rows(conn, status, offset, max_bytes, isolation_level, max_records))
        return LogPage.of(status, rows, isolation_level)

    def record_sizes(self, wanted: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int, int], int]:
        """What the record at each (topic, partition, offset) counts against a page's
        ``max_bytes`` (its keys, values and headers), for each that is stored, in the reader's
        snapshot: one statement for all of them, so that a Fetch whose byte budget is nearly spent
        need not read a page of each partition left to learn that its first record cannot fit."""
        if self._failed is not None:
            raise self._failed
        return self._read(lambda conn: log_store.record_sizes(conn, wanted))

    def _read(self, statement: Callable[[Connection], _T]) -> _T:
        """A statement on the snapshot; its failure is the database's, and ends the snapshot."""
        assert self._conn is not None
        try:
            with translate_errors():
                return statement(self._conn)
        except TxlogError as exc:
            self._failed = exc
            raise


def fetch_log(
    broker: Broker,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int = 1_048_576,
    isolation_level: IsolationLevel = "read_uncommitted",
    max_records: int = MAX_LOG_ROWS,
) -> LogPage:
    """Kafka's Fetch of one partition (``LogReader.page``), in a snapshot of its own."""
    with LogReader(broker, [(topic, partition)]) as reader:
        return reader.page(topic, partition, offset, max_bytes, isolation_level, max_records)


def fetch_log_on_replica(
    replica: Broker,
    primary: Broker,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int = 1_048_576,
    isolation_level: IsolationLevel = "read_uncommitted",
) -> LogPage:
    """``fetch_log`` on a hot standby (``replica``), a read replica's Fetch (KIP-392): the page,
    high watermark and last stable offset of the standby's own snapshot, which streaming
    replication never puts ahead of the primary's, and whose read_committed page holds no record
    the primary has not committed or has aborted by then. An offset past the standby's high
    watermark but not past the primary's (``primary``: one statement there) is an empty page at the
    standby's status: the standby has not replayed that far yet, and the consumer asks again, as
    a Kafka follower answers an offset it has not replicated yet. Past the primary's too, the
    standby's OFFSET_OUT_OF_RANGE. A read the standby cancelled for its replay (a conflict with
    recovery, SQLSTATE 40001: the only conflict a read-only transaction meets there) is the
    standby's storage unavailable for the moment, retriable, as the database away is."""
    try:
        return fetch_log(replica, topic, partition, offset, max_bytes, isolation_level)
    except TxlogError as exc:
        if exc.code is ErrorCode.CONCURRENT_TRANSACTIONS:
            raise DatabaseUnavailable(f"The standby cancelled the read for its replay: {exc.message}") from exc
        replayed = exc.details.get("high_watermark")
        if exc.code is not ErrorCode.OFFSET_OUT_OF_RANGE or not isinstance(replayed, int) or offset <= replayed:
            raise
        on_primary = partition_statuses(primary, [(topic, partition)]).get((topic, partition))
        if on_primary is None or offset > on_primary.high_watermark:
            raise
        status = partition_statuses(replica, [(topic, partition)]).get((topic, partition))
        if status is None:
            raise
    return LogPage.of(status, [], isolation_level)


def log_rows(
    conn: Connection, status: PartitionStatus, offset: int, max_bytes: int, isolation_level: IsolationLevel, max_records: int
) -> list[StoredRecord]:
    """The rows of a ``fetch_log`` page from ``offset`` (at or above the log start) on the caller's
    connection, for a caller that reads the log inside a database transaction of its own (a share
    fetch, under its share partition's lock): every stored row below the reader's end, at most
    ``max_records``, within ``max_bytes`` (the first row always); read_committed flags the rows of
    aborted transactions."""
    end = min(readable_end(status.high_watermark, status.last_stable_offset, isolation_level), offset + max_records)
    if offset >= end:
        return []
    rows = log_store.records_fetch_log(
        conn, status.topic, status.partition, offset, end, max_bytes, isolation_level == "read_committed"
    )
    if len(rows) > 1 and rows[-1].position + rows[-1].size - rows[0].position > max_bytes:
        rows.pop()  # the one row that starts inside the budget but does not end in it
    return rows


def partition_statuses(broker: Broker, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], PartitionStatus]:
    """Log start offset, high watermark and last stable offset of each of ``partitions`` that
    exists (one statement); the others are absent."""
    with broker.db.read() as conn:
        return log_store.partition_statuses(conn, partitions)


@dataclass(frozen=True)
class EpochEndOffsetResult:
    topic: str
    partition: int
    end: EpochEndOffset | None  # None: ``error``
    error: TxlogError | None = None  # UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH


def epoch_end_offsets(broker: Broker, requests: Sequence[tuple[str, int, int, int]]) -> list[EpochEndOffsetResult]:
    """Kafka's OffsetForLeaderEpoch: for each (topic, partition, current leader epoch, leader
    epoch), in order, where that epoch ends (``log.epoch_end_offset``): the log end offset for the
    leader's epoch. A consumer validating its position after a leader change compares it with
    this; the log end is the high watermark here (one replica). Errors are per partition. One
    statement."""
    statuses = partition_statuses(broker, [(t, p) for t, p, _, _ in requests])
    out: list[EpochEndOffsetResult] = []
    for topic, partition, current_epoch, epoch in requests:
        status = statuses.get((topic, partition))
        try:
            if status is None:
                raise unknown_partition(topic, partition)
            end = epoch_end_offset(epoch, current_epoch, status.log_start_offset, status.high_watermark)
        except TxlogError as exc:
            out.append(EpochEndOffsetResult(topic, partition, None, exc))
        else:
            out.append(EpochEndOffsetResult(topic, partition, end))
    return out


@dataclass(frozen=True)
class ListOffsetsResult:
    topic: str
    partition: int
    timestamp: int  # as asked
    offset: ListedOffset | None  # None: no such record (Kafka answers offset and timestamp -1)
    error: TxlogError | None = None  # UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST: this partition's


def list_offsets(
    broker: Broker, requests: Sequence[tuple[str, int, int]], isolation_level: IsolationLevel = "read_uncommitted"
) -> list[ListOffsetsResult]:
    """Kafka's ListOffsets: for each (topic, partition, timestamp), in order, the log start
    (EARLIEST_TIMESTAMP, -2, and EARLIEST_LOCAL_TIMESTAMP, -4), the reader's end (LATEST_TIMESTAMP,
    -1: the high watermark, or the last stable offset for read_committed), the first offset whose
    record's timestamp is at or after a timestamp >= 0 (``storage.log.partition_offsets_at``: a
    bisection over the offsets, exact while timestamps grow with offsets, as with log-append time),
    or the data record with the largest timestamp (MAX_TIMESTAMP, -3: reads the partition's whole
    log). A record found at or past the reader's end is no answer (``records.listed_offset``).
    Errors are per partition. One snapshot."""
    out: list[ListOffsetsResult] = []
    with broker.db.read() as conn:
        statuses = log_store.partition_statuses(conn, [(t, p) for t, p, _ in requests])
        for topic, partition, timestamp in requests:
            status = statuses.get((topic, partition))
            try:
                if status is None:
                    raise unknown_partition(topic, partition)
                check_list_offsets_timestamp(timestamp)
                found = _record_for_time(conn, status, timestamp) if timestamp >= 0 or timestamp == MAX_TIMESTAMP else None
                end = readable_end(status.high_watermark, status.last_stable_offset, isolation_level)
                out.append(
                    ListOffsetsResult(topic, partition, timestamp, listed_offset(timestamp, status.log_start_offset, end, found))
                )
            except TxlogError as exc:
                out.append(ListOffsetsResult(topic, partition, timestamp, None, exc))
    return out


def _record_for_time(conn, status: PartitionStatus, timestamp: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the record a ListOffsets by ``timestamp`` (or MAX_TIMESTAMP) finds."""
    topic, partition = status.topic, status.partition
    if timestamp == MAX_TIMESTAMP:
        return log_store.partition_max_timestamp(conn, topic, partition, status.log_start_offset, status.high_watermark)
    if timestamp > log_store.LAST_RECORD_TIME_MS:
        return None  # no record is that late
    offset = log_store.partition_offsets_at(conn, [timestamp], topic, partition)[(topic, partition)][0]
    if offset >= status.high_watermark:
        return None
    found_ms = log_store.record_timestamp(conn, topic, partition, offset)
    return (offset, found_ms) if found_ms is not None else None


def listen(broker: Broker, partitions: Sequence[tuple[str, int]], lease_ms: int) -> set[tuple[str, int]]:
    """Ask appends to each of ``partitions`` to notify long-polling fetches for ``lease_ms`` (see
    ``storage.log.fetch_listeners_register``); the partitions that exist, which got the lease."""
    with broker.db.transaction() as conn:
        return log_store.fetch_listeners_register(conn, partitions, lease_ms)
