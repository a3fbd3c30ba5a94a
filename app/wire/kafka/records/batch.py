"""Kafka record batches v2 (magic 2): the layout both ways share, its constants, and a batch as
decoded.

A batch, as Kafka's ``DefaultRecordBatch`` lays it out (big-endian)::

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8 | crc uint32 |
    attributes int16 | last_offset_delta int32 | base_timestamp int64 | max_timestamp int64 |
    producer_id int64 | producer_epoch int16 | base_sequence int32 | record_count int32 | records

``batch_length`` counts the bytes after itself; the CRC-32C covers ``attributes`` to the end (base
offset and leader epoch stay outside it, so a broker can set them without recomputing it). The
attributes hold the compression codec (bits 0-2), the timestamp type (bit 3), the transactional bit
(0x10) and the control bit (0x20); a compressed batch compresses its records section only. A record::

    length varint | attributes int8 | timestamp_delta varlong | offset_delta varint |
    key_length varint | key | value_length varint | value | header_count varint |
    (header_key_length varint | header_key | header_value_length varint | header_value)*

Every varint is zigzag-encoded (signed), the record length too; a length of -1 is null. A control
record (a transaction marker) has key ``[int16 version 0][int16 type]`` (0 ABORT, 1 COMMIT) and value
``[int16 version 0][int32 coordinator epoch]``, alone in a batch with the control and transactional
bits set.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from app.domain.records import Headers
from app.errors import ErrorCode, TxlogError

MAGIC = 2

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

INT32_MAX = 2**31 - 1

# base_offset, batch_length, partition_leader_epoch, magic: what is read before anything is trusted.
_PREFIX = struct.Struct(">qiib")
_CRC = struct.Struct(">I")
# attributes .. record_count: the part of the header the CRC covers.
_TAIL = struct.Struct(">hiqqqhii")
_CRC_AT = _PREFIX.size  # 17
_TAIL_AT = _CRC_AT + _CRC.size  # 21
HEADER_SIZE = _TAIL_AT + _TAIL.size  # 61
_CONTROL_KEY = struct.Struct(">hh")


class Record(NamedTuple):
    """One record of a decoded batch: its offset is the batch's ``base_offset + offset_delta``."""

    offset_delta: int
    timestamp_ms: int  # absolute; a LogAppendTime batch's records all carry its max_timestamp
    key: bytes | None
    value: bytes | None
    headers: Headers = ()  # ordered (key, value) pairs: keys may repeat, values may be None


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A record batch as it came, header fields and records, decompressed."""

    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]

    @property
    def compression(self) -> int:
        """COMPRESSION_NONE, _GZIP, _SNAPPY, _LZ4 or _ZSTD."""
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def control_type(self) -> int | None:
        """A control batch's marker type (CONTROL_ABORT, CONTROL_COMMIT; None for a data batch or a
        control record whose key is not a marker's)."""
        if not self.is_control or not self.records:
            return None
        key = self.records[0].key
        if key is None or len(key) < _CONTROL_KEY.size:
            return None
        return _CONTROL_KEY.unpack_from(key)[1]


def _corrupt(message: str) -> TxlogError:
    return TxlogError(ErrorCode.CORRUPT_MESSAGE, message)
