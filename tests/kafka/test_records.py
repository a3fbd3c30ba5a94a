"""Record batches v2 (app.wire.kafka.records): round trips, kafka-python as an independent reader and
writer, every codec, hostile input, and the produce handler's conversion of a batch to the produce
service's request (api.kafka.handlers.produce).

kafka-python's codecs want python-snappy, lz4 and zstandard, which are not installed: its snappy,
lz4 and zstd writers are pointed at cramjam here (its own xerial framing and batch layout stay its
own). Its CRC is pure Python (a few MB/s), so its batches stay small.
"""

from __future__ import annotations

import gzip
import struct
import time
import tracemalloc
import types
import warnings
import zlib
from typing import Callable, Iterator

import cramjam
import google_crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    # kafka-python 3.0.12's package import reads its schemas with a deprecated importlib.resources call
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.codec
    import kafka.record.default_records as kafka_default_records
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

from api.kafka.handlers.produce import produce_request
from app.domain.log import StoredRecord
from app.domain.records import CONTROL_ABORT, CONTROL_COMMIT, NewRecord
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.records.batch import (
    ATTR_LOG_APPEND_TIME,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    INT32_MAX,
    Record,
    RecordBatch,
)
from app.wire.kafka.records.decode import DEFAULT_MAX_DECOMPRESSED_BYTES, decode_batches
from app.wire.kafka.records.encode import batch_runs, encode_batch, encode_control_batch, encode_records

MiB = 1 << 20
SEQ_MOD = 1 << 31


# --- helpers: stored records, and batches written by hand (independently of the encoder) ------------


def stored(
    offset: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: list[tuple[str, bytes | None]] | None = None,
    timestamp_ms: int = 1_700_000_000_000,
    producer_id: int | None = None,
    producer_epoch: int | None = None,
    sequence: int | None = None,
    is_transactional: bool = False,
    control_type: int | None = None,
) -> StoredRecord:
    keys = [k for k, _ in headers] if headers is not None else None
    values = [v for _, v in headers] if headers is not None else None
    return StoredRecord(
        offset,
        key,
        value,
        keys,
        values,
        timestamp_ms,
        producer_id,
        producer_epoch,
        sequence,
        is_transactional,
        control_type,
        0,
        None,
        False,
    )


def zz(n: int) -> bytes:
    """Zigzag varint, written plainly."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append(0x80 | (z & 0x7F))
        z >>= 7


def raw_record(
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[bytes, bytes | None]] = (),  # type: ignore[assignment]
    ts_delta: int = 0,
    length_adjust: int = 0,
) -> bytes:
    body = bytearray(b"\x00") + zz(ts_delta) + zz(offset_delta)
    for part in (key, value):
        body += zz(-1) if part is None else zz(len(part)) + part
    body += zz(len(headers))
    for hk, hv in headers:
        body += zz(len(hk)) + hk
        body += zz(-1) if hv is None else zz(len(hv)) + hv
    return zz(len(body) + length_adjust) + bytes(body)


def raw_batch(
    section: bytes,
    count: int,
    *,
    attributes: int = 0,
    magic: int = 2,
    base_offset: int = 0,
    last_offset_delta: int | None = None,
    base_ts: int = 1_700_000_000_000,
    max_ts: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    batch_length: int | None = None,
    crc: int | None = None,
) -> bytes:
    tail = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            max(count - 1, 0) if last_offset_delta is None else last_offset_delta,
            base_ts,
            base_ts if max_ts is None else max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + section
    )
    if crc is None:
        crc = google_crc32c.value(tail)
    if batch_length is None:
        batch_length = 4 + 1 + 4 + len(tail)
    return struct.pack(">qiibI", base_offset, batch_length, 0, magic, crc) + tail


def recompress(batch: bytes, codec: int, compress) -> bytes:  # type: ignore[no-untyped-def]
    """An uncompressed batch with its records section compressed by ``compress`` and the codec set."""
    fields = struct.unpack_from(">qiibIhiqqqhii", batch)
    (base_offset, _, _, _, _, attributes, last_delta, base_ts, max_ts, pid, epoch, seq, count) = fields
    return raw_batch(
        bytes(compress(batch[61:])),
        count,
        attributes=(attributes & ~7) | codec,
        base_offset=base_offset,
        last_offset_delta=last_delta,
        base_ts=base_ts,
        max_ts=max_ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def code_of(data: bytes, **limits: int) -> ErrorCode:
    with pytest.raises(TxlogError) as info:
        decode_batches(data, **limits)
    return info.value.code


def flatten(batches: list[RecordBatch]) -> list[tuple]:
    """Per record: offset, timestamp, key, value, headers, producer id, epoch, transactional, sequence."""
    out = []
    for b in batches:
        for r in b.records:
            seq = -1 if b.base_sequence == -1 else (b.base_sequence + r.offset_delta) % SEQ_MOD
            out.append(
                (
                    b.base_offset + r.offset_delta,
                    r.timestamp_ms,
                    r.key,
                    r.value,
                    r.headers,
                    b.producer_id,
                    b.producer_epoch,
                    b.is_transactional,
                    seq,
                )
            )
    return out


def expected(records: list[StoredRecord]) -> list[tuple]:
    return [
        (
            r.offset,
            r.timestamp_ms,
            r.key,
            r.value,
            tuple(zip(r.header_keys or (), r.header_values or ())),
            -1 if r.producer_id is None else r.producer_id,
            -1 if r.producer_epoch is None else r.producer_epoch,
            r.is_transactional,
            -1 if r.sequence is None else r.sequence,
        )
        for r in records
    ]


def kafka_python_read(data: bytes) -> list[tuple]:
    """What kafka-python reads from ``data``: the same tuples as ``flatten`` (control records give
    their type as the key)."""
    out = []
    mr = MemoryRecords(data)
    while (batch := mr.next_batch()) is not None:
        assert batch.validate_crc()
        for r in batch:
            if batch.is_control_batch:
                out.append(("control", r.offset, r.timestamp, r.type, batch.producer_id, batch.producer_epoch))
                continue
            seq = -1 if batch.base_sequence == -1 else (batch.base_sequence + r.offset - batch.base_offset) % SEQ_MOD
            out.append(
                (
                    r.offset,
                    r.timestamp,
                    r.key,
                    r.value,
                    tuple(r.headers),
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.is_transactional,
                    seq,
                )
            )
    return out


# --- strategies -------------------------------------------------------------------------------------

maybe_bytes = st.none() | st.binary(max_size=40)
header_key = st.sampled_from(["h", "trace-id", ""]) | st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6
)
headers_st = st.none() | st.lists(st.tuples(header_key, st.none() | st.binary(max_size=12)), max_size=5)
producer_st = st.none() | st.tuples(
    st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, SEQ_MOD - 1), st.booleans()
)


@st.composite
def runs(draw, max_records: int = 12) -> list[StoredRecord]:  # type: ignore[no-untyped-def]
    """Records as a fetch reads them: ascending offsets (gaps included, some beyond what one batch
    spans), timestamps going back and forth, runs of producers with sequences following offsets,
    and markers."""
    offset = draw(st.integers(0, 2**62))
    ts0 = draw(st.integers(0, 2**45))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        producer = draw(producer_st)
        first = offset
        for _ in range(draw(st.integers(1, max_records))):
            if producer is None:
                pid = epoch = seq = None
                txn = False
            else:
                pid, epoch, seq0, txn = producer
                seq = (seq0 + offset - first) % SEQ_MOD
            ts = ts0 + draw(st.integers(-(2**40), 2**40))
            out.append(stored(offset, draw(maybe_bytes), draw(maybe_bytes), draw(headers_st), ts, pid, epoch, seq, txn))
            offset += 1 + draw(st.integers(0, 3) | st.just(2**30))
        if producer is not None and producer[3] and draw(st.booleans()):
            pid, epoch, _, _ = producer
            out.append(stored(offset, None, None, None, ts0, pid, epoch, None, True, draw(st.sampled_from([0, 1]))))
            offset += 1
    return out


# --- encode → decode ----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(runs())
def test_round_trip(records):
    data = encode_records(records)
    batches = decode_batches(data)
    data_records = [r for r in records if r.control_type is None]
    assert flatten([b for b in batches if not b.is_control]) == expected(data_records)
    markers = [(b.base_offset, b.control_type, b.producer_id, b.producer_epoch) for b in batches if b.is_control]
    assert markers == [(r.offset, r.control_type, r.producer_id, r.producer_epoch) for r in records if r.control_type is not None]
    for b in batches:
        assert b.magic == 2 and b.partition_leader_epoch == 0 and b.compression == COMPRESSION_NONE
        assert not b.attributes & ATTR_LOG_APPEND_TIME  # CreateTime
        assert b.base_timestamp == b.records[0].timestamp_ms
        assert b.max_timestamp == max(r.timestamp_ms for r in b.records)
        assert b.last_offset_delta == b.records[-1].offset_delta
        assert b.is_transactional or not b.is_control


def test_round_trip_keeps_headers_exactly():
    headers = [("h", b"\x00\xff"), ("h", None), ("", b""), ("ünï", b"x" * 300), ("h", b"")]
    records = [stored(5, None, None, headers), stored(6, b"", b"", []), stored(7, b"\x00", None, None)]
    (batch,) = decode_batches(encode_records(records))
    assert [r.headers for r in batch.records] == [tuple(headers), (), ()]
    assert [(r.key, r.value) for r in batch.records] == [(None, None), (b"", b""), (b"\x00", None)]


def test_large_values_and_varints_of_every_width():
    values = [b"", b"a" * 63, b"a" * 64, b"a" * 8191, b"a" * 8192, b"a" * 1_100_000]
    records = [stored(2**40 + i, value=v, timestamp_ms=2**44 - i * 2**35) for i, v in enumerate(values)]
    (batch,) = decode_batches(encode_records(records))
    assert flatten([batch]) == expected(records)


def test_control_batch_layout():
    data = encode_control_batch(77, producer_id=5, producer_epoch=3, control_type=CONTROL_COMMIT, timestamp_ms=1234)
    (batch,) = decode_batches(data)
    assert batch.is_control and batch.is_transactional and batch.attributes == 0x30
    assert (batch.base_offset, batch.last_offset, batch.producer_id, batch.producer_epoch) == (77, 77, 5, 3)
    assert batch.base_sequence == -1 and batch.control_type == CONTROL_COMMIT
    (record,) = batch.records
    assert record.key == b"\x00\x00\x00\x01"  # version 0, type 1
    assert record.value == b"\x00\x00\x00\x00\x00\x00"  # version 0, coordinator epoch 0
    assert record.timestamp_ms == 1234 and record.headers == ()
    assert kafka_python_read(data) == [("control", 77, 1234, CONTROL_COMMIT, 5, 3)]
    with pytest.raises(ValueError):
        encode_control_batch(1, 1, 1, 7, 0)


def test_markers_from_stored_records_are_batches_of_their_own():
    records = [
        stored(10, producer_id=1, producer_epoch=0, sequence=0, is_transactional=True),
        stored(11, None, None, None, 99, 1, 0, None, True, CONTROL_ABORT),
        stored(12, None, None, None, 98, 1, 0, None, True, CONTROL_COMMIT),
    ]
    batches = decode_batches(encode_records(records))
    assert [(b.base_offset, b.is_control, b.control_type) for b in batches] == [(10, False, None), (11, True, 0), (12, True, 1)]
    assert kafka_python_read(encode_records(records))[1:] == [("control", 11, 99, 0, 1, 0), ("control", 12, 98, 1, 1, 0)]


# --- where batches are cut -----------------------------------------------------------------------------


def cuts(records: list[StoredRecord]) -> list[list[int]]:
    return [[r.offset for r in run] for run in batch_runs(records)]


def test_batch_runs_cut_where_a_batch_attribute_changes():
    p = dict(producer_id=1, producer_epoch=0, is_transactional=False)
    records = [
        stored(0),
        stored(1),
        stored(5),  # no producer: gaps are fine
        stored(6, **p, sequence=0),
        stored(7, **p, sequence=1),
        stored(8, producer_id=2, producer_epoch=0, sequence=2),  # another producer
        stored(9, producer_id=2, producer_epoch=1, sequence=3),  # another epoch
        stored(10, producer_id=2, producer_epoch=1, sequence=4, is_transactional=True),  # transactional now
        stored(11, None, None, None, 0, 2, 1, None, True, CONTROL_COMMIT),
        stored(12, None, None, None, 0, 2, 1, None, True, CONTROL_COMMIT),
        stored(13, producer_id=2, producer_epoch=1, sequence=5),
    ]
    assert cuts(records) == [[0, 1, 5], [6, 7], [8], [9], [10], [11], [12], [13]]


def test_batch_runs_keep_sequences_following_offsets():
    p = dict(producer_id=1, producer_epoch=0)
    gap_followed = [stored(0, **p, sequence=5), stored(3, **p, sequence=8)]
    gap_not_followed = [stored(0, **p, sequence=5), stored(3, **p, sequence=6)]
    wrap = [stored(0, **p, sequence=SEQ_MOD - 1), stored(1, **p, sequence=0)]
    lost_sequence = [stored(0, **p, sequence=5), stored(1, **p, sequence=None)]
    gained_sequence = [stored(0, **p, sequence=None), stored(1, **p, sequence=3)]
    assert cuts(gap_followed) == [[0, 3]]
    assert cuts(gap_not_followed) == [[0], [3]]
    assert cuts(wrap) == [[0, 1]]
    assert cuts(lost_sequence) == [[0], [1]]
    assert cuts(gained_sequence) == [[0], [1]]
    (batch,) = decode_batches(encode_records(wrap))
    assert flatten([batch]) == expected(wrap)


def test_batch_runs_cut_where_offsets_do_not_fit_one_batch():
    far = [stored(0), stored(INT32_MAX), stored(INT32_MAX + 1)]
    assert cuts(far) == [[0, INT32_MAX], [INT32_MAX + 1]]
    assert cuts([stored(3), stored(3), stored(2)]) == [[3], [3], [2]]
    assert flatten(decode_batches(encode_records(far))) == expected(far)
    with pytest.raises(ValueError):
        encode_batch(0, [stored(0), stored(INT32_MAX + 1)])


# --- kafka-python as the other side ---------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(runs(max_records=5))
def test_kafka_python_reads_our_batches(records):
    data = encode_records(records)
    theirs = kafka_python_read(data)
    ours = [
        ("control", r.offset, r.timestamp_ms, r.control_type, r.producer_id, r.producer_epoch)
        if r.control_type is not None
        else e
        for r, e in zip(records, expected(records))
    ]
    assert theirs == ours


@pytest.fixture(scope="module")
def kafka_python_codecs() -> Iterator[None]:
    """kafka-python's snappy (its own xerial framing), lz4 and zstd writers, compressing with cramjam."""

    class Zstd:
        class ZstdCompressor:
            def compress(self, payload: bytes) -> bytes:
                return bytes(cramjam.zstd.compress(bytes(payload)))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kafka.codec, "snappy", types.SimpleNamespace(compress=lambda b: bytes(cramjam.snappy.compress_raw(bytes(b)))))
        mp.setattr(kafka.codec, "lz4", types.SimpleNamespace())
        mp.setattr(kafka_default_records, "lz4_encode", lambda b: bytes(cramjam.lz4.compress(bytes(b))))
        mp.setattr(kafka.codec, "zstd", Zstd)
        yield


def kafka_python_batch(codec: int, items, producer=(-1, -1, -1, False)) -> bytes:  # type: ignore[no-untyped-def]
    builder = DefaultRecordBatchBuilder(2, codec, producer[3], producer[0], producer[1], producer[2], batch_size=2**30)
    for i, (ts, key, value, headers) in enumerate(items):
        assert builder.append(i, ts, key, value, headers) is not None
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy-xerial", "lz4", "zstd"])
@pytest.mark.usefixtures("kafka_python_codecs")
def test_kafka_python_batches_with_every_codec(codec):
    # 100 KB of compressible values: several xerial blocks of 32 KiB, and worth compressing
    items = [
        (
            1_700_000_000_000 - i * 7,
            None if i % 5 == 0 else b"key-%d" % i,
            None if i % 7 == 0 else b"value %d " % i * 40,
            [("h", b"\x00\xff"), ("h", None)] if i % 3 == 0 else [],
        )
        for i in range(300)
    ]
    data = kafka_python_batch(codec, items, producer=(42, 3, 1000, True))
    (batch,) = decode_batches(data)
    assert batch.compression == codec
    if codec == COMPRESSION_SNAPPY:
        assert data[61:69] == b"\x82SNAPPY\x00"
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.is_transactional) == (42, 3, 1000, True)
    assert [(r.offset_delta, r.timestamp_ms, r.key, r.value, list(r.headers)) for r in batch.records] == [
        (i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(items)
    ]
    assert batch.max_timestamp == 1_700_000_000_000 and batch.last_offset_delta == 299


COMPRESSORS = {
    "gzip-stdlib": (COMPRESSION_GZIP, gzip.compress),
    "gzip-two-members": (COMPRESSION_GZIP, lambda b: gzip.compress(b[:100]) + gzip.compress(b[100:])),
    "snappy-raw": (COMPRESSION_SNAPPY, cramjam.snappy.compress_raw),  # librdkafka's
    "lz4-frame": (COMPRESSION_LZ4, cramjam.lz4.compress),
    "zstd-with-size": (COMPRESSION_ZSTD, cramjam.zstd.compress),
    "zstd-streamed": (COMPRESSION_ZSTD, lambda b: _zstd_streamed(b)),  # no content size, as Java's zstd-jni
}


def _zstd_streamed(b: bytes) -> bytes:
    c = cramjam.zstd.Compressor()
    c.compress(b)
    return bytes(c.finish())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(max_records=8), st.sampled_from(sorted(COMPRESSORS)))
def test_compressed_batches_decode_as_uncompressed(records, name):
    codec, compress = COMPRESSORS[name]
    plain = [encode_batch(run[0].offset, run) for run in batch_runs(records)]
    data = b"".join(recompress(b, codec, compress) for b in plain)
    batches = decode_batches(data)
    assert flatten(batches) == flatten(decode_batches(b"".join(plain)))
    assert {b.compression for b in batches} == {codec}


# --- hostile and broken input ---------------------------------------------------------------------


def good_batch() -> bytes:
    return encode_records(
        [stored(i, b"k", b"v" * i, [("h", None)], producer_id=1, producer_epoch=0, sequence=i) for i in range(3)]
    )


def test_empty_or_null_input_is_no_batch():
    assert decode_batches(b"") == [] and decode_batches(None) == []
    assert decode_batches(memoryview(good_batch())) == decode_batches(bytearray(good_batch()))


def test_bad_crc():
    data = bytearray(good_batch())
    data[-1] ^= 1
    assert code_of(bytes(data)) is ErrorCode.CORRUPT_MESSAGE
    data = bytearray(good_batch())
    data[17] ^= 1  # the CRC field itself
    assert code_of(bytes(data)) is ErrorCode.CORRUPT_MESSAGE


def test_bad_magic():
    data = bytearray(good_batch())
    for magic, code in [
        (0, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT),
        (1, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT),
        (3, ErrorCode.CORRUPT_MESSAGE),
        (-1, ErrorCode.CORRUPT_MESSAGE),
    ]:
        data[16] = magic & 0xFF
        assert code_of(bytes(data)) is code


def test_every_truncation_is_corrupt():
    data = good_batch() + good_batch()
    one = len(good_batch())
    for n in range(1, len(data)):
        if n != one:
            assert code_of(data[:n]) is ErrorCode.CORRUPT_MESSAGE, n
    assert len(decode_batches(data[:one])) == 1


def test_batch_length_that_lies():
    data = good_batch()
    length = struct.unpack_from(">i", data, 8)[0]
    for lie in (length + 1, length - 1, 48, 0, -1, 2**31 - 1):
        assert code_of(data[:8] + struct.pack(">i", lie) + data[12:]) is ErrorCode.CORRUPT_MESSAGE, lie


def test_records_that_lie():
    ok = raw_record(0, b"k", b"v")
    assert decode_batches(raw_batch(ok, 1))[0].records == (Record(0, 1_700_000_000_000, b"k", b"v", ()),)
    lies = {
        "record longer than the batch": raw_record(0, b"k", b"v", length_adjust=50),
        "record longer than its fields": raw_record(0, b"k", b"v", length_adjust=1) + b"\x00",
        "record shorter than its fields": raw_record(0, b"k", b"v", length_adjust=-1),
        "negative record length": zz(-5) + ok[1:],
        "key length -2": raw_record(0, None, b"v").replace(zz(-1), zz(-2), 1),
        "key longer than the record": zz(6) + b"\x00\x00\x00" + zz(100) + b"k\x00\x00",
        "header count -1": zz(6) + b"\x00\x00\x00\x01\x01" + zz(-1),
        "header count huge": zz(10) + b"\x00\x00\x00\x01\x01" + zz(2**31 - 1) + b"\x00\x00\x00",
        "header key length -1": raw_record(0, None, None, [(b"h", b"v")]).replace(zz(1) + b"h", zz(-1) + b"h", 1),
        "header value length -3": raw_record(0, None, None, [(b"h", b"v")]).replace(zz(1) + b"v", zz(-3) + b"v", 1),
        "varint of 6 bytes": zz(11) + b"\x00\x00" + b"\xff\xff\xff\xff\xff\x01" + b"\x01\x01\x00",
        "varint past 32 bits": zz(10) + b"\x00\x00" + b"\xff\xff\xff\xff\x7f" + b"\x01\x01\x00",
        "varlong of 11 bytes": zz(16) + b"\x00" + b"\xff" * 10 + b"\x01" + b"\x00\x01\x01\x00",
        "trailing bytes": ok + b"\x00",
    }
    for name, section in lies.items():
        assert code_of(raw_batch(section, 1)) is ErrorCode.CORRUPT_MESSAGE, name
    assert code_of(raw_batch(ok, 2)) is ErrorCode.CORRUPT_MESSAGE  # one record fewer than counted
    assert code_of(raw_batch(ok + ok, 1)) is ErrorCode.CORRUPT_MESSAGE  # one more


def test_header_key_not_utf8_is_invalid_record():
    assert code_of(raw_batch(raw_record(0, None, None, [(b"\xff", None)]), 1)) is ErrorCode.INVALID_RECORD


def test_record_counts():
    ok = raw_record(0, b"k", b"v")
    assert code_of(raw_batch(ok, -1)) is ErrorCode.CORRUPT_MESSAGE
    assert code_of(raw_batch(ok, 2**31 - 1)) is ErrorCode.RECORD_LIST_TOO_LARGE
    started = time.perf_counter()
    assert code_of(raw_batch(ok, 2**31 - 1), max_records=2**31) is ErrorCode.CORRUPT_MESSAGE
    assert time.perf_counter() - started < 1.0  # not a walk of 2**31 counted records (minutes)
    assert code_of(raw_batch(ok * 3, 3), max_records=2) is ErrorCode.RECORD_LIST_TOO_LARGE
    assert len(decode_batches(raw_batch(ok * 3, 3), max_records=3)[0].records) == 3
    assert decode_batches(raw_batch(b"", 0))[0].records == ()  # an empty batch (compaction makes them)


def test_unknown_compression_codec():
    for codec in (5, 6, 7):
        assert code_of(raw_batch(b"xyz", 1, attributes=codec)) is ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


def test_log_append_time_batch_gives_each_record_the_max_timestamp():
    section = raw_record(0, None, b"a", ts_delta=5) + raw_record(1, None, b"b", ts_delta=-5)
    (batch,) = decode_batches(raw_batch(section, 2, attributes=0x08, base_ts=100, max_ts=999))
    assert batch.attributes & ATTR_LOG_APPEND_TIME  # LogAppendTime
    assert [r.timestamp_ms for r in batch.records] == [999, 999]
    (batch,) = decode_batches(raw_batch(section, 2, base_ts=100, max_ts=999))
    assert [r.timestamp_ms for r in batch.records] == [105, 95]


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_damaged_compressed_data_is_corrupt(name):
    codec, compress = COMPRESSORS[name]
    section = b"".join(raw_record(i, b"k", b"value %d" % i * 20) for i in range(50))
    packed = bytes(compress(section))
    for damaged in (packed[: len(packed) // 2], packed[:-1], b"\x00" * 10 + packed[10:], packed + b"junk"):
        assert code_of(raw_batch(damaged, 50, attributes=codec)) is ErrorCode.CORRUPT_MESSAGE
    # right data, wrong record count
    assert code_of(raw_batch(packed, 51, attributes=codec)) is ErrorCode.CORRUPT_MESSAGE
    assert len(decode_batches(raw_batch(packed, 50, attributes=codec))[0].records) == 50


def test_xerial_snappy_framing_that_lies():
    block = bytes(cramjam.snappy.compress_raw(raw_record(0, b"k", b"v")))
    head = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    assert len(decode_batches(raw_batch(_xerial([block]), 1, attributes=2))[0].records) == 1
    record = raw_record(0, b"k", b"v")
    split = _xerial([bytes(cramjam.snappy.compress_raw(record[:3])), bytes(cramjam.snappy.compress_raw(record[3:]))])
    assert decode_batches(raw_batch(split, 1, attributes=2))[0].records[0].value == b"v"  # a record across blocks
    for section in (
        head[:12],
        head + b"\x00\x00",
        head + struct.pack(">i", len(block) + 1) + block,
        head + struct.pack(">i", -1) + block,
    ):
        assert code_of(raw_batch(section, 1, attributes=2)) is ErrorCode.CORRUPT_MESSAGE


def _zeros_bombs() -> dict[str, tuple[int, Callable[[], bytes]]]:
    """Zeros compressed cheaply, 1 GiB of them: one gzip member, or 1024 gzip members, lz4 or zstd
    frames of 1 MiB each; raw snappy declaring 100 MiB, and 80 xerial blocks of 1 MiB (snappy
    expands at most about 21 times, so its bombs are large)."""
    mib = bytes(MiB)
    return {
        "gzip-one-member": (1, lambda: _gzip_zeros(1 << 30)),
        "gzip-members": (1, lambda: gzip.compress(mib, 1) * 1024),
        "snappy-raw": (2, lambda: bytes(cramjam.snappy.compress_raw(bytes(100 * MiB)))),
        "snappy-xerial": (2, lambda: _xerial([bytes(cramjam.snappy.compress_raw(mib))] * 80)),
        "lz4-frames": (3, lambda: bytes(cramjam.lz4.compress(mib)) * 1024),
        "zstd-frames": (4, lambda: bytes(cramjam.zstd.compress(mib)) * 1024),
        "zstd-streamed-frames": (4, lambda: _zstd_streamed(mib) * 1024),
    }


def _xerial(blocks: list[bytes]) -> bytes:
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)


def _gzip_zeros(n: int) -> bytes:
    """One gzip member of ``n`` zeros (a multiple of 1 MiB) without deflating them all: after a full
    flush a deflate block refers to nothing before it, so the block of 1 MiB repeats (the trailer's
    CRC is not the content's: decompression must stop long before it)."""
    co = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head = co.compress(bytes(MiB)) + co.flush(zlib.Z_FULL_FLUSH)
    block = co.compress(bytes(MiB)) + co.flush(zlib.Z_FULL_FLUSH)
    tail = co.flush()
    return head + block * (n // MiB - 1) + tail[:-4] + struct.pack("<I", n & 0xFFFFFFFF)


@pytest.mark.parametrize("name", sorted(_zeros_bombs()))
def test_decompression_bomb_is_refused_quickly_and_small(name):
    codec, make = _zeros_bombs()[name]
    data = raw_batch(make(), 1, attributes=codec)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        assert code_of(data) is ErrorCode.MESSAGE_TOO_LARGE
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 2.0
    # the budget's worth of output, plus the batch's copy that its CRC is computed on
    assert peak < DEFAULT_MAX_DECOMPRESSED_BYTES + len(data) + 4 * MiB
    assert code_of(data, max_decompressed_bytes=MiB // 2) is ErrorCode.MESSAGE_TOO_LARGE


def test_zstd_frame_declaring_more_than_the_budget_is_refused_unread():
    frame = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 1 << 40) + b"\x00" * 20
    assert code_of(raw_batch(frame, 1, attributes=4)) is ErrorCode.MESSAGE_TOO_LARGE


def test_decompressed_budget_is_shared_by_the_batches_of_one_call():
    section = raw_record(0, None, bytes(1000))
    one = raw_batch(bytes(cramjam.zstd.compress(section)), 1, attributes=4)
    assert len(decode_batches(one * 3, max_decompressed_bytes=3 * len(section))) == 3
    assert code_of(one * 3, max_decompressed_bytes=3 * len(section) - 1) is ErrorCode.MESSAGE_TOO_LARGE
    exactly = raw_batch(bytes(gzip.compress(section)), 1, attributes=1)
    assert len(decode_batches(exactly, max_decompressed_bytes=len(section))) == 1
    assert code_of(exactly, max_decompressed_bytes=len(section) - 1) is ErrorCode.MESSAGE_TOO_LARGE


def _decodes_or_txlog_error(data: bytes) -> None:
    try:
        batches = decode_batches(data, max_records=1000, max_decompressed_bytes=MiB)
    except TxlogError as exc:
        assert exc.code in {
            ErrorCode.CORRUPT_MESSAGE,
            ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            ErrorCode.RECORD_LIST_TOO_LARGE,
            ErrorCode.MESSAGE_TOO_LARGE,
            ErrorCode.INVALID_RECORD,
        }
        return
    for b in batches:
        for r in b.records:
            assert isinstance(r.key, (bytes, type(None))) and isinstance(r.value, (bytes, type(None)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_txlog_errors(data):
    _decodes_or_txlog_error(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(-3, 40), st.integers(0, 0x3F))
def test_random_records_sections_behind_a_valid_crc_raise_only_txlog_errors(section, count, attributes):
    _decodes_or_txlog_error(raw_batch(section, count, attributes=attributes))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_batches_behind_a_valid_crc_raise_only_txlog_errors(data):
    name = data.draw(st.sampled_from([None, *sorted(COMPRESSORS)]))
    section = b"".join(raw_record(i, b"k%d" % i, b"v" * i, [(b"h", None), (b"h", b"x")]) for i in range(4))
    if name is not None:
        codec, compress = COMPRESSORS[name]
        section = bytes(compress(section))
    else:
        codec = 0
    mutated = bytearray(section)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = data.draw(st.integers(0, 255))
    _decodes_or_txlog_error(raw_batch(bytes(mutated), 4, attributes=codec))


# --- produce ----------------------------------------------------------------------------------------


def produced(records: list[StoredRecord], **kwargs):  # type: ignore[no-untyped-def]
    (batch,) = decode_batches(encode_records(records))
    return produce_request(batch, **kwargs)


def test_produce_request_plain():
    records = [stored(i, b"k", b"v", [("h", b"1"), ("h", None)], 1000 + i) for i in range(3)]
    req = produced(records, transactional_id="ignored", principal="alice")
    assert req.records == [NewRecord(b"k", b"v", (("h", b"1"), ("h", None)), 1000 + i) for i in range(3)]
    assert (req.producer_id, req.producer_epoch, req.base_sequence, req.transactional_id, req.principal) == (
        None,
        None,
        None,
        None,
        "alice",
    )


def test_produce_request_idempotent_and_transactional():
    idem = [stored(i, producer_id=7, producer_epoch=2, sequence=10 + i) for i in range(2)]
    req = produced(idem, transactional_id="t")
    assert (req.producer_id, req.producer_epoch, req.base_sequence, req.transactional_id) == (7, 2, 10, None)
    txn = [stored(i, producer_id=7, producer_epoch=2, sequence=10 + i, is_transactional=True) for i in range(2)]
    req = produced(txn, transactional_id="t")
    assert (req.producer_id, req.producer_epoch, req.base_sequence, req.transactional_id) == (7, 2, 10, "t")
    assert not req.require_added
    assert produced(txn, transactional_id="t", require_added=True).require_added
    assert not produced(idem, transactional_id="t", require_added=True).require_added
    with pytest.raises(TxlogError) as info:
        produced(txn)
    assert info.value.code is ErrorCode.INVALID_REQUEST


def test_produce_request_timestamps():
    section = raw_record(0, None, b"a") + raw_record(1, None, b"b", ts_delta=1)
    (batch,) = decode_batches(raw_batch(section, 2, base_ts=-1))
    assert [r.timestamp_ms for r in produce_request(batch).records] == [None, 0]
    (batch,) = decode_batches(raw_batch(section, 2, attributes=0x08, base_ts=5, max_ts=6))
    assert [r.timestamp_ms for r in produce_request(batch).records] == [None, None]


@pytest.mark.parametrize(
    "batch_bytes, code",
    [
        (encode_control_batch(0, 1, 0, CONTROL_COMMIT, 0), ErrorCode.INVALID_RECORD),
        (raw_batch(b"", 0), ErrorCode.INVALID_RECORD),
        (raw_batch(raw_record(1, None, b"a"), 1, last_offset_delta=1), ErrorCode.INVALID_RECORD),
        (raw_batch(raw_record(0, None, b"a") + raw_record(0, None, b"b"), 2), ErrorCode.INVALID_RECORD),
        (raw_batch(raw_record(0, None, b"a") + raw_record(1, None, b"b"), 2, last_offset_delta=5), ErrorCode.INVALID_RECORD),
        (raw_batch(raw_record(0, None, b"a"), 1, attributes=0x10), ErrorCode.INVALID_RECORD),  # transactional, no producer
        (raw_batch(raw_record(0, None, b"a"), 1, producer_id=3, producer_epoch=0), ErrorCode.INVALID_RECORD),  # no sequence
        (raw_batch(raw_record(0, None, b"a"), 1, producer_id=-2), ErrorCode.INVALID_RECORD),
        (raw_batch(raw_record(0, None, b"a", [(b"h\x00", None)]), 1), ErrorCode.INVALID_RECORD),  # PostgreSQL text has no NUL
    ],
    ids=[
        "control",
        "empty",
        "offset-delta-1",
        "repeated-delta",
        "last-delta",
        "txn-without-pid",
        "pid-without-seq",
        "pid-negative",
        "header-key-nul",
    ],
)
def test_produce_request_refuses_what_a_client_may_not_send(batch_bytes, code):
    (batch,) = decode_batches(batch_bytes)
    with pytest.raises(TxlogError) as info:
        produce_request(batch, transactional_id="t")
    assert info.value.code is code
