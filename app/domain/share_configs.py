"""A share group's configs (Kafka's GROUP config resource, its share.* keys, KIP-932): their names,
defaults and the bounds Kafka's brokers hold them to, and what they decide for delivery.

Kafka's bounds are broker configs (group.share.min/max.*); here they are Kafka's defaults of those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from app.domain import share_groups
from app.domain.records import IsolationLevel
from app.domain.share_partition import (
    DEFAULT_DELIVERY_COUNT_LIMIT,
    DEFAULT_RECORD_LOCK_DURATION_MS,
    DeliveryConfig,
    OffsetReset,
    parse_offset_reset,
)
from app.errors import ErrorCode, TxlogError

AUTO_OFFSET_RESET = "share.auto.offset.reset"
ISOLATION_LEVEL = "share.isolation.level"
RECORD_LOCK_DURATION_MS = "share.record.lock.duration.ms"
DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
SESSION_TIMEOUT_MS = "share.session.timeout.ms"
HEARTBEAT_INTERVAL_MS = "share.heartbeat.interval.ms"

# Each key's default, as Kafka's DescribeConfigs shows it.
DEFAULTS: Mapping[str, str] = {
    AUTO_OFFSET_RESET: "latest",
    ISOLATION_LEVEL: "read_uncommitted",
    RECORD_LOCK_DURATION_MS: str(DEFAULT_RECORD_LOCK_DURATION_MS),
    DELIVERY_COUNT_LIMIT: str(DEFAULT_DELIVERY_COUNT_LIMIT),
    SESSION_TIMEOUT_MS: str(share_groups.SESSION_TIMEOUT_MS),
    HEARTBEAT_INTERVAL_MS: str(share_groups.HEARTBEAT_INTERVAL_MS),
}

# The integer keys' bounds (Kafka's group.share.min/max.record.lock.duration.ms,
# group.share.min/max.delivery.count.limit, group.share.min/max.session.timeout.ms,
# group.share.min/max.heartbeat.interval.ms); the membership's from the membership's rules.
BOUNDS: Mapping[str, tuple[int, int]] = {
    RECORD_LOCK_DURATION_MS: (15_000, 60_000),
    DELIVERY_COUNT_LIMIT: (2, 10),
    SESSION_TIMEOUT_MS: (share_groups.MIN_SESSION_TIMEOUT_MS, share_groups.MAX_SESSION_TIMEOUT_MS),
    HEARTBEAT_INTERVAL_MS: (share_groups.MIN_HEARTBEAT_INTERVAL_MS, share_groups.MAX_HEARTBEAT_INTERVAL_MS),
}


@dataclass(frozen=True)
class ShareConfigs:
    """What a share group's configs decide, every key given (defaults where none is set)."""

    auto_offset_reset: OffsetReset
    isolation_level: IsolationLevel
    delivery: DeliveryConfig
    session_timeout_ms: int
    heartbeat_interval_ms: int = share_groups.HEARTBEAT_INTERVAL_MS

    @property
    def membership(self) -> share_groups.ShareGroupConfig:
        """What the membership's rules read of these (``share_groups.heartbeat``)."""
        return share_groups.ShareGroupConfig(self.session_timeout_ms, self.heartbeat_interval_ms)


def _invalid(name: str, value: str, why: str) -> TxlogError:
    return TxlogError(ErrorCode.INVALID_CONFIG, f"Invalid value {value} for configuration {name}: {why}")


def validated(name: str, value: str, *, min_record_lock_duration_ms: int | None = None) -> str:
    """``value`` for ``name`` as stored, or INVALID_CONFIG as Kafka refuses it.
    ``min_record_lock_duration_ms`` is the broker's lower bound of share.record.lock.duration.ms
    when it sets one (Kafka's group.share.min.record.lock.duration.ms), else Kafka's default."""
    if name not in DEFAULTS:
        raise TxlogError(ErrorCode.INVALID_CONFIG, f"Unknown group config name: {name}")
    if name == AUTO_OFFSET_RESET:
        parse_offset_reset(value)
        return value.strip()
    if name == ISOLATION_LEVEL:
        if value.strip().lower() not in ("read_committed", "read_uncommitted"):
            raise _invalid(name, value, "String must be one of: read_committed, read_uncommitted")
        return value.strip().lower()
    try:
        number = int(value.strip())
    except ValueError:
        raise _invalid(name, value, "Not a number of type INT") from None
    low, high = BOUNDS[name]
    if name == RECORD_LOCK_DURATION_MS and min_record_lock_duration_ms is not None:
        low = min_record_lock_duration_ms
    if not low <= number <= high:
        raise _invalid(name, value, f"Value must be at least {low} and at most {high}")
    return str(number)


def config_of(values: Mapping[str, str]) -> ShareConfigs:
    """The configs a group has set (stored values, validated when set) with defaults for the rest."""
    merged = {**DEFAULTS, **values}
    return ShareConfigs(
        auto_offset_reset=parse_offset_reset(merged[AUTO_OFFSET_RESET]),
        isolation_level="read_committed" if merged[ISOLATION_LEVEL] == "read_committed" else "read_uncommitted",
        delivery=DeliveryConfig(
            record_lock_duration_ms=int(merged[RECORD_LOCK_DURATION_MS]), delivery_count_limit=int(merged[DELIVERY_COUNT_LIMIT])
        ),
        session_timeout_ms=int(merged[SESSION_TIMEOUT_MS]),
        heartbeat_interval_ms=int(merged[HEARTBEAT_INTERVAL_MS]),
    )
