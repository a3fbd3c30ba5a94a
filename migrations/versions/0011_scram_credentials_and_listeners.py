"""SCRAM credentials of principals; each gateway's listeners in the node registry; Kafka's
DescribeConfigs, AlterConfigs and ClusterAction operations in ACLs

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scram_credentials",
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("mechanism", sa.Text(), nullable=False),
        sa.Column("salt", sa.LargeBinary(), nullable=False),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("stored_key", sa.LargeBinary(), nullable=False),
        sa.Column("server_key", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("mechanism IN ('SCRAM-SHA-256', 'SCRAM-SHA-512')", name="scram_credentials_mechanism"),
        sa.CheckConstraint("iterations BETWEEN 4096 AND 16384", name="scram_credentials_iterations"),
        sa.ForeignKeyConstraint(["principal"], ["txlog.principals.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("principal", "mechanism"),
        schema="txlog",
    )
    op.add_column(
        "kafka_nodes",
        sa.Column("listeners", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        schema="txlog",
    )
    _operations(OPERATIONS + ("DescribeConfigs", "AlterConfigs", "ClusterAction"))


OPERATIONS = ("All", "Read", "Write", "Create", "Delete", "Alter", "Describe", "IdempotentWrite")


def _operations(names: tuple[str, ...]) -> None:
    op.drop_constraint("acls_operation", "acls", schema="txlog")
    op.create_check_constraint("acls_operation", "acls", f"operation IN ({', '.join(repr(n) for n in names)})", schema="txlog")


def downgrade() -> None:
    op.execute("DELETE FROM txlog.acls WHERE operation IN ('DescribeConfigs', 'AlterConfigs', 'ClusterAction')")
    _operations(OPERATIONS)
    op.drop_column("kafka_nodes", "listeners", schema="txlog")
    op.drop_table("scram_credentials", schema="txlog")
