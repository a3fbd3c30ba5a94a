"""Plain rules about topics, records and fetch responses: no I/O."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Iterable, Literal

from app.errors import ErrorCode, TxlogError

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


def validate_partition_count(n: int) -> None:
    if not 1 <= n <= MAX_PARTITIONS:
        raise TxlogError(ErrorCode.INVALID_PARTITIONS, f"Number of partitions must be between 1 and {MAX_PARTITIONS}, got {n}")


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


@dataclass(frozen=True)
class NewRecord:
    """A record as a producer sends it, already decoded to bytes."""

    key: bytes | None
    value: bytes | None
    headers: dict[str, str]
    timestamp_ms: int | None

    def size(self) -> int:
        return record_size(self.key, self.value, self.headers)


def record_size(key: bytes | None, value: bytes | None, headers: dict[str, str] | None) -> int:
    """Bytes a record counts for against fetch ``max_bytes`` (key + value + headers)."""
    n = len(key or b"") + len(value or b"")
    for k, v in (headers or {}).items():
        n += len(k.encode()) + len((v or "").encode())
    return n


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
