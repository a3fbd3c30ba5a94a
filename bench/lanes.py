"""A *lane* of the benchmark's load: one producer or reader, one thread, one keep-alive connection,
one partition. What every lane family shares: the lane as a client process is given it, what it
answers, and the batch each lane sends or takes. The families are ``bench.http_lanes`` (the HTTP
API), ``bench.kafka_lanes`` (Kafka's wire protocol through confluent-kafka) and
``bench.postgres_lanes`` (PostgreSQL directly, PgQueuer and pgmq); ``bench.clients`` runs them in
client processes of their own.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Protocol

BATCH = 100  # records per produce batch, per raw append, per PgQueuer enqueue/dequeue
KEY_BYTES = 16
VALUE_BYTES = 1024
PAGE = 1000  # records per fetch


def batch_keys() -> list[bytes]:
    return [b"key-%012d" % i for i in range(BATCH)]


def batch_values() -> list[bytes]:
    """1 KiB printable values (no JSON escaping needed), a different one per record of the batch."""
    alphabet = string.ascii_letters + string.digits
    text = "".join(random.Random(7).choices(alphabet, k=VALUE_BYTES + BATCH))
    return [text[i : i + VALUE_BYTES].encode() for i in range(BATCH)]


@dataclass(frozen=True)
class Lane:
    """One producer or reader. ``target`` is ``host:port`` for HTTP lanes, Kafka's bootstrap servers
    for the wire lanes, a database URL otherwise."""

    kind: str  # produce | raw_append | fetch | raw_fetch | pgq_enqueue | pgq_dequeue | pgmq_read | share_acquire
    # | kafka_produce | kafka_fetch | kafka_share | kafka_share_explicit | kafka_spread_produce | kafka_spread_fetch
    # | kafka_latency
    target: str
    topic: str = ""
    partition: int = 0
    mode: str = ""  # produce: plain | idempotent | transactional; fetch: read_committed | read_uncommitted
    commit_every: int = 0  # transactional: batches per transaction
    transactional_id: str = ""
    offset: int = 0  # fetch: where the walk starts
    end: int = 0  # fetch: where the walk wraps (0: at the high watermark or LSO)
    start: int = 0  # fetch: where it wraps to (or the log start, if later)
    group: str = ""  # share lanes: the share group
    partitions: tuple[int, ...] = ()  # spread lanes: the partitions, in turn (``partition`` is then unused)
    ends: tuple[int, ...] = ()  # kafka_spread_fetch: where each of ``partitions`` wraps
    rate: float = 0.0  # kafka_latency: records per second produced


@dataclass
class LaneResult:
    rows: int = 0  # records completed inside the window
    latencies_ms: list[float] = field(default_factory=list)  # EndTxn, inside the window
    acked_ms: list[float] = field(default_factory=list)  # kafka_latency: produce → acknowledged, inside the window
    offset: int = 0  # fetch: where the walk stopped
    empty: int = 0  # dequeues (PgQueuer, pgmq, share acquisitions) that found nothing to take
    error: str | None = None


class Runner(Protocol):
    latencies: list[tuple[float, float]]  # (completed at, milliseconds)
    offset: int
    empty: int

    def step(self) -> int: ...

    def close(self) -> None: ...
