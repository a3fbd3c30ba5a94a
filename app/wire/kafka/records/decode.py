"""Decoding what producers send: a produce request's record batches (``decode_batches``), and their
records as the produce service takes them (``new_records``).

Decoding checks everything a hostile or broken producer could get wrong (magic, CRC, every length,
record count, decompressed size) and raises ``TxlogError``: CORRUPT_MESSAGE for bytes that do not
parse, UNSUPPORTED_FOR_MESSAGE_FORMAT for magic 0 and 1, UNSUPPORTED_COMPRESSION_TYPE for an
unknown codec, RECORD_LIST_TOO_LARGE / MESSAGE_TOO_LARGE beyond the limits, INVALID_RECORD for a
header key that is not UTF-8 — never anything else.

The per-record loop (reading a batch's records) also runs in C where txlog's C part is built
(``app.native``); the function here stays the definition, and answers whatever the C part leaves to
it.
"""

from __future__ import annotations

import google_crc32c

from app.config import Settings
from app.domain.records import Headers, NewRecord, validate_headers
from app.errors import ErrorCode, TxlogError
from app.native import native
from app.wire.kafka.records.batch import (
    _CRC,
    _CRC_AT,
    _PREFIX,
    _TAIL,
    _TAIL_AT,
    ATTR_COMPRESSION_MASK,
    ATTR_LOG_APPEND_TIME,
    COMPRESSION_NAMES,
    COMPRESSION_NONE,
    HEADER_SIZE,
    MAGIC,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    _corrupt,
)
from app.wire.kafka.records.decompress import _decompress

# The hostile-input limits' defaults (TXLOG_KAFKA_MAX_BATCH_RECORDS, TXLOG_KAFKA_MAX_DECOMPRESSED_BYTES);
# the gateway passes the settings it runs with.
DEFAULT_MAX_BATCH_RECORDS: int = Settings.model_fields["kafka_max_batch_records"].default
DEFAULT_MAX_DECOMPRESSED_BYTES: int = Settings.model_fields["kafka_max_decompressed_bytes"].default

_MIN_BATCH_LENGTH = HEADER_SIZE - 12  # batch_length of a batch without records
# The smallest record: length, attributes, timestamp delta, offset delta, key length, value length
# and header count, one byte each.
_MIN_RECORD_SIZE = 7


def compressed(data: bytes) -> bool:
    """Whether the first batch of a partition's records says it is compressed (False when too
    short to say: decoding refuses it)."""
    return len(data) >= HEADER_SIZE and data[_TAIL_AT + 1] & ATTR_COMPRESSION_MASK != 0


def decode_batches(
    data: bytes | bytearray | memoryview | None,
    *,
    max_records: int = DEFAULT_MAX_BATCH_RECORDS,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> list[RecordBatch]:
    """The record batches of a produce request's ``records`` bytes (one or more batches, end to end;
    empty or null records make no batch). At most ``max_records`` records per batch (RECORD_LIST_TOO_LARGE)
    and at most ``max_decompressed_bytes`` bytes decompressed over all the batches together
    (MESSAGE_TOO_LARGE): decompression stops at that size, whatever the input claims."""
    if data is None:
        return []
    if not isinstance(data, bytes):
        data = bytes(data)
    batches: list[RecordBatch] = []
    pos = 0
    end = len(data)
    budget = max_decompressed_bytes
    while pos < end:
        where = f"Record batch {len(batches)} (at byte {pos})"
        if end - pos < _PREFIX.size:
            raise _corrupt(f"{where}: {end - pos} bytes left, too few for a batch header")
        base_offset, batch_length, leader_epoch, magic = _PREFIX.unpack_from(data, pos)
        if magic != MAGIC:
            if magic in (0, 1):
                raise TxlogError(
                    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                    f"{where}: message format v{magic} (magic {magic}); only record batches v2 (magic 2) are accepted",
                )
            raise _corrupt(f"{where}: unknown magic {magic}")
        if batch_length < _MIN_BATCH_LENGTH:
            raise _corrupt(f"{where}: batch length {batch_length} is less than a batch header's {_MIN_BATCH_LENGTH}")
        batch_end = pos + 12 + batch_length
        if batch_end > end:
            raise _corrupt(f"{where}: batch length {batch_length} runs past the {end - pos - 12} bytes left")
        # bytes: google_crc32c takes no memoryview, and the records are read from this copy.
        covered = data[pos + _TAIL_AT : batch_end]
        (crc,) = _CRC.unpack_from(data, pos + _CRC_AT)
        computed = google_crc32c.value(covered)
        if computed != crc:
            raise _corrupt(f"{where}: CRC-32C mismatch (batch says {crc:#010x}, content is {computed:#010x})")
        attributes, last_delta, base_ts, max_ts, producer_id, epoch, base_seq, count = _TAIL.unpack_from(covered, 0)
        if count < 0:
            raise _corrupt(f"{where}: negative record count {count}")
        if count > max_records:
            raise TxlogError(
                ErrorCode.RECORD_LIST_TOO_LARGE, f"{where} has {count} records; at most {max_records} are accepted in one batch"
            )
        codec = attributes & ATTR_COMPRESSION_MASK
        if codec not in COMPRESSION_NAMES:
            raise TxlogError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"{where}: unknown compression codec {codec}")
        start = _TAIL.size
        if codec != COMPRESSION_NONE and (count or len(covered) > start):
            covered = _decompress(codec, memoryview(covered)[start:], budget, where)
            budget -= len(covered)
            start = 0
        if count * _MIN_RECORD_SIZE > len(covered) - start:
            raise _corrupt(f"{where}: {count} records cannot fit in {len(covered) - start} bytes")
        log_append_ts = max_ts if attributes & ATTR_LOG_APPEND_TIME else None
        records = native.read_records(covered, start, count, base_ts, log_append_ts, Record) if native else None
        if records is None:  # no C part, or not the plain case: the definition, and its exact error
            records = _read_records(covered, start, count, base_ts, log_append_ts, where)
        batches.append(
            RecordBatch(
                base_offset,
                leader_epoch,
                magic,
                crc,
                attributes,
                last_delta,
                base_ts,
                max_ts,
                producer_id,
                epoch,
                base_seq,
                records,
            )
        )
        pos = batch_end
    return batches


# The values of the one-byte varints 0x00 .. 0x7f.
_SMALL_VARINTS = [(b >> 1) ^ -(b & 1) for b in range(0x80)]


def _read_varint(buf: bytes, p: int, bits: int = 32) -> tuple[int, int]:
    """Kafka's varint (zigzag, at most 5 bytes, 32 bits) at ``p``, or its varlong with ``bits=64``
    (at most 10 bytes): (value, next position)."""
    b = buf[p]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), p + 1
    z = b & 0x7F
    shift = 7
    p += 1
    while True:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift >= bits:
            raise _corrupt(f"a var{'int' if bits == 32 else 'long'} is longer than {bits // 7 + 1} bytes")
    if z >> bits:
        raise _corrupt(f"a var{'int' if bits == 32 else 'long'} does not fit in {bits} bits")
    return (z >> 1) ^ -(z & 1), p


def _read_records(buf: bytes, p: int, count: int, base_ts: int, log_append_ts: int | None, where: str) -> tuple[Record, ...]:
    """``count`` records from ``buf[p:]``, which they must fill exactly (the definition that
    ``native.read_records`` accelerates)."""
    end = len(buf)
    records: list[Record] = []
    append = records.append
    varint = _read_varint
    small = _SMALL_VARINTS
    new = tuple.__new__
    i = 0
    try:
        # Deltas, key lengths and header counts are mostly one byte: read those inline.
        for _ in range(count):
            b = buf[p]
            if b < 0x80:
                length = small[b]
                p += 1
            elif buf[p + 1] < 0x80:  # two bytes, as for records of 64 bytes to 8 KiB
                z = (b & 0x7F) | (buf[p + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                p += 2
            else:
                length, p = varint(buf, p)
            record_end = p + length
            if length < _MIN_RECORD_SIZE - 1 or record_end > end:
                raise _corrupt(f"record length {length} with {end - p} bytes left")
            b = buf[p + 1]  # after the record's attributes, unused
            if b < 0x80:
                ts_delta = small[b]
                p += 2
            else:
                ts_delta, p = varint(buf, p + 1, 64)
            b = buf[p]
            if b < 0x80:
                offset_delta = small[b]
                p += 1
            else:
                offset_delta, p = varint(buf, p)
            b = buf[p]
            if b < 0x80:
                n = small[b]
                p += 1
            else:
                n, p = varint(buf, p)
            if n >= 0:
                key = buf[p : p + n]
                p += n
            elif n == -1:
                key = None
            else:
                raise _corrupt(f"key length {n}")
            b = buf[p]
            if b < 0x80:
                n = small[b]
                p += 1
            elif buf[p + 1] < 0x80:
                z = (b & 0x7F) | (buf[p + 1] << 7)
                n = (z >> 1) ^ -(z & 1)
                p += 2
            else:
                n, p = varint(buf, p)
            if n >= 0:
                value = buf[p : p + n]
                p += n
            elif n == -1:
                value = None
            else:
                raise _corrupt(f"value length {n}")
            b = buf[p]
            if b < 0x80:
                n = small[b]
                p += 1
            else:
                n, p = varint(buf, p)
            if n == 0:
                headers: Headers = ()
            else:
                if n < 0 or n > (record_end - p) // 2:
                    raise _corrupt(f"header count {n} with {record_end - p} bytes left in the record")
                pairs: list[tuple[str, bytes | None]] = []
                for _ in range(n):
                    n, p = varint(buf, p)
                    if n < 0:
                        raise _corrupt(f"header key length {n}")
                    hkey = buf[p : p + n]
                    p += n
                    n, p = varint(buf, p)
                    if n >= 0:
                        pairs.append((hkey.decode("utf-8"), buf[p : p + n]))
                        p += n
                    elif n == -1:
                        pairs.append((hkey.decode("utf-8"), None))
                    else:
                        raise _corrupt(f"header value length {n}")
                headers = tuple(pairs)
            if p != record_end:
                raise _corrupt(f"the record's fields take {p - record_end + length} bytes, its length says {length}")
            # tuple.__new__: a NamedTuple's own constructor costs twice as much
            append(
                new(Record, (offset_delta, base_ts + ts_delta if log_append_ts is None else log_append_ts, key, value, headers))
            )
    except TxlogError as exc:
        raise _corrupt(f"{where}, record {i}: {exc.message}") from None
    except IndexError:
        raise _corrupt(f"{where}, record {i}: truncated") from None
    except UnicodeDecodeError:
        raise TxlogError(ErrorCode.INVALID_RECORD, f"{where}, record {i}: a header key is not UTF-8") from None
    if p != end:
        raise _corrupt(f"{where}: {end - p} bytes after its {count} records")
    return tuple(records)


# --- produce --------------------------------------------------------------------------------------


def new_records(batch: RecordBatch) -> list[NewRecord]:
    """The batch's records as the produce service takes them. The timestamp is the producer's
    (CreateTime), or None — the append time — for a LogAppendTime batch or a record without one
    (-1). Header keys must be text PostgreSQL can store (INVALID_RECORD otherwise)."""
    keep_time = not batch.attributes & ATTR_LOG_APPEND_TIME
    for i, r in enumerate(batch.records):
        if r.headers:
            validate_headers(r.headers, f"record {i}")
    new = tuple.__new__  # a NamedTuple's own constructor costs twice as much
    return [
        new(NewRecord, (key, value, headers, ts if keep_time and ts != NO_TIMESTAMP else None))
        for _, ts, key, value, headers in batch.records
    ]
