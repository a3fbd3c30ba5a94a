"""Consumer group offset rules: plain functions, no I/O."""

from __future__ import annotations

from typing import Iterable, Protocol, TypeVar


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
