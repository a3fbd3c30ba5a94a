"""Retention rules, as Kafka's topic configs ``retention.ms`` and ``retention.bytes``
(``topic_configs``): plain functions, no I/O."""

from __future__ import annotations


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
