"""Kafka's client quotas: the quota entities' config values, and the usage every process records
against them per window

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "client_quotas",
        sa.Column("entity", postgresql.JSONB(), nullable=False),
        sa.Column("quota_key", sa.Text(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "quota_key IN ('producer_byte_rate', 'consumer_byte_rate', 'request_percentage')", name="client_quotas_quota_key"
        ),
        sa.CheckConstraint("value > 0", name="client_quotas_value_positive"),
        sa.PrimaryKeyConstraint("entity", "quota_key"),
        schema="txlog",
    )
    op.create_table(
        "client_quota_usage",
        sa.Column("user_tag", sa.Text(), nullable=False),
        sa.Column("client_tag", sa.Text(), nullable=False),
        sa.Column("quota_key", sa.Text(), nullable=False),
        sa.Column("window_index", sa.BigInteger(), nullable=False),
        sa.Column("amount", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("user_tag", "client_tag", "quota_key", "window_index"),
        schema="txlog",
    )
    op.create_index("client_quota_usage_window", "client_quota_usage", ["window_index"], schema="txlog")


def downgrade() -> None:
    op.drop_index("client_quota_usage_window", table_name="client_quota_usage", schema="txlog")
    op.drop_table("client_quota_usage", schema="txlog")
    op.drop_table("client_quotas", schema="txlog")
