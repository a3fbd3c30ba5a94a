"""Half messages gain a third check channel, ``delay``: RocketMQ's delayed messages, held as half
messages whose next check is their delivery time, committed (not checked back) when it comes.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("half_messages_check_channel", "half_messages", schema="txlog")
    op.create_check_constraint(
        "half_messages_check_channel", "half_messages", "check_channel IN ('http', 'rocketmq', 'delay')", schema="txlog"
    )


def downgrade() -> None:
    # Delivered (or decided) delayed messages are kept as the older schema can name them; one not
    # yet delivered has no place there, and the constraint below refuses the downgrade.
    op.execute("UPDATE txlog.half_messages SET check_channel = 'rocketmq' WHERE check_channel = 'delay' AND state <> 'Prepared'")
    op.drop_constraint("half_messages_check_channel", "half_messages", schema="txlog")
    op.create_check_constraint(
        "half_messages_check_channel", "half_messages", "check_channel IN ('http', 'rocketmq')", schema="txlog"
    )
