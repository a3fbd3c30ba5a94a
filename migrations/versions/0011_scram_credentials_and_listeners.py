"""SCRAM credentials of principals; each gateway's listeners in the node registry

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'scram_credentials',
        sa.Column('principal', sa.Text(), nullable=False),
        sa.Column('mechanism', sa.Text(), nullable=False),
        sa.Column('salt', sa.LargeBinary(), nullable=False),
        sa.Column('iterations', sa.Integer(), nullable=False),
        sa.Column('stored_key', sa.LargeBinary(), nullable=False),
        sa.Column('server_key', sa.LargeBinary(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("mechanism IN ('SCRAM-SHA-256', 'SCRAM-SHA-512')", name='scram_credentials_mechanism'),
        sa.CheckConstraint('iterations BETWEEN 4096 AND 16384', name='scram_credentials_iterations'),
        sa.ForeignKeyConstraint(['principal'], ['txlog.principals.name'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('principal', 'mechanism'),
        schema='txlog',
    )
    op.add_column(
        'kafka_nodes',
        sa.Column('listeners', postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        schema='txlog',
    )


def downgrade() -> None:
    op.drop_column('kafka_nodes', 'listeners', schema='txlog')
    op.drop_table('scram_credentials', schema='txlog')
