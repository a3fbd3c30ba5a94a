"""Migration 0008 (committed offsets keep their leader epoch) on a database that already has
offsets: each gets -1, Kafka's "no leader epoch", which is what OffsetFetch answered for it before;
going down drops the column and keeps the offsets."""

from __future__ import annotations

import psycopg
from alembic import command

from app.storage import migrate
from app.storage.db import libpq_url
from tests.migration.test_migration_0007 import _columns
from tests.migration.test_migrations import empty_database  # noqa: F401  (fixture)


def test_existing_offsets_get_no_leader_epoch_and_downgrade_keeps_them(empty_database):  # noqa: F811
    url = empty_database()
    migrate.upgrade(url, "0007")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata) VALUES ('g', 'a', 0, 7, 'm');
            INSERT INTO txlog.pending_group_offsets (group_id, topic, partition, transactional_id, producer_id,
                                                     producer_epoch, "offset", metadata)
            VALUES ('g', 'a', 1, 'tx', 1000, 0, 9, '');
            """
        )
    migrate.upgrade(url)
    with psycopg.connect(libpq_url(url)) as conn:
        assert conn.execute('SELECT "offset", leader_epoch FROM txlog.group_offsets').fetchall() == [(7, -1)]
        assert conn.execute('SELECT "offset", leader_epoch FROM txlog.pending_group_offsets').fetchall() == [(9, -1)]
    command.downgrade(migrate.alembic_config(url), "0007")
    with psycopg.connect(libpq_url(url)) as conn:
        assert "leader_epoch" not in _columns(conn, "group_offsets") | _columns(conn, "pending_group_offsets")
        assert conn.execute('SELECT "offset", metadata FROM txlog.group_offsets').fetchall() == [(7, "m")]
