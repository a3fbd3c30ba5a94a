"""The registry of live RocketMQ gateways: each gateway process holds an entry by a lease it renews,
and QueryRoute routes clients to every live one. A table of its own, not ``kafka_nodes``: a
RocketMQ gateway is no Kafka broker, and Kafka's Metadata lists every row of that table.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rocketmq_gateways",
        sa.Column("process_token", sa.Text(), primary_key=True),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("port BETWEEN 1 AND 65535", name="rocketmq_gateways_port"),
        schema="txlog",
    )


def downgrade() -> None:
    op.drop_table("rocketmq_gateways", schema="txlog")
