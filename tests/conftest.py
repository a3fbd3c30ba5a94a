"""Fixtures: a real PostgreSQL for the whole run (embedded, started and stopped here, or
TXLOG_TEST_DATABASE_URL), a migrated template database, and a fresh database cloned from it per test."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from app.config import Settings
from app.services import Broker
from app.storage import migrate
from app.storage.db import Database, SessionLimits, libpq_url
from app.storage.embedded import EmbeddedPostgres
from tests.support import ServerProcess, destroy_embedded


def _with_database(url: str, name: str) -> str:
    base, _, _ = libpq_url(url).rpartition("/")
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL with rights to create databases."""
    given = os.environ.get("TXLOG_TEST_DATABASE_URL")
    if given:
        yield libpq_url(given)
        return
    from app.storage.embedded import EmbeddedPostgres

    # Not under pytest's temporary root: another pytest session of the same user prunes that root
    # to its newest few directories, and would take this running server's data with it.
    server = EmbeddedPostgres(tempfile.mkdtemp(prefix="txlog-test-postgres-"))
    server.start()
    try:
        yield server.admin_url()
    finally:
        log = server.pgdata / "server.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        destroy_embedded(server)
    # A crash of the server fails the run with its own account of what happened.
    crashes = [line for line in text.splitlines() if "terminated by signal" in line or "PANIC" in line]
    assert not crashes, "the test PostgreSQL crashed:\n" + "\n".join(text.splitlines()[-200:])


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    name = f"txlog_tpl_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _with_database(pg_admin_url, name)
    migrate.upgrade(url)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:  # no connections may remain on a template
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    yield name
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def new_database(pg_admin_url: str, template: str) -> str:
    name = f"txlog_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


def drop_database(pg_admin_url: str, name: str) -> None:
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_database(pg_admin_url: str, template: str) -> Iterator[str]:
    """The URL of a new database cloned from the migrated template, dropped afterwards."""
    name = new_database(pg_admin_url, template)
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


class ManualClock:
    """A clock tests move by hand (epoch milliseconds)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def make_broker(url: str, clock=None, **settings: object) -> Broker:  # type: ignore[no-untyped-def]
    s = Settings(database_url=url, **settings)  # type: ignore[arg-type]
    b = Broker(Database(url, pool_size=5, limits=SessionLimits.from_settings(s)), s)
    if clock is not None:
        b.clock = clock
    return b


@pytest.fixture
def broker(db_url: str) -> Iterator[Broker]:
    """Services over a real database, with the wall clock."""
    b = make_broker(db_url)
    yield b
    b.db.dispose()


@pytest.fixture
def clocked_broker(db_url: str, clock: ManualClock) -> Iterator[Broker]:
    """Services over a real database, with a clock the test moves."""
    b = make_broker(db_url, clock)
    yield b
    b.db.dispose()


@pytest.fixture(scope="session")
def server_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="session")
def server(server_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real ``txlog serve`` for the session's HTTP tests (each test uses its own topic names)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with ServerProcess(server_db, env={"TXLOG_TRANSACTION_ABORT_CHECK_INTERVAL_MS": "500"}, log_path=log) as s:
        yield s


@pytest.fixture
def api(server: ServerProcess):  # type: ignore[no-untyped-def]
    with server.client() as client:
        yield client


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of the test's own, migrated, for tests that stop, kill or restart it."""
    pg = EmbeddedPostgres(tmp_path / "pg")
    pg.start()
    migrate.upgrade(pg.url)
    try:
        yield pg
    finally:
        destroy_embedded(pg)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One real local Spark for the whole run (starting one costs seconds), reading the test
    PostgreSQL over JDBC (the embedded server listens on 127.0.0.1): the Spark tests', and every
    door's test that Spark reads what it wrote."""
    from spark.session import spark_session

    session = spark_session("txlog-tests", "local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()
