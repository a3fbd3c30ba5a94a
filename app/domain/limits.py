"""The server's limits as plain rules: what a batch of records, a topic, a transaction and a
long-polling fetch may be at most, and the Kafka-named error for each. No I/O: the services apply
them where records, topics and transactions come in, whatever the way in.

| limit | setting | error |
| --- | --- | --- |
| records in one batch | ``max_batch_records`` | RECORD_LIST_TOO_LARGE |
| a record's key / value / headers | ``max_key_bytes`` / ``max_value_bytes`` / ``max_header_bytes`` | MESSAGE_TOO_LARGE |
| partitions of a topic | ``max_partitions_per_topic`` | INVALID_PARTITIONS (``records.validate_partition_count``) |
| partitions in one transaction | ``max_partitions_per_transaction`` | POLICY_VIOLATION |
| open transactions one principal started | ``max_open_transactions_per_principal`` | THROTTLING_QUOTA_EXCEEDED (retriable) |
| a fetch's wait, long polls waiting at once | ``max_fetch_wait_ms``, ``max_long_polls`` | none: the wait is shortened |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from app.domain.records import Header, NewRecord, record_size, record_sizes
from app.errors import ErrorCode, TxlogError


class RecordLimitSettings(Protocol):
    """The settings ``RecordLimits`` are read from (``app.config.Settings``)."""

    max_batch_records: int
    max_key_bytes: int
    max_value_bytes: int
    max_header_bytes: int


@dataclass(frozen=True)
class RecordLimits:
    """What one batch and each of its records may be at most (their defaults are the settings':
    ``app.config.Settings``)."""

    max_batch_records: int
    max_key_bytes: int
    max_value_bytes: int
    max_header_bytes: int

    @classmethod
    def from_settings(cls, settings: RecordLimitSettings) -> "RecordLimits":
        return cls(settings.max_batch_records, settings.max_key_bytes, settings.max_value_bytes, settings.max_header_bytes)


def checked_record_sizes(records: Sequence[NewRecord], limits: RecordLimits) -> list[int]:
    """The size of each record of a batch (``record_size``), once the batch is within ``limits``:
    RECORD_LIST_TOO_LARGE for too many records, MESSAGE_TOO_LARGE naming the first record whose
    key, value or headers are too large. A record no larger in all than the smallest of the
    per-record limits cannot break any of them, so a batch without such a record costs one ``max``
    more."""
    if len(records) > limits.max_batch_records:
        raise TxlogError(
            ErrorCode.RECORD_LIST_TOO_LARGE,
            f"The batch has {len(records)} records; at most {limits.max_batch_records} are accepted in one batch",
        )
    sizes = record_sizes(records)
    if sizes and max(sizes) > min(limits.max_key_bytes, limits.max_value_bytes, limits.max_header_bytes):
        for i, r in enumerate(records):
            check_record(r.key, r.value, r.headers, limits, f"record {i}")
    return sizes


def check_record(
    key: bytes | None, value: bytes | None, headers: Iterable[Header] | None, limits: RecordLimits, what: str = "the record"
) -> None:
    """MESSAGE_TOO_LARGE when the record's key, value or headers (keys and values together) are
    larger than their limit."""
    for part, size, limit in (
        ("key", len(key or b""), limits.max_key_bytes),
        ("value", len(value or b""), limits.max_value_bytes),
        ("headers", record_size(None, None, headers), limits.max_header_bytes),
    ):
        if size > limit:
            raise TxlogError(ErrorCode.MESSAGE_TOO_LARGE, f"The {part} of {what}: {size} bytes, more than the {limit} accepted")


def check_partitions_added(adding: int, max_partitions: int) -> None:
    """An AddPartitionsToTxn naming more partitions than any transaction may have is refused before
    anything is read (POLICY_VIOLATION); the transaction's own count is checked as the partitions
    join it (``partitions_per_transaction_exceeded``)."""
    if adding > max_partitions:
        raise partitions_per_transaction_exceeded(adding, 0, max_partitions)


def partitions_per_transaction_exceeded(adding: int, in_transaction: int, max_partitions: int) -> TxlogError:
    return TxlogError(
        ErrorCode.POLICY_VIOLATION,
        f"A transaction may have at most {max_partitions} partitions: it has {in_transaction}, "
        f"and {adding} more would join it. Commit or abort it and go on in a new one",
        limit="max_partitions_per_transaction",
    )


def open_transactions_exceeded(principal: str, open_now: int, max_open: int) -> TxlogError:
    return TxlogError(
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
        f"Principal {principal!r} has {open_now} open transactions, the most it may have at once "
        f"({max_open}); start this one once another ends (retriable)",
        limit="max_open_transactions_per_principal",
    )


def long_poll_wait_ms(requested_ms: int, max_wait_ms: int, waiting: int, max_waiting: int) -> int:
    """How long a fetch may wait for records: what it asked, at most ``max_wait_ms`` (as a broker
    bounds a consumer's fetch.max.wait.ms), and not at all when ``max_waiting`` fetches already
    wait in this process — it is answered at once with what there is, which a consumer takes as an
    empty fetch and polls again."""
    if waiting >= max_waiting:
        return 0
    return max(0, min(requested_ms, max_wait_ms))
