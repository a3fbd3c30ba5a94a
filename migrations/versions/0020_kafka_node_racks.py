"""Each gateway node's rack (Kafka's broker.rack) and whether it is a read replica: a gateway that
serves Fetch and ListOffsets from a hot standby, follows every partition and leads none (KIP-392)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kafka_nodes", sa.Column("rack", sa.Text(), nullable=True), schema="txlog")
    op.add_column(
        "kafka_nodes", sa.Column("read_replica", sa.Boolean(), server_default=sa.text("false"), nullable=False), schema="txlog"
    )


def downgrade() -> None:
    op.drop_column("kafka_nodes", "read_replica", schema="txlog")
    op.drop_column("kafka_nodes", "rack", schema="txlog")
