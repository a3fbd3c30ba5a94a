"""Many transactions timing out at once: several sweepers (each a SweeperThread on its own broker and
connection pool, as the workers of one or more hosts are) share the work and abort every one of
them within a few check intervals, each exactly once.

N is 2,000 here; ``make chaos`` sets TXLOG_SWEEPER_SCALE_N=10000. The check interval grows with N
(1 ms per transaction, at least 3 s) so that the bound stays "a few intervals"."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import text

from app.services import sweeper, topics
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer
from tests.support import wait_until

N = int(os.environ.get("TXLOG_SWEEPER_SCALE_N", "2000"))
SWEEPERS = 3
PARTITIONS = 8
INTERVAL_MS = max(3_000, N)
INTERVALS = 5  # "a few": the first round starts within a second, and a round that runs out of time is followed at once


def test_many_transactions_timing_out_together_are_aborted_by_several_sweepers_each_once(db_url, clock):
    settings = {"default_transaction_timeout_ms": 1_000, "transaction_abort_check_interval_ms": INTERVAL_MS}
    creator = make_broker(db_url, clock, **settings)
    sweepers = [sweeper.SweeperThread(make_broker(db_url, clock, **settings)) for _ in range(SWEEPERS)]
    try:
        topics.create_topic(creator, "t", PARTITIONS)

        def open_one(i: int) -> None:
            p = Producer(creator, f"tx-{i}")
            p.send("t", i % PARTITIONS, f"v{i}")

        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(open_one, range(N)))
        created_s = time.monotonic() - started
        clock.advance(1_001)  # every one of them is past its timeout now

        started = time.monotonic()
        for s in sweepers:
            s.start()
        wait_until(
            lambda: count(creator, "SELECT count(*) FROM txlog.transactions WHERE state = 'CompleteAbort'") == N,
            timeout=INTERVALS * INTERVAL_MS / 1000,
            interval=0.2,
            message=f"{N} timed-out transactions aborted",
        )
        aborted_s = time.monotonic() - started
        for s in sweepers:
            s.stop()
        for s in sweepers:
            s.join(60)
        print(
            f"\n{N} transactions: opened in {created_s:.1f} s; aborted by {SWEEPERS} sweepers in {aborted_s:.1f} s "
            f"({aborted_s * 1000 / INTERVAL_MS:.1f} check intervals of {INTERVAL_MS / 1000:.0f} s, {N / aborted_s:.0f}/s); "
            f"shares {[s.totals.timed_out for s in sweepers]}, rounds {[s.rounds for s in sweepers]}"
        )

        # Exactly once: one PrepareAbort and one CompleteAbort per transaction, one ABORT marker each.
        assert sum(s.totals.timed_out for s in sweepers) == N
        assert all(s.totals.timed_out > 0 for s in sweepers), "the sweepers share the work"
        assert sum(s.totals.failed for s in sweepers) == 0
        histories = count(
            creator,
            """
            SELECT count(*) FROM (
                SELECT transactional_id FROM txlog.transaction_events GROUP BY transactional_id
                HAVING count(*) FILTER (WHERE to_state = 'PrepareAbort' AND reason = 'timed_out') = 1
                   AND count(*) FILTER (WHERE to_state = 'CompleteAbort') = 1) once""",
        )
        assert histories == N
        assert count(creator, "SELECT count(*) FROM txlog.records WHERE control_type IS NOT NULL") == N
        assert count(creator, "SELECT count(*) FROM txlog.partition_status WHERE last_stable_offset <> high_watermark") == 0
        assert count(creator, "SELECT sum(high_watermark) FROM txlog.partition_status") == 2 * N
        assert count(creator, "SELECT count(*) FROM txlog.committed_records") == 0
    finally:
        for s in sweepers:
            s.stop()
            s.broker.db.dispose()
        creator.db.dispose()


def count(broker, sql: str) -> int:  # type: ignore[no-untyped-def]
    with broker.db.read() as conn:
        return conn.execute(text(sql)).scalar_one()
