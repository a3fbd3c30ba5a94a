"""Kafka's consumer protocol: what a consumer of protocol type ``consumer`` puts in JoinGroup's
member metadata (its subscription) and what the group's leader hands each member through SyncGroup
(its assignment). The coordinator passes both along as opaque bytes; the admin pages read them to
show which member reads which partitions. No I/O.

The layouts are Kafka's ConsumerProtocolSubscription and ConsumerProtocolAssignment schemas (never
flexible): big-endian integers, a string as an int16 length and UTF-8, an array as an int32 count,
bytes as an int32 length, -1 for null where a field is nullable.

- Assignment, versions 0–3 alike: ``version int16``, ``assigned_partitions [topic string,
  partitions [int32]]``, ``user_data bytes`` (nullable).
- Subscription: ``version int16``, ``topics [string]``, ``user_data bytes`` (nullable); from v1
  ``owned_partitions [topic string, partitions [int32]]``; from v2 ``generation_id int32``; from
  v3 ``rack_id string`` (nullable).

As Kafka's ``ConsumerProtocol`` reads them, a version above the newest known is read as the newest
one and bytes after the last known field are ignored. Anything else that does not read —
truncated, a negative length, a count larger than the bytes left, text that is not UTF-8, a
negative version — is ``ConsumerProtocolError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CONSUMER_PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_MAX_VERSION = 3

TopicPartitions = tuple[tuple[str, tuple[int, ...]], ...]

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class ConsumerProtocolError(ValueError):
    """Bytes that are not a consumer protocol assignment or subscription."""


@dataclass(frozen=True)
class Assignment:
    version: int
    partitions: TopicPartitions  # as the leader listed them
    user_data: bytes | None

    @property
    def count(self) -> int:
        return sum(len(ps) for _, ps in self.partitions)


@dataclass(frozen=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    user_data: bytes | None
    owned_partitions: TopicPartitions = ()
    generation_id: int = -1
    rack_id: str | None = None


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    def _take(self, n: int) -> memoryview:
        if n > len(self.data) - self.pos:
            raise ConsumerProtocolError(f"a truncated {self.what}: {n} bytes wanted at byte {self.pos} of {len(self.data)}")
        piece = self.data[self.pos : self.pos + n]
        self.pos += n
        return piece

    def int16(self) -> int:
        value: int = _INT16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _INT32.unpack(self._take(4))[0]
        return value

    def string(self, nullable: bool = False) -> str | None:
        length = self.int16()
        if length == -1 and nullable:
            return None
        if length < 0:
            raise ConsumerProtocolError(f"a {self.what} with a string of length {length} at byte {self.pos - 2}")
        try:
            return bytes(self._take(length)).decode("utf-8")
        except UnicodeDecodeError:
            raise ConsumerProtocolError(f"a {self.what} with a string that is not UTF-8 at byte {self.pos - length}") from None

    def bytes_(self) -> bytes | None:
        length = self.int32()
        if length == -1:
            return None
        if length < 0:
            raise ConsumerProtocolError(f"a {self.what} with bytes of length {length} at byte {self.pos - 4}")
        return bytes(self._take(length))

    def count(self, min_item_bytes: int) -> int:
        """An array's count, which the bytes left must be able to hold (no null array here)."""
        n = self.int32()
        if n < 0 or n * min_item_bytes > len(self.data) - self.pos:
            raise ConsumerProtocolError(f"a {self.what} with an array of {n} items at byte {self.pos - 4}")
        return n

    def version(self) -> int:
        v = self.int16()
        if v < 0:
            raise ConsumerProtocolError(f"a {self.what} of version {v}")
        return v

    def topic_partitions(self) -> TopicPartitions:
        out = []
        for _ in range(self.count(2 + 4)):  # a topic: its name's length, its partitions' count
            topic = self.string()
            assert topic is not None
            partitions = tuple(self.int32() for _ in range(self.count(4)))
            out.append((topic, partitions))
        return tuple(out)


def decode_assignment(data: bytes) -> Assignment:
    """A member's assignment, as its group's leader wrote it."""
    r = _Reader(data, "consumer assignment")
    version = r.version()
    partitions = r.topic_partitions()
    return Assignment(version, partitions, r.bytes_())


def decode_subscription(data: bytes) -> Subscription:
    """A member's subscription (its JoinGroup metadata for the chosen protocol)."""
    r = _Reader(data, "consumer subscription")
    version = r.version()
    topics = []
    for _ in range(r.count(2)):
        topic = r.string()
        assert topic is not None
        topics.append(topic)
    user_data = r.bytes_()
    known = min(version, SUBSCRIPTION_MAX_VERSION)
    owned = r.topic_partitions() if known >= 1 else ()
    generation_id = r.int32() if known >= 2 else -1
    rack_id = r.string(nullable=True) if known >= 3 else None
    return Subscription(version, tuple(topics), user_data, owned, generation_id, rack_id)
