"""Consumer groups of the next-generation protocol (KIP-848): the group row whose lock serialises
its heartbeats, and its members with their epochs, reconciliation state, subscriptions, owned,
revoking and target partitions, and session and rebalance deadlines

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumer_group_metadata",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("group_epoch", sa.Integer(), nullable=False),
        sa.Column("assignment_epoch", sa.Integer(), nullable=False),
        sa.Column(
            "subscription_metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("group_id"),
        schema="txlog",
    )
    op.create_table(
        "consumer_group_member_metadata",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=False),
        sa.Column("instance_id", sa.Text(), nullable=True),
        sa.Column("member_epoch", sa.Integer(), nullable=False),
        sa.Column("previous_member_epoch", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("rebalance_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("subscribed_topic_names", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("subscribed_topic_regex", sa.Text(), nullable=True),
        sa.Column("server_assignor", sa.Text(), nullable=True),
        sa.Column("assignment", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("pending_revocation", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("target_assignment", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("session_deadline_ms", sa.BigInteger(), nullable=False),
        sa.Column("rebalance_deadline_ms", sa.BigInteger(), nullable=True),
        sa.Column("rack_id", sa.Text(), nullable=True),
        sa.Column("client_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("client_host", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["txlog.consumer_group_metadata.group_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("group_id", "member_id"),
        schema="txlog",
    )
    op.create_index(
        "consumer_group_member_metadata_session_deadline",
        "consumer_group_member_metadata",
        ["session_deadline_ms"],
        schema="txlog",
    )
    op.create_index(
        "consumer_group_member_metadata_rebalance_deadline",
        "consumer_group_member_metadata",
        ["rebalance_deadline_ms"],
        schema="txlog",
    )


def downgrade() -> None:
    op.drop_index(
        "consumer_group_member_metadata_rebalance_deadline", table_name="consumer_group_member_metadata", schema="txlog"
    )
    op.drop_index("consumer_group_member_metadata_session_deadline", table_name="consumer_group_member_metadata", schema="txlog")
    op.drop_table("consumer_group_member_metadata", schema="txlog")
    op.drop_table("consumer_group_metadata", schema="txlog")
