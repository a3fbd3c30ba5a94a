"""A produced batch's records section decompressed — gzip, snappy (raw, or xerial's framing), lz4
frames, zstd — bounded: no codec is ever asked for more output than the budget left
(TXLOG_KAFKA_MAX_DECOMPRESSED_BYTES), a longer output is MESSAGE_TOO_LARGE and bad data
CORRUPT_MESSAGE.
"""

from __future__ import annotations

import struct
import zlib

import cramjam

from app.errors import ErrorCode, TxlogError
from app.wire.kafka.records.batch import COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_SNAPPY, _corrupt

_BLOCK_LENGTH = struct.Struct(">i")

# xerial's snappy-java stream (Java producers): this magic, int32 version, int32 compatible
# version, then blocks of [int32 length][raw snappy]. librdkafka sends raw snappy.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
# cramjam's message when the output buffer is too small for what the input decompresses to.
_OUTPUT_FULL = "failed to write whole buffer"
_FIRST_OUTPUT_GUESS = 65_536
_GZIP_CHUNK = 1_048_576


def _too_large(where: str, budget: int) -> TxlogError:
    return TxlogError(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"{where} decompresses to more than the {budget} bytes accepted (TXLOG_KAFKA_MAX_DECOMPRESSED_BYTES)",
    )


def _decompress(codec: int, payload: memoryview, budget: int, where: str) -> bytes:
    """``payload`` decompressed, refused once the output would pass ``budget`` bytes: no codec is
    ever asked for more output than that."""
    if codec == COMPRESSION_GZIP:
        return _gunzip(payload, budget, where)
    if codec == COMPRESSION_SNAPPY:
        return _unsnappy(payload, budget, where)
    if codec == COMPRESSION_LZ4:
        return _decompress_into("lz4", cramjam.lz4.decompress_into, payload, _lz4_content_size(payload), budget, where)
    return _decompress_into("zstd", cramjam.zstd.decompress_into, payload, _zstd_content_size(payload), budget, where)


def _gunzip(payload: memoryview, budget: int, where: str) -> bytes:
    """gzip, one member or several end to end, through zlib: input and output a chunk at a time,
    stopped one byte past the budget."""
    end = len(payload)
    parts = []
    total = 0
    pos = 0
    data: bytes | memoryview = b""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        while True:
            if not data and pos < end:
                data = payload[pos : pos + _GZIP_CHUNK]
                pos += len(data)
            out = d.decompress(data, min(_GZIP_CHUNK, budget - total + 1))
            data = d.unconsumed_tail
            total += len(out)
            if total > budget:
                raise _too_large(where, budget)
            parts.append(out)
            if d.eof:
                data = d.unused_data
                if not data and pos >= end:
                    return b"".join(parts)
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next member
            elif not out and not data and pos >= end:
                raise _corrupt(f"{where}: truncated gzip data")
    except zlib.error as exc:
        raise _corrupt(f"{where}: bad gzip data ({exc})") from None


def _unsnappy(payload: memoryview, budget: int, where: str) -> bytes:
    """Raw snappy (librdkafka) or xerial's framing of raw snappy blocks (Java). Each raw block
    states its decompressed length first: checked against the budget before it is decompressed."""
    if payload[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return _unsnappy_raw(payload, budget, where)
    parts = []
    total = 0
    p = _XERIAL_HEADER_SIZE
    end = len(payload)
    if end < p:
        raise _corrupt(f"{where}: truncated snappy stream header")
    while p < end:
        if end - p < _BLOCK_LENGTH.size:
            raise _corrupt(f"{where}: truncated snappy block length")
        (n,) = _BLOCK_LENGTH.unpack_from(payload, p)
        p += _BLOCK_LENGTH.size
        if n < 0 or n > end - p:
            raise _corrupt(f"{where}: snappy block length {n} with {end - p} bytes left")
        block = _unsnappy_raw(payload[p : p + n], budget - total, where)
        total += len(block)
        parts.append(block)
        p += n
    return b"".join(parts)


def _unsnappy_raw(block: memoryview, budget: int, where: str) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(block)
        if size > budget:
            raise _too_large(where, budget)
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise _corrupt(f"{where}: bad snappy data ({exc})") from None


def _decompress_into(name: str, decompress_into, payload: memoryview, declared: int | None, budget: int, where: str) -> bytes:
    """lz4 (frame format) and zstd: into a buffer of the size the frame declares, else of a guess
    that grows fourfold while the output does not fit, never beyond ``budget``."""
    if declared is not None and declared > budget:
        raise _too_large(where, budget)
    size = min(budget, declared if declared is not None else max(_FIRST_OUTPUT_GUESS, 8 * len(payload)))
    while True:
        out = bytearray(size)
        try:
            n = decompress_into(payload, out)
        except cramjam.DecompressionError as exc:
            if _OUTPUT_FULL not in str(exc):
                raise _corrupt(f"{where}: bad {name} data ({exc})") from None
            if size >= budget:
                raise _too_large(where, budget) from None
            del out  # before the larger buffer: at most one buffer at a time
            size = min(budget, 4 * size)
            continue
        return bytes(memoryview(out)[:n])


def _zstd_content_size(payload: memoryview) -> int | None:
    """The decompressed size a zstd frame header declares (None: not declared)."""
    if len(payload) < 6 or payload[:4] != _ZSTD_MAGIC:
        return None
    descriptor = payload[4]
    single_segment = (descriptor >> 5) & 1
    p = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    if width == 0 or len(payload) < p + width:
        return None
    size = int.from_bytes(payload[p : p + width], "little")
    return size + 256 if width == 2 else size


def _lz4_content_size(payload: memoryview) -> int | None:
    """The decompressed size an LZ4 frame header declares (None: not declared)."""
    if len(payload) < 14 or payload[:4] != _LZ4_MAGIC or not payload[4] & 0x08:
        return None
    return int.from_bytes(payload[6:14], "little")
