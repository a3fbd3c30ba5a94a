"""The migrations build exactly the schema declared in app.storage.tables, go down and up again, and
create the contract's SQL views."""

from __future__ import annotations

import uuid
from typing import Callable, Iterator

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.storage import migrate, views
from app.storage.db import create_engine, libpq_url
from app.storage.tables import SCHEMA, metadata


def _url_for(admin_url: str, name: str) -> str:
    base, _, _ = libpq_url(admin_url).rpartition("/")
    return f"{base}/{name}"


@pytest.fixture
def empty_database(pg_admin_url: str) -> Iterator[Callable[[], str]]:
    """Returns a factory of empty databases (dropped afterwards)."""
    names: list[str] = []

    def make() -> str:
        name = f"txlog_mig_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        names.append(name)
        return _url_for(pg_admin_url, name)

    yield make
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _include_name(name, type_, parent_names):  # type: ignore[no-untyped-def]
    return name == SCHEMA if type_ == "schema" else True


def _drift(url: str) -> list:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "include_name": _include_name,
                    "compare_type": True,
                    "compare_server_default": True,
                    "version_table_schema": SCHEMA,
                },
            )
            return compare_metadata(ctx, metadata)
    finally:
        engine.dispose()


def _catalog(url: str) -> dict[str, list[tuple]]:
    """What PostgreSQL itself says the txlog schema is (alembic's own table left out)."""
    with psycopg.connect(libpq_url(url)) as conn:
        columns = conn.execute(
            """
            SELECT table_name, column_name, data_type, is_nullable, column_default
            FROM information_schema.columns WHERE table_schema = %s AND table_name <> 'alembic_version'
            ORDER BY table_name, column_name
            """,
            (SCHEMA,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename <> 'alembic_version' ORDER BY indexname",
            (SCHEMA,),
        ).fetchall()
        constraints = conn.execute(
            """
            SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
            FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
            WHERE n.nspname = %s AND c.conrelid::regclass::text <> 'txlog.alembic_version'
            ORDER BY 1, 2
            """,
            (SCHEMA,),
        ).fetchall()
        sequences = conn.execute(
            "SELECT sequence_name, start_value FROM information_schema.sequences WHERE sequence_schema = %s ORDER BY 1", (SCHEMA,)
        ).fetchall()
        view_defs = conn.execute(
            "SELECT viewname, definition FROM pg_views WHERE schemaname = %s ORDER BY viewname", (SCHEMA,)
        ).fetchall()
    return {"columns": columns, "indexes": indexes, "constraints": constraints, "sequences": sequences, "views": view_defs}


def _relations(url: str) -> set[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'v', 'S') AND c.relname <> 'alembic_version'",
            (SCHEMA,),
        ).fetchall()
    return {r[0] for r in rows}


def test_migrations_build_the_declared_schema_without_drift(empty_database):
    url = empty_database()
    migrate.upgrade(url)
    assert _drift(url) == []
    command.check(migrate.alembic_config(url))  # what CI's "no new migration needed" check runs
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision(url)
    finally:
        engine.dispose()


def test_migrated_database_equals_one_built_from_the_tables(empty_database):
    migrated, declared = empty_database(), empty_database()
    migrate.upgrade(migrated)
    engine = create_engine(declared, pool_size=1, max_overflow=0)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {SCHEMA}"))
            metadata.create_all(conn)
            for statement in views.ALL:
                conn.execute(sa.text(statement))
    finally:
        engine.dispose()
    a, b = _catalog(migrated), _catalog(declared)
    for part in a:
        assert a[part] == b[part], part
    assert a["columns"] and a["indexes"] and a["constraints"] and a["sequences"] and a["views"]


def test_downgrade_to_base_and_upgrade_again(empty_database):
    url = empty_database()
    migrate.upgrade(url)
    built = _relations(url)
    assert {"records", "partitions", "topics", "transactions", "transaction_events", "producer_id_seq"} <= built

    cfg = migrate.alembic_config(url)
    command.downgrade(cfg, "base")
    assert _relations(url) == set()
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            assert migrate.current_revision(conn) is None
    finally:
        engine.dispose()

    migrate.upgrade(url)
    assert _relations(url) == built
    assert _drift(url) == []
    migrate.upgrade(url)  # upgrading an up-to-date database is a no-op
    assert _relations(url) == built


# The contract's stable views (columns may be added, never renamed or removed), with their types
# where the contract names them.
CONTRACT_VIEWS = {
    "committed_records": {
        "topic": "text",
        "partition": "integer",
        "offset": "bigint",
        "key": "bytea",
        "value": "bytea",
        "headers": "jsonb",
        "timestamp": "timestamp with time zone",
        "producer_id": "bigint",
    },
    "partition_status": dict.fromkeys(
        ["topic", "partition", "log_start_offset", "high_watermark", "last_stable_offset", "open_transactions"]
    ),
    "transaction_state": dict.fromkeys(
        ["transactional_id", "producer_id", "producer_epoch", "state", "timeout_ms", "started_at", "updated_at"]
    ),
    "transaction_events": dict.fromkeys(["transactional_id", "from_state", "to_state", "producer_id", "producer_epoch", "at"]),
}


def test_contract_views_exist_with_their_columns(empty_database):
    url = empty_database()
    migrate.upgrade(url)
    with psycopg.connect(libpq_url(url)) as conn:
        for relation, wanted in CONTRACT_VIEWS.items():
            have = dict(
                conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                    (SCHEMA, relation),
                ).fetchall()
            )
            assert have, f"txlog.{relation} does not exist"
            missing = set(wanted) - set(have)
            assert not missing, (relation, missing)
            for column, data_type in wanted.items():
                if data_type is not None:
                    assert have[column] == data_type, (relation, column, have[column])
            # readable by a plain SELECT naming the contract's columns
            columns = ", ".join(f'"{c}"' for c in wanted)
            assert conn.execute(f"SELECT {columns} FROM {SCHEMA}.{relation}").fetchall() == []
        kinds = dict(
            conn.execute(
                "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = ANY(%s)",
                (SCHEMA, list(CONTRACT_VIEWS)),
            ).fetchall()
        )
    assert kinds["committed_records"] == kinds["partition_status"] == kinds["transaction_state"] == "v"
    assert kinds["transaction_events"] in ("r", "v")  # the append-only history is itself readable


def test_upgrading_a_database_with_data_keeps_every_record_and_transaction(empty_database):
    """Data written by the first schema reads the same after the upgrade: aborted transactions as
    offset ranges, headers as lists, log positions, producer ids of transactional ids, and a
    transaction's partitions and groups as rows."""
    url = empty_database()
    migrate.upgrade(url, "0001")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO txlog.topics (name, partitions) VALUES ('t', 1);
            INSERT INTO txlog.partitions (topic, partition, next_offset) VALUES ('t', 0, 6);
            INSERT INTO txlog.records (topic, partition, "offset", key, value, headers, "timestamp", producer_id,
                                       producer_epoch, sequence, is_transactional, control_type) VALUES
              ('t', 0, 0, 'k', 'plain', '{"h": "1", "a": null}', now(), NULL, NULL, NULL, false, NULL),
              ('t', 0, 1, NULL, 'aborted', NULL, now(), 1000, 0, 0, true, NULL),
              ('t', 0, 2, NULL, NULL, NULL, now(), 1000, 0, NULL, true, 0),
              ('t', 0, 3, NULL, 'committed', NULL, now(), 1000, 1, 0, true, NULL),
              ('t', 0, 4, NULL, NULL, NULL, now(), 1000, 1, NULL, true, 1),
              ('t', 0, 5, 'kk', 'last', NULL, now(), NULL, NULL, NULL, false, NULL);
            INSERT INTO txlog.aborted_txns VALUES ('t', 0, 1000, 0, 1, 2);
            INSERT INTO txlog.transactions (transactional_id, producer_id, producer_epoch, state, timeout_ms, version,
                updated_at, epoch_changed_at, partitions, groups, last_producer_id, last_producer_epoch, last_result,
                coordinator)
              VALUES ('tx', 1001, 0, 'CompleteCommit', 60000, 3, now(), now(), '[["t", 0]]', '["g"]', 1000, 1, 'commit', 7);
            """
        )
    migrate.upgrade(url)
    with psycopg.connect(libpq_url(url)) as conn:
        committed = conn.execute(
            'SELECT "offset", value, header_keys, header_values, headers FROM txlog.committed_records ORDER BY "offset"'
        ).fetchall()
        assert [(o, v) for o, v, *_ in committed] == [(0, b"plain"), (3, b"committed"), (5, b"last")]
        assert committed[0][2:] == (["a", "h"], [None, b"1"], {"h": "1", "a": None})
        assert conn.execute(
            "SELECT producer_id, first_offset, last_offset, producer_epoch FROM txlog.aborted_txns"
        ).fetchall() == [(1000, 1, 2, 0)]
        positions = conn.execute('SELECT "offset", position FROM txlog.records ORDER BY "offset"').fetchall()
        sizes = [1 + 5 + 2 + 1, 7, 0, 9, 0]  # key + value + header keys and values of each record before
        assert positions == [(o, sum(sizes[:o])) for o in range(6)]
        assert conn.execute("SELECT next_position FROM txlog.partitions").fetchone() == (sum(sizes) + 2 + 4,)
        assert conn.execute(
            "SELECT producer_id, transactional_id, retired_at IS NOT NULL FROM txlog.producer_ids ORDER BY 1"
        ).fetchall() == [(1000, "tx", True), (1001, "tx", False)]
        assert conn.execute("SELECT partitions, groups FROM txlog.transaction_state").fetchone() == ([["t", 0]], ["g"])
