"""Offset metadata is kept as bytes: any string Kafka accepts, a NUL inside included

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The UTF-8 bytes of each string committed so far, which PostgreSQL text held without a NUL.
    for table in ("group_offsets", "pending_group_offsets"):
        op.execute(
            f"ALTER TABLE txlog.{table} ALTER COLUMN metadata DROP DEFAULT, "
            "ALTER COLUMN metadata TYPE bytea USING convert_to(metadata, 'UTF8'), "
            "ALTER COLUMN metadata SET DEFAULT ''::bytea"
        )


def downgrade() -> None:
    # A NUL cannot go back into text: it is dropped (PostgreSQL has no replace() for bytea).
    conn = op.get_bind()
    for table in ("pending_group_offsets", "group_offsets"):
        rows = conn.execute(
            sa.text(f"SELECT ctid::text, metadata FROM txlog.{table} WHERE position('\\x00'::bytea IN metadata) > 0")
        ).fetchall()
        for ctid, metadata in rows:
            conn.execute(
                sa.text(f"UPDATE txlog.{table} SET metadata = :m WHERE ctid = CAST(:ctid AS tid)"),
                {"m": bytes(metadata).replace(b"\x00", b""), "ctid": ctid},
            )
        op.execute(
            f"ALTER TABLE txlog.{table} ALTER COLUMN metadata DROP DEFAULT, "
            "ALTER COLUMN metadata TYPE text USING convert_from(metadata, 'UTF8'), "
            "ALTER COLUMN metadata SET DEFAULT ''"
        )
