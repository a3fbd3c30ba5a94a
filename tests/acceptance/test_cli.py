"""The ``txlog`` command line: ``db-url`` starts (or finds) the embedded PostgreSQL and prints a TCP
URL, data survives a restart, ``migrate`` upgrades a given database, ``serve`` runs on the embedded one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from app.storage import migrate
from app.storage.db import libpq_url
from app.storage.embedded import EmbeddedPostgres
from tests.support import ROOT, free_port, wait_until

TXLOG = Path(sys.executable).parent / "txlog"


def cli_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    env["TXLOG_DATA_DIR"] = str(data_dir)
    return env


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory for an embedded server the test starts; the server is stopped afterwards."""
    d = tmp_path / "txlog-data"
    yield d
    EmbeddedPostgres(d).stop()


def test_db_url_starts_the_embedded_server_and_prints_a_tcp_url(data_dir):
    env = cli_env(data_dir)
    url = run_cli("db-url", env=env).stdout.strip()
    parts = urlsplit(url)
    assert parts.scheme == "postgresql"
    assert parts.hostname == "127.0.0.1" and parts.port
    assert parts.path == "/txlog"
    with psycopg.connect(url, connect_timeout=5) as conn:
        assert conn.info.host == "127.0.0.1"  # TCP, not a unix socket
        assert conn.execute("SELECT current_database()").fetchone() == ("txlog",)
        assert conn.execute("SELECT inet_server_addr()::text").fetchone()[0].startswith("127.0.0.1")
    assert EmbeddedPostgres(data_dir).is_running()

    # a second call finds the running server and prints the same URL
    assert run_cli("db-url", env=env).stdout.strip() == url


def test_embedded_data_survives_stop_and_start(data_dir):
    env = cli_env(data_dir)
    url = run_cli("db-url", env=env).stdout.strip()
    marker = uuid.uuid4().hex
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES (%s)", (marker,))

    EmbeddedPostgres(data_dir).stop()
    assert not EmbeddedPostgres(data_dir).is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2).close()

    assert run_cli("db-url", env=env).stdout.strip() == url  # started again, same port remembered
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT note FROM kept").fetchall() == [(marker,)]


def test_migrate_with_a_database_url(pg_admin_url, tmp_path):
    name = f"txlog_cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = libpq_url(pg_admin_url).rpartition("/")[0] + "/" + name
    try:
        env = cli_env(tmp_path / "unused")  # with a URL no embedded server is started
        for _ in range(2):  # migrating twice is harmless
            proc = subprocess.run(
                [str(TXLOG), "migrate", "--database-url", url], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
            )
            assert proc.returncode == 0, proc.stderr
            assert f"migrated to {migrate.head_revision(url)}" in proc.stderr
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version_num FROM txlog.alembic_version").fetchall() == [(migrate.head_revision(url),)]
            assert conn.execute("SELECT count(*) FROM txlog.records").fetchone() == (0,)
        assert not (tmp_path / "unused").exists()
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_uses_the_database_url_from_the_environment(pg_admin_url, tmp_path):
    name = f"txlog_cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = libpq_url(pg_admin_url).rpartition("/")[0] + "/" + name
    try:
        env = {**cli_env(tmp_path / "unused"), "TXLOG_DATABASE_URL": url}
        run_cli("migrate", env=env)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT version_num FROM txlog.alembic_version").fetchall() == [(migrate.head_revision(url),)]
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_serve_on_the_embedded_database(data_dir, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [str(TXLOG), "serve", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=cli_env(data_dir),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                return httpx.get(base + "/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=90, interval=0.1, message="txlog serve on the embedded database")
        with httpx.Client(base_url=base, timeout=10) as api:
            assert api.post("/v1/topics", json={"name": "cli", "partitions": 1}).status_code == 201
            assert api.post("/v1/topics/cli/partitions/0/records", json={"records": [{"value": "v"}]}).json()["base_offset"] == 0
        # the embedded database is the one db-url names, migrated, holding what was just produced
        url = run_cli("db-url", env=cli_env(data_dir)).stdout.strip()
        with psycopg.connect(url) as conn:
            assert conn.execute('SELECT "offset", value FROM txlog.committed_records WHERE topic = %s', ("cli",)).fetchall() == [
                (0, b"v")
            ]
        assert f"database {url}" in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    # serve stops the embedded server it started when it exits
    assert not EmbeddedPostgres(data_dir).is_running()
