"""Migration 0007 (the Kafka wire gateway's cluster) on a database that already has data: every
existing topic gets its own topic id, the cluster gets its id, the node registry starts empty;
going down removes them and keeps everything else."""

from __future__ import annotations

import re

import psycopg
from alembic import command

from app.storage import migrate
from app.storage.db import libpq_url
from tests.migration.test_migrations import empty_database  # noqa: F401  (fixture)


def _columns(conn: psycopg.Connection, table: str) -> set[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'txlog' AND table_name = %s", (table,)
    ).fetchall()
    return {r[0] for r in rows}


def _tables(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'txlog'").fetchall()
    return {r[0] for r in rows}


def test_upgrade_gives_existing_topics_ids_and_the_cluster_an_id_and_downgrade_removes_them(empty_database):  # noqa: F811
    url = empty_database()
    migrate.upgrade(url, "0006")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO txlog.topics (name, partitions) VALUES ('a', 1), ('b', 2);
            INSERT INTO txlog.partitions (topic, partition, next_offset) VALUES ('a', 0, 1), ('b', 0, 0), ('b', 1, 0);
            INSERT INTO txlog.records (topic, partition, "offset", value, "timestamp") VALUES ('a', 0, 0, 'kept', now());
            INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata) VALUES ('g', 'a', 0, 1, 'meta ✓');
            """
        )
    migrate.upgrade(url)
    with psycopg.connect(libpq_url(url)) as conn:
        ids = dict(conn.execute("SELECT name, topic_id FROM txlog.topics").fetchall())
        assert set(ids) == {"a", "b"} and all(ids.values()) and ids["a"] != ids["b"]
        [(cluster_id,)] = conn.execute("SELECT cluster_id FROM txlog.cluster").fetchall()
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id)
        assert conn.execute("SELECT count(*) FROM txlog.kafka_nodes").fetchone() == (0,)
        assert conn.execute("SELECT value FROM txlog.committed_records").fetchall() == [(b"kept",)]
        assert conn.execute("SELECT convert_from(metadata, 'UTF8') FROM txlog.group_offsets").fetchall() == [("meta ✓",)]
        conn.execute("INSERT INTO txlog.topics (name, partitions) VALUES ('c', 1)")
        assert conn.execute("SELECT topic_id IS NOT NULL FROM txlog.topics WHERE name = 'c'").fetchone() == (True,)
        conn.rollback()

    command.downgrade(migrate.alembic_config(url), "0006")
    with psycopg.connect(libpq_url(url)) as conn:
        assert "topic_id" not in _columns(conn, "topics")
        assert not {"cluster", "kafka_nodes"} & _tables(conn)
        assert conn.execute("SELECT name FROM txlog.topics ORDER BY name").fetchall() == [("a",), ("b",)]
        assert conn.execute("SELECT value FROM txlog.committed_records").fetchall() == [(b"kept",)]

    migrate.upgrade(url)
    with psycopg.connect(libpq_url(url)) as conn:
        again = dict(conn.execute("SELECT name, topic_id FROM txlog.topics").fetchall())
        assert set(again) == {"a", "b"} and again["a"] != again["b"]
        assert conn.execute("SELECT count(*) FROM txlog.cluster").fetchone() == (1,)
