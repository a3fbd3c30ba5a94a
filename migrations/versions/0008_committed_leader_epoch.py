"""Committed offsets keep the leader epoch their consumer committed with

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # -1 is Kafka's "no leader epoch", what every offset committed before answered. A constant
    # default adds the column without rewriting the table.
    for table in ("group_offsets", "pending_group_offsets"):
        op.add_column(
            table, sa.Column("leader_epoch", sa.Integer(), server_default=sa.text("-1"), nullable=False), schema="txlog"
        )


def downgrade() -> None:
    for table in ("pending_group_offsets", "group_offsets"):
        op.drop_column(table, "leader_epoch", schema="txlog")
