"""Fetch: read a partition from an offset, read_uncommitted (up to the high watermark) or
read_committed (up to the last stable offset, aborted transactions left out)."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.records import IsolationLevel, fetch_scan_end, next_offset_after_fetch, take_within_limits
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import queries as q
from app.storage.queries import StoredRecord


@dataclass(frozen=True)
class FetchResult:
    topic: str
    partition: int
    records: list[StoredRecord]
    next_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


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
        status = q.partition_status(conn, topic, partition)
        if offset < status.log_start_offset or offset > status.high_watermark:
            raise TxlogError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"Offset {offset} is out of range for {topic}-{partition}: "
                f"[{status.log_start_offset}, {status.high_watermark}]",
                log_start_offset=status.log_start_offset,
                high_watermark=status.high_watermark,
            )
        upper = status.last_stable_offset if committed else status.high_watermark
        # The work of one fetch is bounded by the request, however long the aborted ranges or runs
        # of markers it meets: it reads at most a window of offsets past ``offset``.
        scan_end = fetch_scan_end(offset, upper, max_records)
        rows = q.records_fetch(conn, topic, partition, offset, scan_end, max_records + 1, committed) if offset < scan_end else []
    count, truncated = take_within_limits((r.size for r in rows), max_records, max_bytes)
    rows = rows[:count]
    next_offset = next_offset_after_fetch(rows[-1].offset if rows else None, scan_end, truncated, offset)
    return FetchResult(
        topic, partition, rows, next_offset, status.high_watermark, status.last_stable_offset, status.log_start_offset
    )


def listen(broker: Broker, topic: str, partition: int, lease_ms: int) -> bool:
    """Ask appends to ``topic``-``partition`` to notify long-polling fetches for ``lease_ms``
    (see ``queries.fetch_listener_register``); False if there is no such partition."""
    with broker.db.transaction() as conn:
        return q.fetch_listener_register(conn, topic, partition, lease_ms)
