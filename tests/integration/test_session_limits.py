"""The limits PostgreSQL enforces on txlog's sessions, so that a stuck process (VM stall, SIGSTOP, a
partition TCP does not notice) cannot hold the others up: the settings reach every session
(server timeouts and TCP keepalives both ways), a lock wait or a long statement is answered
REQUEST_TIMED_OUT (retriable) instead of hanging, and a session left idle inside a transaction is
ended by the server, its row locks released. Migrations run without them."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import produce, topics
from app.services.produce import ProduceRequest
from app.storage.db import create_engine, translate_errors
from tests.conftest import make_broker
from tests.support import wait_until

SERVER_SETTINGS = {
    "lock_timeout": "1234",
    "statement_timeout": "23456",
    "idle_in_transaction_session_timeout": "3456",
    "tcp_keepalives_idle": "7",
    "tcp_keepalives_interval": "3",
    "tcp_keepalives_count": "4",
    "tcp_user_timeout": "12345",
}


def settings_of(conn) -> dict[str, str]:  # type: ignore[no-untyped-def]
    rows = conn.execute(text("SELECT name, setting FROM pg_settings WHERE name = ANY(:names)"), {"names": list(SERVER_SETTINGS)})
    return dict(rows.all())


def test_every_session_carries_the_configured_limits(db_url):
    b = make_broker(
        db_url,
        db_lock_timeout_ms=1234,
        db_statement_timeout_ms=23456,
        db_idle_in_transaction_timeout_ms=3456,
        db_keepalives_idle_s=7,
        db_keepalives_interval_s=3,
        db_keepalives_count=4,
        db_tcp_user_timeout_ms=12345,
    )
    try:
        with b.db.transaction() as conn:
            assert settings_of(conn) == SERVER_SETTINGS
            client = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
            assert {
                k: client.get(k)
                for k in ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout")
            } == {
                "keepalives": "1",
                "keepalives_idle": "7",
                "keepalives_interval": "3",
                "keepalives_count": "4",
                "tcp_user_timeout": "12345",
            }
        with b.db.read() as conn:
            assert settings_of(conn) == SERVER_SETTINGS
    finally:
        b.db.dispose()


def test_the_defaults_are_safe(db_url):
    b = make_broker(db_url)
    try:
        with b.db.read() as conn:
            got = settings_of(conn)
        assert (got["lock_timeout"], got["statement_timeout"], got["idle_in_transaction_session_timeout"]) == (
            "5000",
            "30000",
            "10000",
        )
        assert (got["tcp_keepalives_idle"], got["tcp_keepalives_interval"], got["tcp_keepalives_count"]) == ("10", "5", "3")
    finally:
        b.db.dispose()


def test_migrations_run_without_limits(db_url):
    engine = create_engine(db_url, pool_size=1, max_overflow=0, limits=None)  # as migrations/env.py makes it
    try:
        with engine.connect() as conn:
            got = settings_of(conn)
        assert (got["lock_timeout"], got["statement_timeout"], got["idle_in_transaction_session_timeout"]) == ("0", "0", "0")
    finally:
        engine.dispose()


def test_a_statement_past_its_limit_is_request_timed_out(db_url):
    b = make_broker(db_url, db_statement_timeout_ms=200)
    try:
        start = time.monotonic()
        with pytest.raises(TxlogError) as info, b.db.transaction() as conn:
            conn.execute(text("SELECT pg_sleep(5)"))
        assert info.value.code is ErrorCode.REQUEST_TIMED_OUT and info.value.code.retriable
        assert time.monotonic() - start < 4
    finally:
        b.db.dispose()


def test_a_session_idle_inside_a_transaction_is_ended_and_its_locks_released(db_url):
    """A txlog session takes a partition's append lock and then its process stops talking (as a
    frozen process would). Appends to that partition are refused REQUEST_TIMED_OUT after the lock
    timeout, never left hanging, until the server ends the idle session; then they succeed."""
    b = make_broker(db_url, db_lock_timeout_ms=200, db_idle_in_transaction_timeout_ms=1500)
    try:
        topics.create_topic(b, "t", 1)
        stuck = b.db.engine.connect()
        stuck.begin()
        stuck.execute(text("SELECT 1 FROM txlog.partitions WHERE topic = 't' AND partition = 0 FOR UPDATE"))
        stopped_at = time.monotonic()

        answers: list[str] = []

        def append() -> bool:
            try:
                produce.produce(b, "t", 0, ProduceRequest([NewRecord(None, b"v")]))
            except TxlogError as exc:  # the lock timeout ended the wait (SQLSTATE 55P03), not the stuck session
                assert exc.code is ErrorCode.REQUEST_TIMED_OUT, exc
                answers.append(exc.code.name)
                return False
            answers.append("ok")
            return True

        wait_until(append, timeout=15, interval=0.05, message="an append after the idle session is ended")
        assert answers[0] == "REQUEST_TIMED_OUT" and answers[-1] == "ok"
        assert time.monotonic() - stopped_at >= 1.4  # released by the idle timeout, not earlier
        with pytest.raises(TxlogError) as info, translate_errors():  # the stuck session is gone
            stuck.execute(text("SELECT 1"))
        assert info.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        stuck.invalidate()
        stuck.close()
    finally:
        b.db.dispose()
