"""Retention rules, as Kafka's topic configs ``retention.ms`` and ``retention.bytes``: plain
functions, no I/O."""

from __future__ import annotations

from typing import Any, Mapping

from app.errors import ErrorCode, TxlogError

# The topic configs txlog reads, with their bounds. -1 means no limit (Kafka's convention).
RETENTION_CONFIGS = ("retention.ms", "retention.bytes")


def validate_topic_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A topic's config as given at create or alter: the retention values must be integers of at
    least -1 (Kafka's INVALID_CONFIG otherwise); other keys are kept as given. A null value (alter
    only) removes the key, so the broker default applies again."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not key or "\x00" in key:
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"Invalid config name {key!r}")
        if key in RETENTION_CONFIGS and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer, not {value!r}")
            try:
                number = int(value)
            except ValueError:
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer, not {value!r}") from None
            if not -1 <= number <= 2**63 - 1:
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"{key} must be -1 (no limit) or at least 0, not {number}")
            value = number
        out[key] = value
    return out


def altered_config(current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Kafka's incremental alter: set each key given, remove each key given as null."""
    merged = dict(current)
    for key, value in validate_topic_config(changes).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def log_start_for_retention(log_start: int, last_stable_offset: int, by_time: int | None, by_size: int | None) -> int | None:
    """Where retention moves a partition's log start: past every record older than retention.ms
    (``by_time``: the first offset young enough) and past what exceeds retention.bytes (``by_size``:
    the first offset from which the log fits), never past the last stable offset. ``None`` when it
    does not move."""
    wanted = max((o for o in (by_time, by_size) if o is not None), default=None)
    if wanted is None:
        return None
    target = min(wanted, last_stable_offset)
    return target if target > log_start else None
