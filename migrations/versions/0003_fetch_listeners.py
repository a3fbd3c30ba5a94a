"""fetch listeners: appends notify long-polling fetches only on partitions someone waits on

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fetch_listeners",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["topic", "partition"], ["txlog.partitions.topic", "txlog.partitions.partition"], ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("topic", "partition"),
        schema="txlog",
    )


def downgrade() -> None:
    op.drop_table("fetch_listeners", schema="txlog")
