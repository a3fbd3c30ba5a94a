"""Consumer group offsets: what OffsetCommit and TxnOffsetCommit store (one entry per partition,
``last_per_partition``; the checks of ``check_committable``), and an offset as committed or stored.
Plain data and pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Protocol, Sequence, TypeVar

from app.errors import ErrorCode, TxlogError


class PartitionOffset(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


O = TypeVar("O", bound=PartitionOffset)


def last_per_partition(offsets: Iterable[O]) -> list[O]:
    """An offsets list as Kafka's OffsetCommit and TxnOffsetCommit read it, one entry per
    topic-partition: a partition given more than once keeps its last entry (the request is read into
    a map), in the place where the partition first appeared."""
    by_partition: dict[tuple[str, int], O] = {}
    for o in offsets:
        by_partition[(o.topic, o.partition)] = o
    return list(by_partition.values())


class CommittedOffset(PartitionOffset, Protocol):
    @property
    def offset(self) -> int: ...

    @property
    def metadata(self) -> str: ...


def check_committable(offsets: Sequence[CommittedOffset], max_metadata: int) -> None:
    """What OffsetCommit and TxnOffsetCommit store: an offset that is not negative — INVALID_REQUEST
    otherwise — with metadata (any string, a NUL inside included, as Kafka keeps it) no longer than
    ``max_metadata`` (offset.metadata.max.bytes, counted as Kafka counts a string's length: UTF-16
    code units) — OFFSET_METADATA_TOO_LARGE otherwise. The error names the partitions in
    ``details["partitions"]`` so that each gets its own."""
    invalid = [(o.topic, o.partition) for o in offsets if o.offset < 0]
    if invalid:
        raise TxlogError(
            ErrorCode.INVALID_REQUEST,
            "Offsets must not be negative: " + ", ".join(f"{t}-{p}" for t, p in invalid),
            partitions=invalid,
        )
    too_large = [(o.topic, o.partition) for o in offsets if _java_length(o.metadata) > max_metadata]
    if too_large:
        raise TxlogError(
            ErrorCode.OFFSET_METADATA_TOO_LARGE,
            f"Offset metadata longer than {max_metadata} characters (offset.metadata.max.bytes): "
            + ", ".join(f"{t}-{p}" for t, p in too_large),
            partitions=too_large,
        )


def _java_length(text: str) -> int:
    """A string's length as Java counts it: UTF-16 code units (a character beyond U+FFFF is two)."""
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


@dataclass(frozen=True)
class GroupOffset:
    """An offset committed, or to commit, for a group on a partition."""

    topic: str
    partition: int
    offset: int
    metadata: str
    leader_epoch: int = -1  # the leader epoch of the record before the offset, as the consumer knew it; -1: none


class GroupOffsetRow(NamedTuple):
    """A group's offset of a partition as stored."""

    topic: str
    partition: int
    offset: int | None  # None: nothing committed
    metadata: str | None
    pending: bool  # a transaction has an offset pending for the partition
    leader_epoch: int | None = None  # as committed (None: nothing committed)
