"""Shared set-up for benchmarks: a database (embedded in a temp dir unless TXLOG_DATABASE_URL is
given), migrated, and a way to time a function in rows/s."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Callable, Iterator

import psycopg

from app.storage import migrate


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    given = os.environ.get("TXLOG_DATABASE_URL")
    if given:
        migrate.upgrade(given)
        yield given
        return
    from app.storage.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="txlog-bench-") as d:
        server = EmbeddedPostgres(d)
        url = server.start()
        try:
            migrate.upgrade(url)
            yield url
        finally:
            server.stop()


def rate(rows: int, fn: Callable[[], None], repeat: int = 3) -> float:
    """Best of ``repeat`` runs, in rows per second (the machine is small and noisy)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return rows / best


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE txlog.records, txlog.partitions, txlog.topics, txlog.producer_partitions, txlog.aborted_txns, "
            "txlog.transactions, txlog.transaction_events, txlog.group_offsets, txlog.pending_group_offsets CASCADE"
        )
