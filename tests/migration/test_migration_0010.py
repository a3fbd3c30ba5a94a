"""Migrations 0009 and 0010 on a database that already has offsets: 0010 keeps each committed and
pending offset's metadata as the UTF-8 bytes of the same string, and a NUL, which text could not
hold, is kept from then on; going down turns the bytes back into text, a NUL dropped. 0009 adds
the table of deleted topics' partitions, and going down removes it."""

from __future__ import annotations

import psycopg
from alembic import command

from app.storage import migrate
from app.storage.db import libpq_url
from tests.migration.test_migration_0007 import _tables
from tests.migration.test_migrations import empty_database  # noqa: F401  (fixture)


def test_offset_metadata_becomes_bytes_and_back(empty_database):  # noqa: F811
    url = empty_database()
    migrate.upgrade(url, "0008")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset", metadata) VALUES ('g', 'a', 0, 7, 'm ✓');
            INSERT INTO txlog.pending_group_offsets (group_id, topic, partition, transactional_id, producer_id,
                                                     producer_epoch, "offset", metadata)
            VALUES ('g', 'a', 1, 'tx', 1000, 0, 9, '');
            """
        )
    migrate.upgrade(url)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        assert "deleted_partitions" in _tables(conn)
        assert conn.execute("SELECT metadata FROM txlog.group_offsets").fetchall() == [("m ✓".encode(),)]
        assert conn.execute("SELECT metadata FROM txlog.pending_group_offsets").fetchall() == [(b"",)]
        conn.execute("""INSERT INTO txlog.group_offsets (group_id, topic, partition, "offset") VALUES ('g', 'a', 2, 3)""")
        conn.execute("""UPDATE txlog.group_offsets SET metadata = '\\x6e00756c'::bytea WHERE partition = 0""")  # n NUL u l
    command.downgrade(migrate.alembic_config(url), "0008")
    with psycopg.connect(libpq_url(url)) as conn:
        assert "deleted_partitions" not in _tables(conn)
        rows = conn.execute("SELECT partition, metadata FROM txlog.group_offsets ORDER BY partition").fetchall()
        assert rows == [(0, "nul"), (2, "")]
