"""Records appended per minute (``RATE_BUCKETS`` buckets aligned to whole minutes, the last ending
now), counted from the offsets each partition had reached at the buckets' bounds: the rate on the
overview, a topic's and a partition's pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.storage import log as log_store

RATE_BUCKET_MS = 60_000
RATE_BUCKETS = 15


@dataclass(frozen=True)
class RatePoint:
    """Records appended (data and control) in [start_ms, end_ms)."""

    start_ms: int
    end_ms: int
    records: int

    @property
    def per_second(self) -> float:
        return self.records * 1000 / max(self.end_ms - self.start_ms, 1)


def bucket_bounds(now_ms: int, buckets: int = RATE_BUCKETS, width_ms: int = RATE_BUCKET_MS) -> list[int]:
    """Bucket boundaries aligned to whole minutes, the last bucket ending now (partial)."""
    current = now_ms - now_ms % width_ms
    return [current - (buckets - 1 - i) * width_ms for i in range(buckets)] + [now_ms]


def _record_rate(conn, now_ms: int, topic: str | None = None, partition: int | None = None) -> list[RatePoint]:
    bounds = bucket_bounds(now_ms)
    # The last bucket includes records stamped exactly now.
    offsets = log_store.partition_offsets_at(conn, bounds[:-1] + [now_ms + 1], topic, partition)
    counts = [0] * (len(bounds) - 1)
    for found in offsets.values():
        for i in range(len(counts)):
            counts[i] += max(found[i + 1] - found[i], 0)
    return [RatePoint(bounds[i], bounds[i + 1], counts[i]) for i in range(len(counts))]
