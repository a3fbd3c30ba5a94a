"""DatabaseClock against a real PostgreSQL: the Broker's default clock agrees with the database
server's, and keeps counting while the database refuses connections."""

from __future__ import annotations

import psycopg
from sqlalchemy import text

from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage.db import DatabaseClock, libpq_url
from tests.support import wait_until

SLACK_MS = 500  # half a round trip of the clock's last reading, and rounding, on a busy machine


def database_ms(broker: Broker) -> int:
    with broker.db.read() as conn:
        return conn.execute(text("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")).scalar_one()


def test_the_broker_reads_the_database_clock(broker):
    assert isinstance(broker.clock, DatabaseClock)
    for _ in range(20):
        before = broker.now()
        db = database_ms(broker)
        after = broker.now()
        assert before - SLACK_MS <= db <= after + SLACK_MS
        assert before <= after


def test_it_keeps_counting_while_the_database_is_away(broker, db_url, pg_admin_url):
    clock = DatabaseClock(broker.db, resync_s=0.1, retry_s=0.1)
    first = clock()
    name = libpq_url(db_url).rpartition("/")[2]
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:

            def refused() -> bool:
                try:
                    clock.read_database_ms()
                except Exception:
                    return True
                return False

            wait_until(refused, timeout=10, message="the database to refuse connections")
            readings = [clock()]
            wait_until(
                lambda: readings.append(clock()) or readings[-1] >= readings[0] + 300,
                timeout=10,
                message="the clock to count on without the database",
            )
            assert readings == sorted(readings) and readings[0] >= first
            assert clock._failure is not None  # it did try, and failed
            try:
                DatabaseClock(broker.db)()
            except TxlogError as exc:  # a clock that never read the database has no time to tell
                assert exc.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
            else:
                raise AssertionError("a clock without a reading answered")
        finally:
            admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
    wait_until(lambda: clock() and clock._failure is None, timeout=10, message="the clock to read the database again")
    before = clock()
    db = database_ms(broker)
    assert before - SLACK_MS <= db <= clock() + SLACK_MS
