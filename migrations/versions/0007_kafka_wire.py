"""Kafka wire gateway: topic ids, the cluster id, and the registry of gateway nodes

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    # A volatile default is evaluated for each existing row: every topic gets its own random id.
    op.add_column(
        "topics",
        sa.Column("topic_id", postgresql.UUID(as_uuid=True), server_default=sa.text("gen_random_uuid()"), nullable=False),
        schema="txlog",
    )
    op.create_unique_constraint("topics_topic_id_key", "topics", ["topic_id"], schema="txlog")
    op.create_table(
        "cluster",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("cluster_id", sa.Text(), nullable=False),
        sa.Column("created_at", TS, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name="cluster_one_row"),
        sa.PrimaryKeyConstraint("id"),
        schema="txlog",
    )
    # Kafka's form of a cluster id: a random UUID in URL-safe base64 without padding (22 characters).
    op.execute(
        "INSERT INTO txlog.cluster (id, cluster_id) "
        "VALUES (1, translate(rtrim(encode(uuid_send(gen_random_uuid()), 'base64'), '='), '+/', '-_'))"
    )
    op.create_table(
        "kafka_nodes",
        sa.Column("node_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("process_token", sa.Text(), nullable=False),
        sa.Column("registered_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.CheckConstraint("node_id >= 0", name="kafka_nodes_node_id"),
        sa.CheckConstraint("port BETWEEN 1 AND 65535", name="kafka_nodes_port"),
        sa.PrimaryKeyConstraint("node_id"),
        schema="txlog",
    )


def downgrade() -> None:
    op.drop_table("kafka_nodes", schema="txlog")
    op.drop_table("cluster", schema="txlog")
    op.drop_constraint("topics_topic_id_key", "topics", schema="txlog", type_="unique")
    op.drop_column("topics", "topic_id", schema="txlog")
