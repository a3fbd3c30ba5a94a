"""Rows of the log as ``StoredRecord``s: made without a Python call per row, exactly as
``StoredRecord._make`` would make them, and a record's size as ``records.record_size`` counts it."""

from __future__ import annotations

import pytest

from app.domain.log import StoredRecord
from app.domain.records import record_size
from app.storage import log as log_store


def _row(offset: int, key: bytes | None, value: bytes | None, header_keys=None, header_values=None) -> tuple:  # type: ignore[no-untyped-def]
    return (
        offset,
        key,
        value,
        header_keys,
        header_values,
        1_700_000_000_000 + offset,
        7,
        0,
        offset,
        False,
        None,
        10 * offset,
        None,
        False,
    )


ROWS = [
    _row(0, b"k", b"value"),
    _row(1, None, b"v"),
    _row(2, b"k", None),
    _row(3, None, None),
    _row(4, b"k", b"v", ["h", "\u00e9t\u00e9"], [b"x", None]),
    _row(5, b"", b"", [], []),
]


def test_rows_become_the_records_make_would_make():  # type: ignore[no-untyped-def]
    made = log_store._stored(ROWS)
    assert made == [StoredRecord._make(r) for r in ROWS]
    assert all(type(r) is StoredRecord for r in made)
    assert [r.offset for r in made] == [0, 1, 2, 3, 4, 5] and made[4].headers == (("h", b"x"), ("\u00e9t\u00e9", None))
    assert log_store._stored([]) == []


def test_a_row_of_another_width_is_refused():  # type: ignore[no-untyped-def]
    with pytest.raises(TypeError, match="13 columns, not 14"):
        log_store._stored([_row(0, b"k", b"v")[:-1]])


@pytest.mark.parametrize("row", ROWS)
def test_a_records_size_is_the_one_definition(row):  # type: ignore[no-untyped-def]
    r = StoredRecord._make(row)
    assert r.size == record_size(r.key, r.value, r.headers)
