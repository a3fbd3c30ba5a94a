"""Half messages name the channel their check-backs take: ``http`` (the producer group's
check-back URL, as before) or ``rocketmq`` (RecoverOrphanedTransactionCommand on a live RocketMQ
producer's Telemetry stream, sent by a RocketMQ gateway). Each checker claims only its own
channel's due half messages, so neither spends the other's checks.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("half_messages", sa.Column("check_channel", sa.Text(), nullable=False, server_default="http"), schema="txlog")
    op.create_check_constraint(
        "half_messages_check_channel", "half_messages", "check_channel IN ('http', 'rocketmq')", schema="txlog"
    )
    op.drop_index("half_messages_due", table_name="half_messages", schema="txlog")
    op.create_index(
        "half_messages_due",
        "half_messages",
        ["check_channel", "next_check_at"],
        schema="txlog",
        postgresql_where=sa.text("state = 'Prepared'"),
    )


def downgrade() -> None:
    op.drop_index("half_messages_due", table_name="half_messages", schema="txlog")
    op.create_index(
        "half_messages_due", "half_messages", ["next_check_at"], schema="txlog", postgresql_where=sa.text("state = 'Prepared'")
    )
    op.drop_constraint("half_messages_check_channel", "half_messages", schema="txlog")
    op.drop_column("half_messages", "check_channel", schema="txlog")
