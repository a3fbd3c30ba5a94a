"""ListOffsets' answer for one partition and the end of a reader's view (app.domain.records)."""

from __future__ import annotations

import pytest

from app.domain.records import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    ListedOffset,
    listed_offset,
    readable_end,
)
from app.errors import ErrorCode, TxlogError


def test_a_reader_sees_to_the_last_stable_offset_or_the_high_watermark():
    assert readable_end(10, 4, "read_committed") == 4
    assert readable_end(10, 4, "read_uncommitted") == 10


@pytest.mark.parametrize("spec", [EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP])
def test_earliest_is_the_log_start_whatever_was_found(spec):
    assert listed_offset(spec, 3, 9, None) == ListedOffset(3, None)
    assert listed_offset(spec, 3, 9, (5, 100)) == ListedOffset(3, None)


def test_latest_is_the_readers_end():
    assert listed_offset(LATEST_TIMESTAMP, 3, 9, None) == ListedOffset(9, None)


@pytest.mark.parametrize("spec", [0, 1_700_000_000_000, MAX_TIMESTAMP])
def test_a_found_record_is_the_answer_while_the_reader_may_see_it(spec):
    assert listed_offset(spec, 0, 9, (8, 42)) == ListedOffset(8, 42)
    assert listed_offset(spec, 0, 9, (9, 42)) is None  # at the reader's end: not yet
    assert listed_offset(spec, 0, 9, None) is None


def test_an_unknown_special_timestamp_is_an_invalid_request():
    with pytest.raises(TxlogError) as info:
        listed_offset(-5, 0, 9, None)
    assert info.value.code is ErrorCode.INVALID_REQUEST
