"""Retention rules, as Kafka's topic configs ``retention.ms`` and ``retention.bytes``: plain
functions, no I/O."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from app.errors import ErrorCode, TxlogError

# The topic configs txlog reads, with their bounds. -1 means no limit (Kafka's convention).
RETENTION_CONFIGS = ("retention.ms", "retention.bytes")
MAX_LONG = 2**63 - 1
_INTEGER = re.compile(r"-?[0-9]{1,40}")  # as Java's Long.parseLong reads it: no spaces, no "_"


def validate_topic_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A topic's config as given at create or alter: the retention values must be integers of at
    least -1 (Kafka's INVALID_CONFIG otherwise); other keys are kept as given. A null value (alter
    only) removes the key, so the broker default applies again."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not key or not _storable(key):
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"Invalid config name {_shown(key)}")
        if not _storable(value):
            raise TxlogError(
                ErrorCode.INVALID_CONFIG, f"The value of {_shown(key)} cannot be stored (a NUL character, invalid Unicode, NaN or Infinity)"
            )
        if key in RETENTION_CONFIGS and value is not None:
            integer = isinstance(value, int) and not isinstance(value, bool)
            if not integer and not (isinstance(value, str) and _INTEGER.fullmatch(value)):
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"{key} must be an integer, not {_shown(value)}")
            value = int(value)
            if not -1 <= value <= MAX_LONG:
                raise TxlogError(ErrorCode.INVALID_CONFIG, f"{key} must be from -1 (no limit) to {MAX_LONG}, not {_shown(value)}")
        out[key] = value
    return out


def _storable(value: Any) -> bool:
    """Whether a JSON value can be kept in a jsonb column: no NUL character and no lone surrogate
    in any string of it, no NaN or Infinity."""
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)  # JSON has no NaN or Infinity
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_storable(v) for v in value)
    return True


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
