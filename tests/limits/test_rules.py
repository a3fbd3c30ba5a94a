"""The limits as plain rules, without a database."""

from __future__ import annotations

import pytest

from app.config import Settings
from app.domain.limits import (
    RecordLimits,
    check_partitions_added,
    check_record,
    checked_record_sizes,
    long_poll_wait_ms,
    open_transactions_exceeded,
    partitions_per_transaction_exceeded,
)
from app.domain.records import NewRecord, validate_partition_count
from app.errors import ErrorCode, TxlogError

SMALL = RecordLimits(max_batch_records=3, max_key_bytes=4, max_value_bytes=8, max_header_bytes=6)


def code(fn, *args) -> ErrorCode:  # type: ignore[no-untyped-def]
    with pytest.raises(TxlogError) as info:
        fn(*args)
    return info.value.code


def test_a_batch_within_the_limits_answers_the_sizes_of_its_records() -> None:
    records = [NewRecord(b"k", b"v"), NewRecord(b"kkkk", b"vvvvvvvv", (("h", b"12345"),)), NewRecord(None, None)]
    assert checked_record_sizes(records, SMALL) == [2, 18, 0]


def test_too_many_records_is_record_list_too_large() -> None:
    assert code(checked_record_sizes, [NewRecord(b"k", b"v")] * 4, SMALL) is ErrorCode.RECORD_LIST_TOO_LARGE


@pytest.mark.parametrize(
    "record, part",
    [
        (NewRecord(b"kkkkk", b"v"), "key"),
        (NewRecord(b"k", b"v" * 9), "value"),
        (NewRecord(b"k", b"v", (("hh", b"12345"),)), "headers"),  # 2 + 5 bytes
        (NewRecord(b"k", b"v", (("h", b"123"), ("h", b"45"))), "headers"),  # all the headers together
        (NewRecord(b"k", b"v", (("\u00e9\u00e9\u00e9\u00e9", None),)), "headers"),  # keys count as UTF-8
    ],
)
def test_a_part_of_a_record_too_large_is_message_too_large_naming_it(record: NewRecord, part: str) -> None:
    with pytest.raises(TxlogError) as info:
        checked_record_sizes([NewRecord(b"k", b"v"), record], SMALL)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert f"The {part} of record 1: " in info.value.message


def test_parts_at_their_limits_pass() -> None:
    record = NewRecord(b"kkkk", b"v" * 8, (("hh", b"1234"),))
    check_record(record.key, record.value, record.headers, SMALL)
    assert checked_record_sizes([record] * 3, SMALL) == [18, 18, 18]


def test_record_limits_from_settings() -> None:
    s = Settings(max_batch_records=7, max_key_bytes=1, max_value_bytes=2, max_header_bytes=3)
    assert RecordLimits.from_settings(s) == RecordLimits(7, 1, 2, 3)


@pytest.mark.parametrize("n, ok", [(0, False), (1, True), (4, True), (5, False)])
def test_partitions_per_topic(n: int, ok: bool) -> None:
    if ok:
        validate_partition_count(n, 4)
    else:
        assert code(validate_partition_count, n, 4) is ErrorCode.INVALID_PARTITIONS


def test_partitions_per_transaction() -> None:
    check_partitions_added(2, 2)
    assert code(check_partitions_added, 3, 2) is ErrorCode.POLICY_VIOLATION
    err = partitions_per_transaction_exceeded(2, 1, 2)
    assert err.code is ErrorCode.POLICY_VIOLATION and not err.code.retriable
    assert err.details == {"limit": "max_partitions_per_transaction"}


def test_open_transactions_per_principal_is_a_retriable_quota() -> None:
    err = open_transactions_exceeded("alice", 3, 3)
    assert err.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert err.code.kafka_code == 89 and err.code.retriable and err.code.http_status == 429
    assert "'alice'" in err.message


@pytest.mark.parametrize(
    "requested, max_wait, waiting, max_waiting, expected",
    [
        (500, 60_000, 0, 10, 500),  # as asked
        (2**31 - 1, 60_000, 0, 10, 60_000),  # shortened to the bound
        (500, 0, 0, 10, 0),  # long polls off
        (500, 60_000, 9, 10, 500),
        (500, 60_000, 10, 10, 0),  # this process has as many waiting as it takes: answer at once
        (500, 60_000, 0, 0, 0),
        (0, 60_000, 0, 10, 0),
    ],
)
def test_long_poll_wait(requested: int, max_wait: int, waiting: int, max_waiting: int, expected: int) -> None:
    assert long_poll_wait_ms(requested, max_wait, waiting, max_waiting) == expected


def test_the_fetch_wait_bound_cannot_outlast_the_listeners_lease() -> None:
    with pytest.raises(ValueError):
        Settings(max_fetch_wait_ms=60_001)
