"""The topics' pages: a topic's partitions with their offsets and rate, and a partition's log as a
reader at each isolation level sees it (``browse_partition``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.domain.log import LogRecord, LsoHolder, PartitionStatus
from app.errors import ErrorCode, TxlogError
from app.services import Broker, retention
from app.services.inspect.rates import RatePoint, _record_rate
from app.storage import admin_reads
from app.storage import log as log_store

BrowseMode = Literal["read_uncommitted", "read_committed", "all"]
BROWSE_MODES: tuple[BrowseMode, ...] = ("read_uncommitted", "read_committed", "all")


@dataclass(frozen=True)
class TopicSummary:
    name: str
    partitions: list[PartitionStatus]

    @property
    def records(self) -> int:
        return sum(p.high_watermark - p.log_start_offset for p in self.partitions)

    @property
    def unstable(self) -> int:
        """Records between the last stable offset and the high watermark, over all partitions."""
        return sum(p.high_watermark - p.last_stable_offset for p in self.partitions)

    @property
    def open_transactions(self) -> int:
        return sum(p.open_transactions for p in self.partitions)

    @property
    def max_high_watermark(self) -> int:
        return max((p.high_watermark for p in self.partitions), default=0)


def _topics(statuses: list[PartitionStatus]) -> list[TopicSummary]:
    by_topic: dict[str, list[PartitionStatus]] = {}
    for s in statuses:
        by_topic.setdefault(s.topic, []).append(s)
    return [TopicSummary(name, parts) for name, parts in by_topic.items()]


@dataclass(frozen=True)
class TopicDetail:
    now_ms: int
    topic: TopicSummary
    rate: list[RatePoint]
    holders: dict[int, LsoHolder]  # by partition
    sizes: dict[int, int] = field(default_factory=dict)  # bytes of each partition's log (``retention.log_sizes``)


def topic_detail(broker: Broker, topic: str) -> TopicDetail:
    now = broker.now()
    with broker.db.read() as conn:
        statuses = log_store.partition_status_all(conn, topic)
        if not statuses:
            raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {topic!r} does not exist")
        rate = _record_rate(conn, now, topic)
        holders = {h.partition: h for h in admin_reads.lso_holders(conn) if h.topic == topic}
    sizes = {s.partition: s.size_bytes for s in retention.log_sizes(broker, [topic])}
    return TopicDetail(now, TopicSummary(topic, statuses), rate, holders, sizes)


# --- the log --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordPage:
    status: PartitionStatus
    mode: BrowseMode
    records: list[LogRecord]
    upper: int  # the mode's end of the log: the last stable offset for read_committed, else the high watermark
    older: int | None  # ask with before=older for the previous page
    newer: int | None  # ask with offset=newer for the next page
    rate: list[RatePoint] = field(default_factory=list)


def browse_partition(
    broker: Broker,
    topic: str,
    partition: int,
    mode: BrowseMode = "all",
    offset: int | None = None,
    before: int | None = None,
    limit: int = 50,
) -> RecordPage:
    """A page of a partition's log as a reader at ``mode`` sees it (``all``: control records and
    aborted records too, each flagged). From ``offset`` forwards, or the page ending just before
    ``before``, or else the tail of the log. Offsets out of range are clamped."""
    if mode not in BROWSE_MODES:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown mode {mode!r}; one of {', '.join(BROWSE_MODES)}")
    if not 1 <= limit <= 1000:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "limit must be between 1 and 1000")
    now = broker.now()
    with broker.db.read() as conn:
        status = log_store.partition_status(conn, topic, partition)
        upper = status.last_stable_offset if mode == "read_committed" else status.high_watermark
        common = dict(include_control=mode == "all", include_aborted=mode != "read_committed")
        if offset is not None:
            start = min(max(offset, status.log_start_offset), upper)
            records = admin_reads.records_page(conn, topic, partition, start, upper, limit, **common)
        else:
            end = upper if before is None else min(max(before, status.log_start_offset), upper)
            records = admin_reads.records_page(
                conn, topic, partition, status.log_start_offset, end, limit, backwards=True, **common
            )
        rate = _record_rate(conn, now, topic, partition)
    first = records[0].offset if records else None
    last = records[-1].offset if records else None
    older = first if first is not None and first > status.log_start_offset else None
    newer = last + 1 if last is not None and last + 1 < upper else None
    if not records and offset is not None and offset > status.log_start_offset:
        older = min(offset, upper)
    return RecordPage(status, mode, records, upper, older, newer, rate)
