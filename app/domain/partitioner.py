"""Kafka's default key partitioner: ``toPositive(murmur2(keyBytes)) % numPartitions``."""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def _to_int32(x: int) -> int:
    x &= _MASK
    return x - (1 << 32) if x & 0x80000000 else x


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash, seed 0x9747b28c."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    full = length - (length % 4)
    for i in range(0, full, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return _to_int32(h)


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: clears the sign bit."""
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    encoded = s.encode("utf-16-be")
    for i in range(0, len(encoded), 2):
        h = (31 * h + ((encoded[i] << 8) | encoded[i + 1])) & _MASK
    return _to_int32(h)


def coordinator_partition(transactional_id: str, state_partitions: int) -> int:
    """The transaction-state partition that owns a transactional id, as Kafka's
    ``Utils.abs(transactionalId.hashCode) % transactionTopicPartitionCount``."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % state_partitions
