"""principals with API tokens, Kafka's ACLs, and the version row every server process polls

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "principals",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("token_id", sa.Text(), nullable=False),
        sa.Column("token_hash", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("token_id"),
        schema="txlog",
    )
    op.create_table(
        "acls",
        sa.Column("principal", sa.Text(), nullable=False),
        sa.Column("resource_type", sa.Text(), nullable=False),
        sa.Column("resource_name", sa.Text(), nullable=False),
        sa.Column("pattern_type", sa.Text(), nullable=False),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("permission_type", sa.Text(), nullable=False),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("resource_type IN ('topic', 'group', 'transactional_id', 'cluster')", name="acls_resource_type"),
        sa.CheckConstraint("pattern_type IN ('literal', 'prefixed')", name="acls_pattern_type"),
        sa.CheckConstraint(
            "operation IN ('All', 'Read', 'Write', 'Create', 'Delete', 'Alter', 'Describe', 'IdempotentWrite')",
            name="acls_operation",
        ),
        sa.CheckConstraint("permission_type IN ('allow', 'deny')", name="acls_permission_type"),
        sa.PrimaryKeyConstraint("principal", "resource_type", "resource_name", "pattern_type", "operation", "permission_type"),
        schema="txlog",
    )
    op.create_table(
        "security_version",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("session_key", sa.LargeBinary(), nullable=True),
        sa.CheckConstraint("id = 1", name="security_version_one_row"),
        sa.PrimaryKeyConstraint("id"),
        schema="txlog",
    )
    op.execute("INSERT INTO txlog.security_version (id, version) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("security_version", schema="txlog")
    op.drop_table("acls", schema="txlog")
    op.drop_table("principals", schema="txlog")
