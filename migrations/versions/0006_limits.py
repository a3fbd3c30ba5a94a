"""the principal that started each open transaction, for the open-transactions-per-principal limit

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("transactions", sa.Column("principal", sa.Text(), nullable=True), schema="txlog")
    op.create_index(
        "transactions_open_by_principal",
        "transactions",
        ["principal"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("state IN ('Ongoing', 'PrepareCommit', 'PrepareAbort') AND principal IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("transactions_open_by_principal", table_name="transactions", schema="txlog")
    op.drop_column("transactions", "principal", schema="txlog")
