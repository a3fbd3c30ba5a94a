"""Plain rules about topics, records and fetch responses: no I/O."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Iterable, Literal, NamedTuple, Sequence

from app.errors import ErrorCode, TxlogError

# A Kafka STRING's length is an int16: at most this many characters (a transactional id, an ACL's
# resource name, a header key). Not the epoch's bound (``producer_state.MAX_EPOCH``), though the
# number is the same.
MAX_STRING_LENGTH = 32767

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000

Encoding = Literal["utf8", "base64"]
IsolationLevel = Literal["read_uncommitted", "read_committed"]

# Control record types, as Kafka's ControlRecordType.
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_NAMES = {CONTROL_ABORT: "ABORT", CONTROL_COMMIT: "COMMIT"}


def validate_topic_name(name: str) -> None:
    if name in (".", "..") or not TOPIC_NAME.fullmatch(name):  # fullmatch: "$" would accept a trailing newline
        raise TxlogError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name {name!r} is illegal: it must match [A-Za-z0-9._-]{{1,249}} and not be '.' or '..'",
        )


def validate_partition_count(n: int, max_partitions: int = MAX_PARTITIONS) -> None:
    """A topic has between 1 and ``max_partitions`` partitions (``TXLOG_MAX_PARTITIONS_PER_TOPIC``)."""
    if not 1 <= n <= max_partitions:
        raise TxlogError(ErrorCode.INVALID_PARTITIONS, f"Number of partitions must be between 1 and {max_partitions}, got {n}")


def decode_bytes(value: str | None, encoding: Encoding, what: str) -> bytes | None:
    if value is None:
        return None
    if encoding == "utf8":
        return value.encode("utf-8", errors="surrogatepass")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TxlogError(ErrorCode.INVALID_RECORD, f"{what} is not valid base64: {exc}") from None


def encode_bytes(value: bytes | None, encoding: Encoding) -> str | None:
    if value is None:
        return None
    if encoding == "utf8":
        return value.decode("utf-8", errors="replace")
    return base64.b64encode(value).decode("ascii")


# Kafka's record headers: an ordered list of (key, value) pairs; keys may repeat, values are bytes
# or null.
Header = tuple[str, "bytes | None"]
Headers = tuple[Header, ...]


class NewRecord(NamedTuple):
    """A record as a producer sends it, already decoded to bytes (a tuple: a batch makes many)."""

    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None

    def size(self) -> int:
        return record_size(self.key, self.value, self.headers)


def record_size(key: bytes | None, value: bytes | None, headers: Iterable[Header] | None) -> int:
    """Bytes a record counts for: against fetch ``max_bytes``, in the log's positions and for
    ``retention.bytes`` (key + value + header keys and values)."""
    n = len(key or b"") + len(value or b"")
    for k, v in headers or ():
        n += len(k.encode("utf-8", errors="surrogatepass")) + len(v or b"")
    return n


def record_sizes(records: Sequence[NewRecord]) -> list[int]:
    """``record_size`` of each record, in one pass."""
    return [record_size(k, v, h) if h else len(k or b"") + len(v or b"") for k, v, h, _ in records]


def headers_object(headers: Iterable[Header]) -> dict[str, str | None]:
    """The headers as one JSON object, as the HTTP API and ``txlog.committed_records.headers`` show
    them: the last value of each key, as UTF-8 text (null stays null; bytes that are not UTF-8, and
    NUL, which JSON in PostgreSQL cannot hold, read as U+FFFD). Lossy where the list has repeated
    keys or such bytes; the list itself is exact."""
    return {k: (None if v is None else v.decode("utf-8", errors="replace").replace("\x00", "\ufffd")) for k, v in headers}


def headers_from_object(obj: dict[str, str | None]) -> Headers:
    """The headers of the HTTP API's object form: values are text, sent as UTF-8."""
    return tuple((k, None if v is None else v.encode("utf-8", errors="surrogatepass")) for k, v in obj.items())


def valid_text(value: str, what: str) -> str:
    """Text stored as PostgreSQL text: no NUL characters, and valid Unicode (no lone surrogate)."""
    if "\x00" in value:
        raise TxlogError(ErrorCode.INVALID_RECORD, f"{what} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise TxlogError(ErrorCode.INVALID_RECORD, f"{what} is not valid Unicode (lone surrogate)") from None
    return value


def validate_headers(headers: Iterable[Header], where: str) -> None:
    for k, _ in headers:
        valid_text(k, f"{where}: a header key")


# A fetch reads at most this many offsets per record it may return (and at least
# FETCH_MIN_SCAN): enough that markers and aborted records rarely cut a page short, few enough
# that a fetch over a long aborted range or run of markers costs what its page costs.
FETCH_SCAN_PER_RECORD = 4
FETCH_MIN_SCAN = 1000


def fetch_scan_end(start: int, upper: int, max_records: int) -> int:
    """Where a fetch from ``start`` stops reading the log: ``upper`` (the high watermark or the last
    stable offset), or sooner when that is more than the request's window away. Offsets are dense,
    so the window bounds the rows read; a fetch that finds nothing to return in it still moves
    ``next_offset`` to its end."""
    return min(upper, start + max(FETCH_MIN_SCAN, FETCH_SCAN_PER_RECORD * (max_records + 1)))


def next_offset_after_fetch(returned_last_offset: int | None, upper: int, truncated: bool, start: int) -> int:
    """Where the next fetch starts. If the answer was cut short (records or bytes limit), right after
    the last record returned; otherwise everything below ``upper`` was examined (control records and
    aborted records included), so ``upper``."""
    if truncated:
        assert returned_last_offset is not None
        return returned_last_offset + 1
    return max(upper, start)


def take_within_limits(sizes: Iterable[int], max_records: int, max_bytes: int) -> tuple[int, bool]:
    """How many of the candidate records fit: at most ``max_records``, and no more than ``max_bytes``
    except that the first record is always returned (as Kafka does, so a consumer never stalls).
    Returns (count, truncated)."""
    count = 0
    total = 0
    for size in sizes:
        if count >= max_records:
            return count, True
        if count > 0 and total + size > max_bytes:
            return count, True
        total += size
        count += 1
    return count, False


def readable_end(high_watermark: int, last_stable_offset: int, isolation_level: IsolationLevel) -> int:
    """Where a reader's view of a partition ends: the last stable offset for read_committed (the
    first offset of the earliest open transaction), the high watermark for read_uncommitted."""
    return last_stable_offset if isolation_level == "read_committed" else high_watermark


# ListOffsets' special timestamps, as Kafka's ListOffsetsRequest: the offset a reader's view ends
# at, the log start, and the record with the largest timestamp (KIP-734). Any timestamp >= 0 asks
# for the first offset whose record's timestamp is at or after it. EARLIEST_LOCAL_TIMESTAMP is the
# log start too: the whole log is local here.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4


class ListedOffset(NamedTuple):
    offset: int
    timestamp_ms: int | None  # the record's, for a lookup by timestamp; None for the log's ends


def check_list_offsets_timestamp(timestamp: int) -> None:
    if timestamp < EARLIEST_LOCAL_TIMESTAMP:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown ListOffsets timestamp {timestamp}")


def listed_offset(timestamp: int, log_start_offset: int, end: int, found: tuple[int, int] | None) -> ListedOffset | None:
    """Kafka's answer to ListOffsets for one partition: the log start for EARLIEST, ``end`` (the
    reader's ``readable_end``) for LATEST; for a timestamp or MAX_TIMESTAMP, the record ``found``
    — (offset, timestamp) — unless there is none or the reader may not see it yet (at or past
    ``end``), when there is no answer (Kafka's offset -1)."""
    check_list_offsets_timestamp(timestamp)
    if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
        return ListedOffset(log_start_offset, None)
    if timestamp == LATEST_TIMESTAMP:
        return ListedOffset(end, None)
    if found is None or found[0] >= end:
        return None
    return ListedOffset(found[0], found[1])
