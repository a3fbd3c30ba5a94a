"""The C part (app/_native.c) against the Python definitions it accelerates: the same bytes, the
same records, and where the input is anything but the plain case, None, so that the definition
answers (and raises its exact error)."""

from __future__ import annotations

import contextlib
import struct
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.errors import TxlogError
from app.native import native
from app.storage import arrays
from app.wire.kafka.records import encode
from app.wire.kafka.records.batch import HEADER_SIZE, Record
from app.wire.kafka.records.decode import _read_records
from app.wire.kafka.records.encode import batch_runs, encode_batch
from tests.kafka.test_records import raw_record, runs, stored, zz


def test_the_c_part_is_built() -> None:
    assert native is not None, (
        "app._native was not built: install a C compiler and Python's headers (scripts/system-deps.sh) "
        "and reinstall (make install)"
    )


@contextlib.contextmanager
def python_only(*modules: Any) -> Iterator[None]:
    """The Python definitions alone, as without the C part."""
    saved = [m.native for m in modules]
    for m in modules:
        m.native = None
    try:
        yield
    finally:
        for m, n in zip(modules, saved):
            m.native = n


# --- reading ------------------------------------------------------------------------------------


def _python_read(section: bytes, count: int, base_ts: int, log_append_ts: int | None) -> Any:
    try:
        return _read_records(section, 0, count, base_ts, log_append_ts, "batch")
    except TxlogError as exc:
        return exc.code


def _same_reading(section: bytes, count: int, base_ts: int = 1_700_000_000_000, log_append_ts: int | None = None) -> None:
    assert native is not None
    expected = _python_read(section, count, base_ts, log_append_ts)
    got = native.read_records(section, 0, count, base_ts, log_append_ts, Record)
    if isinstance(expected, tuple):
        assert got == expected
        assert all(type(r) is Record for r in got)
    else:
        assert got is None, expected  # refused by the definition: left to it


def _section(records: list) -> tuple[bytes, int]:
    """The records section of the first data run's batch, and its record count."""
    run = next(r for r in batch_runs(records) if r[0].control_type is None)
    batch = encode_batch(run[0].offset, run)
    return batch[HEADER_SIZE:], len(run)


@settings(max_examples=150, deadline=None)
@given(runs(), st.none() | st.integers(0, 2**45))
def test_read_records_as_defined(records, log_append_ts) -> None:  # type: ignore[no-untyped-def]
    if all(r.control_type is not None for r in records):
        return
    section, count = _section(records)
    _same_reading(section, count, records[0].timestamp_ms, log_append_ts)


@settings(max_examples=300, deadline=None)
@given(runs(max_records=4), st.data())
def test_read_records_of_damaged_sections(records, data) -> None:  # type: ignore[no-untyped-def]
    """Bytes flipped, cut or added anywhere: the C part reads exactly what the definition reads,
    and nothing the definition refuses."""
    if all(r.control_type is not None for r in records):
        return
    section, count = _section(records)
    damaged = bytearray(section)
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["flip", "cut", "add"]))
        at = data.draw(st.integers(0, max(len(damaged) - 1, 0)))
        if action == "flip" and damaged:
            damaged[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del damaged[at : at + data.draw(st.integers(1, 4))]
        else:
            damaged[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    _same_reading(bytes(damaged), data.draw(st.sampled_from([count, count - 1, count + 1, 0])))


def test_read_records_of_every_lie() -> None:
    ok = raw_record(0, b"k", b"v")
    for section, count in [
        (raw_record(0, b"k", b"v", length_adjust=50), 1),
        (raw_record(0, b"k", b"v", length_adjust=-1), 1),
        (zz(-5) + ok[1:], 1),
        (raw_record(0, None, b"v").replace(zz(-1), zz(-2), 1), 1),
        (zz(6) + b"\x00\x00\x00" + zz(100) + b"k\x00\x00", 1),
        (zz(10) + b"\x00\x00\x00\x01\x01" + zz(2**31 - 1) + b"\x00\x00\x00", 1),
        (zz(11) + b"\x00\x00" + b"\xff\xff\xff\xff\xff\x01" + b"\x01\x01\x00", 1),
        (zz(10) + b"\x00\x00" + b"\xff\xff\xff\xff\x7f" + b"\x01\x01\x00", 1),
        (zz(16) + b"\x00" + b"\xff" * 10 + b"\x01" + b"\x00\x01\x01\x00", 1),
        (zz(15) + b"\x00" + b"\xff" * 9 + b"\x7f" + b"\x00\x01\x01\x00", 1),  # a varlong past 64 bits
        (zz(15) + b"\x00" + b"\xff" * 9 + b"\x01" + b"\x00\x01\x01\x00", 1),  # the largest varlong: read
        (raw_record(0, None, None, [(b"\xff", None)]), 1),  # header key not UTF-8
        (raw_record(0, None, None, [(b"\xed\xa0\x80", None)]), 1),  # a surrogate in UTF-8: not UTF-8
        (ok + b"\x00", 1),
        (ok, 2),
        (ok + ok, 1),
        (b"", 0),
        (raw_record(3, b"", None, [(b"a", b""), (b"a", None)], ts_delta=-(2**40)), 1),
    ]:
        _same_reading(section, count)
    _same_reading(ok, 1, base_ts=2**63 - 1)  # a timestamp past int64: the definition's big int
    _same_reading(raw_record(0, b"k", b"v", ts_delta=5), 1, log_append_ts=42)


# --- writing ------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(runs())
def test_encode_batch_as_defined(records) -> None:  # type: ignore[no-untyped-def]
    for run in batch_runs(records):
        fast = encode_batch(run[0].offset, run)
        with python_only(encode):
            assert fast == encode_batch(run[0].offset, run)


def test_encode_batch_beyond_the_plain_case() -> None:
    many = [(f"h{i}", bytes([i])) for i in range(20)]  # more headers than the C part keeps on its stack
    cases = [
        [stored(0, b"k", b"v", many), stored(1, None, None, [("ü", None)])],
        [stored(0, b"k", b"v" * 70_000), stored(5, b"", b"")],  # gaps and long values
        [stored(0, b"k", b"v", timestamp_ms=-(2**63)), stored(1, timestamp_ms=2**62)],  # deltas past int64
        [stored(0, bytearray(b"k"), b"v")],  # not bytes: the definition's
        [stored(2**63 - 1)],
    ]
    for run in cases:
        with python_only(encode):
            try:
                expected: Any = encode_batch(run[0].offset, run)
            except Exception as exc:  # noqa: BLE001 - compared below
                expected = type(exc)
        try:
            got: Any = encode_batch(run[0].offset, run)
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        assert got == expected


@settings(max_examples=200, deadline=None)
@given(runs(), st.data())
def test_batch_runs_as_defined(records, data) -> None:  # type: ignore[no-untyped-def]
    """Runs cut where the definition cuts them, rows shuffled or with sequences off included."""
    if data.draw(st.booleans()):
        records = data.draw(st.permutations(records))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(records) - 1))
        wrong = data.draw(st.sampled_from([None, 0, 2**31 - 1, -1, 2**31]))
        records = [*records[:at], records[at]._replace(sequence=wrong), *records[at + 1 :]]
    fast = batch_runs(records)
    with python_only(encode):
        slow = batch_runs(records)
    assert fast == slow


def test_batch_runs_beyond_the_plain_case() -> None:
    cases = [
        [stored(2**63 - 1), stored(0)],  # offsets at the edges of int64
        [stored(0, producer_id=1, producer_epoch=0, sequence=2**63 - 1), stored(1, producer_id=1, producer_epoch=0, sequence=0)],
        [stored(0, producer_id=1, producer_epoch=0, sequence=2**31 - 1), stored(1, producer_id=1, producer_epoch=0, sequence=0)],
        [stored(0)._replace(offset=1.5), stored(1)],  # not an int: the definition's
        [stored(0), stored(1)[:5]],  # too short: the definition's (which fails)
    ]
    for rows in cases:
        with python_only(encode):
            try:
                expected: Any = batch_runs(rows)
            except Exception as exc:  # noqa: BLE001 - compared below
                expected = type(exc)
        try:
            got: Any = batch_runs(rows)
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        assert got == expected


# --- PostgreSQL's binary arrays -----------------------------------------------------------------


_INT8 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.none() | st.binary(max_size=50), max_size=30),
    st.lists(st.none() | st.text(max_size=8), max_size=30),
    st.lists(st.none() | st.integers(-(2**31), 2**31 - 1) | st.booleans(), max_size=30),
    st.lists(st.none() | _INT8, max_size=30),
)
def test_arrays_as_defined(raw, texts, int4s, int8s) -> None:  # type: ignore[no-untyped-def]
    texts = [t for t in texts if t is None or "\x00" not in t]
    fast = (arrays.bytea_array(raw), arrays.text_array(texts), arrays.int4_array(int4s), arrays.int8_array(int8s))
    with python_only(arrays):
        slow = (arrays.bytea_array(raw), arrays.text_array(texts), arrays.int4_array(int4s), arrays.int8_array(int8s))
    assert fast == slow
    assert [type(a) for a in fast] == [type(a) for a in slow]


def test_arrays_beyond_the_plain_case() -> None:
    with pytest.raises(struct.error):
        arrays.int4_array([1, 2**31])
    with pytest.raises(struct.error):
        arrays.int8_array([2**63])
    assert native is not None
    assert native.array(23, 4, [1.5]) is None and native.array(17, 0, [bytearray(b"x")]) is None
    assert native.array(23, 4, [2**31]) is None and native.array(20, 8, [2**63]) is None
    with python_only(arrays):
        assert arrays.bytea_array([bytearray(b"x")]) == arrays.bytea_array([b"x"])
