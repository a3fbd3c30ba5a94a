"""``TopicPartition`` and ``Message``, shaped as confluent-kafka's, with its offset and timestamp
constants. The producer and the consumer share them."""

from __future__ import annotations

from typing import Any, Iterable

from app.domain.records import decode_bytes, encode_bytes
from txlog.errors import KafkaError

# Logical offsets (librdkafka's RD_KAFKA_OFFSET_*).
OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

# Timestamp types of ``Message.timestamp()``.
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

Headers = list[tuple[str, bytes | None]]


class TopicPartition:
    """A topic, a partition and optionally an offset (and its metadata), as confluent-kafka's."""

    __slots__ = ("topic", "partition", "offset", "metadata", "leader_epoch", "error")

    def __init__(
        self,
        topic: str,
        partition: int = -1,
        offset: int = OFFSET_INVALID,
        metadata: str | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.metadata = metadata
        self.leader_epoch = leader_epoch
        self.error: KafkaError | None = None

    def _key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: "TopicPartition") -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        err = f",error={self.error}" if self.error is not None else ""
        return f"TopicPartition{{topic={self.topic},partition={self.partition},offset={self.offset}{err}}}"

    __str__ = __repr__


class Message:
    """One record: produced (handed to the delivery callback) or consumed (answered by ``poll``).
    A message with ``error()`` set reports an event instead (e.g. ``_PARTITION_EOF``)."""

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_headers", "_timestamp", "_error", "_latency")

    def __init__(
        self,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Headers | None = None,
        timestamp: tuple[int, int] = (TIMESTAMP_NOT_AVAILABLE, 0),
        error: KafkaError | None = None,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers or None
        self._timestamp = timestamp
        self._error = error
        self._latency: float | None = None

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Headers | None:
        """The headers as a list of ``(key, value)`` pairs in order (keys may repeat), or ``None``."""
        return list(self._headers) if self._headers else None

    def timestamp(self) -> tuple[int, int]:
        """``(timestamp type, epoch milliseconds)``."""
        return self._timestamp

    def error(self) -> KafkaError | None:
        return self._error

    def latency(self) -> float | None:
        """Seconds from ``produce()`` to the delivery report (produced messages only)."""
        return self._latency

    def leader_epoch(self) -> int | None:
        return None

    def set_key(self, key: bytes | None) -> None:
        self._key = key

    def set_value(self, value: bytes | None) -> None:
        self._value = value

    def set_headers(self, headers: Headers | None) -> None:
        self._headers = headers or None

    def __len__(self) -> int:
        return len(self._value) if self._value is not None else 0

    def __repr__(self) -> str:
        if self._error is not None:
            return f"Message{{error={self._error}}}"
        return f"Message{{topic={self._topic},partition={self._partition},offset={self._offset}}}"


# --- bytes on the wire ----------------------------------------------------------------------------


def to_bytes(v: Any, what: str) -> bytes | None:
    """A key, value or header value as bytes: ``bytes``-like as is, ``str`` as UTF-8, ``None`` kept."""
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes, str or None, not {type(v).__name__}")


def to_headers(headers: Any) -> Headers:
    """``headers`` given as confluent-kafka takes them (a dict, or a list of ``(key, value)``)."""
    if headers is None:
        return []
    items: Iterable[Any] = headers.items() if isinstance(headers, dict) else headers
    out: Headers = []
    for item in items:
        try:
            k, v = item
        except (TypeError, ValueError):
            raise TypeError("headers must be a dict or a list of (key, value) tuples") from None
        if not isinstance(k, str):
            raise TypeError(f"header key must be str, not {type(k).__name__}")
        out.append((k, to_bytes(v, "header value")))
    return out


def b64(v: bytes | None) -> str | None:
    """Bytes as the API's ``"encoding": "base64"`` carries them (the server's one definition)."""
    return encode_bytes(v, "base64")


def unb64(v: str | None) -> bytes | None:
    return decode_bytes(v, "base64", "a value")
