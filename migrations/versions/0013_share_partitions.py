"""Share groups (KIP-932): each share partition's start and end offsets, its in-flight records as
runs of offsets in one state, and the share groups' configs

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "share_partitions",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column("state_epoch", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("start_offset >= 0 AND end_offset >= start_offset", name="share_partitions_window"),
        sa.ForeignKeyConstraint(
            ["topic", "partition"], ["txlog.partitions.topic", "txlog.partitions.partition"], ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("group_id", "topic", "partition"),
        schema="txlog",
    )
    op.create_table(
        "share_in_flight",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("first_offset", sa.BigInteger(), nullable=False),
        sa.Column("last_offset", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.SmallInteger(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=True),
        sa.Column("lock_deadline_ms", sa.BigInteger(), nullable=True),
        sa.Column("delivery_count", sa.Integer(), nullable=False),
        sa.CheckConstraint("last_offset >= first_offset", name="share_in_flight_range"),
        sa.CheckConstraint("state IN (0, 1, 2, 4)", name="share_in_flight_state"),
        sa.CheckConstraint(
            "(state = 1) = (member_id IS NOT NULL AND lock_deadline_ms IS NOT NULL)", name="share_in_flight_acquired_lock"
        ),
        sa.CheckConstraint("delivery_count >= 0", name="share_in_flight_delivery_count"),
        sa.ForeignKeyConstraint(
            ["group_id", "topic", "partition"],
            ["txlog.share_partitions.group_id", "txlog.share_partitions.topic", "txlog.share_partitions.partition"],
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("group_id", "topic", "partition", "first_offset"),
        schema="txlog",
    )
    op.create_index(
        "share_in_flight_lock_deadline",
        "share_in_flight",
        ["lock_deadline_ms"],
        schema="txlog",
        postgresql_where=sa.text("state = 1"),
    )
    op.create_table(
        "share_group_configs",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "name IN ('share.auto.offset.reset', 'share.isolation.level', 'share.record.lock.duration.ms', "
            "'share.delivery.count.limit', 'share.group.session.timeout.ms')",
            name="share_group_configs_name",
        ),
        sa.PrimaryKeyConstraint("group_id", "name"),
        schema="txlog",
    )


def downgrade() -> None:
    op.drop_table("share_group_configs", schema="txlog")
    op.drop_index("share_in_flight_lock_deadline", table_name="share_in_flight", schema="txlog")
    op.drop_table("share_in_flight", schema="txlog")
    op.drop_table("share_partitions", schema="txlog")
