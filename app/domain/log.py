"""The log's values: topics and partitions, the records stored in a partition's log, the batches
appended to it and what an append plans against. Plain data, read from and written to storage by
``app.storage``; no I/O here."""

from __future__ import annotations

import operator
import uuid
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from app.domain.producer_state import ProducerStateEntry
from app.domain.records import Headers, NewRecord, record_size, record_sizes
from app.domain.transactions import TxnMetadata
from app.errors import ErrorCode, TxlogError


def stored_headers(keys: list[str] | None, values: list[bytes | None] | None) -> Headers:
    """A record's headers from its stored columns: the keys and the values, in order."""
    return tuple(zip(keys, values)) if keys else ()  # type: ignore[arg-type]  # values line up with keys: the arrays are written together


class StoredRecord(NamedTuple):
    """A record as read from the log: a row of ``RECORD_COLUMNS`` (``app.storage.log``) as it comes
    (a tuple: a fetch page makes many, and builds them without a Python call per record)."""

    offset: int
    key: bytes | None
    value: bytes | None
    header_keys: list[str] | None
    header_values: list[bytes | None] | None
    timestamp_ms: int
    producer_id: int | None
    producer_epoch: int | None
    sequence: int | None
    is_transactional: bool
    control_type: int | None
    position: int  # bytes of data records before this one in the partition
    txn_first_offset: int | None  # a transactional record's: its transaction's first offset on the partition
    aborted: bool  # its transaction aborted (txlog.log_records.aborted), where the read asked

    @property
    def headers(self) -> Headers:
        return stored_headers(self.header_keys, self.header_values)

    @property
    def size(self) -> int:
        if not self.header_keys:  # most records: no call, no headers tuple
            return len(self.key or b"") + len(self.value or b"")
        return record_size(self.key, self.value, self.headers)


_KEY = operator.attrgetter("key")
_VALUE = operator.attrgetter("value")
_HEADER_KEYS = operator.attrgetter("header_keys")


def records_size(records: Sequence[StoredRecord]) -> int:
    """The ``size`` of ``records`` summed: by C loops over keys and values when none has headers."""
    if any(map(_HEADER_KEYS, records)):
        return sum(r.size for r in records)
    return sum(map(len, filter(None, map(_KEY, records)))) + sum(map(len, filter(None, map(_VALUE, records))))


def header_count(records: Sequence[StoredRecord]) -> int:
    """How many headers ``records`` have in all."""
    return sum(map(len, filter(None, map(_HEADER_KEYS, records))))


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    partitions: int
    topic_id: uuid.UUID


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    open_transactions: int = 0


def unknown_partition(topic: str, partition: int) -> TxlogError:
    return TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic-partition {topic}-{partition} does not exist")


# One copy of every record, in PostgreSQL: each partition has one replica, its leader, and that
# leader never changes epoch. Metadata, ListOffsets, the batches a fetch writes and
# OffsetForLeaderEpoch all name this epoch.
LEADER_EPOCH = 0
NO_EPOCH = -1  # Kafka's UNDEFINED_EPOCH (and a request's "no current leader epoch")
NO_EPOCH_OFFSET = -1  # Kafka's UNDEFINED_EPOCH_OFFSET


@dataclass(frozen=True)
class EpochEndOffset:
    """Kafka's answer to "where does leader epoch N end": the largest epoch at or below the one
    asked for, and the offset where the next epoch begins (the log end for the latest epoch);
    ``NO_EPOCH`` / ``NO_EPOCH_OFFSET`` when no epoch at or below it is known."""

    leader_epoch: int
    end_offset: int


def epoch_end_offset(
    requested_epoch: int, current_leader_epoch: int, log_start_offset: int, log_end_offset: int, leader_epoch: int = LEADER_EPOCH
) -> EpochEndOffset:
    """OffsetForLeaderEpoch for one partition whose whole log was written at ``leader_epoch``
    (Kafka's leader epoch cache holding one entry, starting at the log start once records below
    it are deleted).

    The fence comes first: a ``current_leader_epoch`` the client sends (not ``NO_EPOCH``) older
    than the leader's is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH. Then, as Kafka's
    cache answers: the latest epoch ends at the log end (a consumer compares it with its position:
    below it would be a truncation); an epoch above the latest, or ``NO_EPOCH``, has no end
    (``NO_EPOCH``/``NO_EPOCH_OFFSET``, not an error); any other epoch below the first known one
    ends where the first begins, and keeps its own number."""
    if current_leader_epoch != NO_EPOCH:
        if current_leader_epoch < leader_epoch:
            raise TxlogError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"The leader epoch {current_leader_epoch} in the request is older than the leader's, {leader_epoch}",
            )
        if current_leader_epoch > leader_epoch:
            raise TxlogError(
                ErrorCode.UNKNOWN_LEADER_EPOCH,
                f"The leader epoch {current_leader_epoch} in the request is newer than the leader's, {leader_epoch}",
            )
    if requested_epoch == leader_epoch:
        return EpochEndOffset(leader_epoch, log_end_offset)
    if requested_epoch == NO_EPOCH or requested_epoch > leader_epoch:
        return EpochEndOffset(NO_EPOCH, NO_EPOCH_OFFSET)
    return EpochEndOffset(requested_epoch, log_start_offset)


@dataclass(frozen=True)
class PartitionLogSize:
    """A partition's log as Kafka's DescribeLogDirs sizes it: the bytes of data records from its
    log start to its high watermark (what ``retention.bytes`` bounds)."""

    topic: str
    partition: int
    size_bytes: int


@dataclass(frozen=True)
class AppendPosition:
    next_offset: int
    log_start_offset: int
    next_position: int
    producer_state: ProducerStateEntry | None
    # When the producer id was given to a transactional id: that transactional id's current state
    # (``None`` inside if it was removed since), and why the id was retired, if it was.
    owner: "ProducerOwner | None"


@dataclass(frozen=True)
class ProducerOwner:
    transactional_id: str
    retire_reason: str | None
    meta: TxnMetadata | None


@dataclass(frozen=True)
class AppendBatch:
    """A batch to append at ``base_offset`` of a partition whose append lock the caller holds. A
    transaction marker is a batch of one control record (``control_type``); an ABORT marker also
    indexes the aborted transaction's range [``aborted_first_offset``, marker offset] (Kafka's
    .txnindex). Transactional records and markers carry ``txn_first_offset``, the first offset of
    their transaction on the partition. ``producer_state``: the producer's state after the batch,
    to save. ``sizes``: the records' sizes when the caller has them already (control records
    count 0). ``trailing_marker``: the batch's last record is the marker (a control record of this
    type, no sequence) that ends the transaction its other records belong to — a batch that
    commits its transaction, stored exactly as the batch followed by its marker."""

    topic: str
    partition: int
    base_offset: int
    base_position: int
    records: Sequence[NewRecord]
    append_time_ms: int
    producer_id: int | None = None
    producer_epoch: int | None = None
    base_sequence: int | None = None
    transactional: bool = False
    producer_state: ProducerStateEntry | None = None
    control_type: int | None = None
    aborted_first_offset: int | None = None
    txn_first_offset: int | None = None
    sizes: Sequence[int] | None = None
    trailing_marker: int | None = None

    def record_sizes(self) -> Sequence[int]:
        """What each record adds to the partition's log position (a control record nothing)."""
        if self.control_type is not None:
            return [0] * len(self.records)
        if self.sizes is not None:
            return self.sizes
        if self.trailing_marker is not None:
            return [*record_sizes(self.records[:-1]), 0]
        return record_sizes(self.records)


@dataclass(frozen=True)
class RetainedPartition:
    topic: str
    partition: int
    log_start_offset: int
    last_stable_offset: int
    retention_ms: int | None
    retention_bytes: int | None
    next_position: int  # the log position of the high watermark
    size_bytes: int  # bytes of data from the log start to the high watermark


@dataclass(frozen=True)
class LogRecord:
    """A record as an operator browses it: data or control, with what became of its transaction."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    producer_id: int | None
    producer_epoch: int | None
    sequence: int | None
    is_transactional: bool
    control_type: int | None
    aborted: bool  # its transaction aborted (txlog.log_records.aborted)
    open: bool  # its transaction has no marker yet on this partition


@dataclass(frozen=True)
class LsoHolder:
    """The open transaction whose first offset is a partition's last stable offset."""

    topic: str
    partition: int
    last_stable_offset: int
    high_watermark: int
    producer_id: int
    producer_epoch: int
    transactional_id: str | None
    state: str | None
    started_at_ms: int | None
    last_append_ms: int
