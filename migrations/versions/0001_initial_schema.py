"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# The views as this revision created them (later revisions replace them with their own copies).
PARTITION_STATUS = """
CREATE OR REPLACE VIEW txlog.partition_status AS
SELECT p.topic,
       p.partition,
       p.log_start_offset,
       p.next_offset AS high_watermark,
       COALESCE(o.first_open_offset, p.next_offset) AS last_stable_offset,
       COALESCE(o.open_transactions, 0) AS open_transactions
FROM txlog.partitions p
LEFT JOIN LATERAL (
    SELECT min(pp.txn_first_offset) AS first_open_offset, count(*) AS open_transactions
    FROM txlog.producer_partitions pp
    WHERE pp.topic = p.topic AND pp.partition = p.partition AND pp.txn_first_offset IS NOT NULL
) o ON true
"""

# Exactly what a read_committed reader may see: below the last stable offset, control records
# excluded, records of aborted transactions (found in the aborted-transaction index) excluded.
COMMITTED_RECORDS = """
CREATE OR REPLACE VIEW txlog.committed_records AS
SELECT r.topic,
       r.partition,
       r."offset",
       r.key,
       r.value,
       r.headers,
       r."timestamp",
       r.producer_id
FROM txlog.records r
JOIN txlog.partition_status s ON s.topic = r.topic AND s.partition = r.partition
WHERE r."offset" < s.last_stable_offset
  AND r."offset" >= s.log_start_offset
  AND r.control_type IS NULL
  AND NOT (r.is_transactional AND EXISTS (
        SELECT 1 FROM txlog.aborted_txns a
        WHERE a.topic = r.topic AND a.partition = r.partition
          AND a.producer_id = r.producer_id AND a.producer_epoch = r.producer_epoch))
"""

TRANSACTION_STATE = """
CREATE OR REPLACE VIEW txlog.transaction_state AS
SELECT transactional_id, producer_id, producer_epoch, state, timeout_ms, started_at, updated_at,
       coordinator, partitions, groups, last_producer_id, last_producer_epoch, last_result, fence_reason
FROM txlog.transactions
"""

VIEWS = [PARTITION_STATUS, COMMITTED_RECORDS, TRANSACTION_STATE]
DROP_VIEWS = [
    "DROP VIEW IF EXISTS txlog.transaction_state",
    "DROP VIEW IF EXISTS txlog.committed_records",
    "DROP VIEW IF EXISTS txlog.partition_status",
]


def upgrade() -> None:
    op.create_table(
        "aborted_txns",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("first_offset", sa.BigInteger(), nullable=False),
        sa.Column("last_offset", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("topic", "partition", "producer_id", "producer_epoch"),
        schema="txlog",
    )
    op.create_table(
        "group_offsets",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "topic", "partition"),
        schema="txlog",
    )
    op.create_table(
        "pending_group_offsets",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("transactional_id", sa.Text(), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("metadata", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("committed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "topic", "partition", "transactional_id"),
        schema="txlog",
    )
    op.create_index("pending_group_offsets_txn", "pending_group_offsets", ["transactional_id"], unique=False, schema="txlog")
    op.create_table(
        "producer_partitions",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("batches", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("txn_first_offset", sa.BigInteger(), nullable=True),
        sa.Column("last_timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("topic", "partition", "producer_id"),
        schema="txlog",
    )
    op.create_index(
        "producer_partitions_last_timestamp",
        "producer_partitions",
        ["last_timestamp"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("txn_first_offset IS NULL"),
    )
    op.create_index(
        "producer_partitions_open_txn",
        "producer_partitions",
        ["topic", "partition", "txn_first_offset"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("txn_first_offset IS NOT NULL"),
    )
    op.create_table(
        "records",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=True),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=True),
        sa.Column("sequence", sa.Integer(), nullable=True),
        sa.Column("is_transactional", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("control_type", sa.SmallInteger(), nullable=True),
        sa.PrimaryKeyConstraint("topic", "partition", "offset"),
        schema="txlog",
    )
    op.create_table(
        "topics",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("partitions", sa.Integer(), nullable=False),
        sa.Column("config", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("partitions > 0", name="topics_partitions_positive"),
        sa.PrimaryKeyConstraint("name"),
        schema="txlog",
    )
    op.create_table(
        "transaction_events",
        sa.Column("transactional_id", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("timeout_ms", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "partitions_added", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("groups_added", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("last_producer_id", sa.BigInteger(), nullable=True),
        sa.Column("last_producer_epoch", sa.SmallInteger(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("transactional_id", "version"),
        schema="txlog",
    )
    op.create_table(
        "transactions",
        sa.Column("transactional_id", sa.Text(), nullable=False),
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("producer_epoch", sa.SmallInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("timeout_ms", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("epoch_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("partitions", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("groups", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("last_producer_id", sa.BigInteger(), nullable=True),
        sa.Column("last_producer_epoch", sa.SmallInteger(), nullable=True),
        sa.Column("last_result", sa.Text(), nullable=True),
        sa.Column("fence_reason", sa.Text(), nullable=True),
        sa.Column("coordinator", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("transactional_id"),
        schema="txlog",
    )
    op.create_index(
        "transactions_deadline",
        "transactions",
        ["deadline"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("state = 'Ongoing'"),
    )
    op.create_index(
        "transactions_idle",
        "transactions",
        ["updated_at"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("state IN ('Empty', 'CompleteCommit', 'CompleteAbort', 'Dead')"),
    )
    op.create_index(
        "transactions_prepared",
        "transactions",
        ["updated_at"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("state IN ('PrepareCommit', 'PrepareAbort')"),
    )
    op.create_index("transactions_producer_id", "transactions", ["producer_id"], unique=False, schema="txlog")
    op.create_index("transactions_state_started", "transactions", ["state", "started_at"], unique=False, schema="txlog")
    op.create_table(
        "partitions",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("log_start_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.ForeignKeyConstraint(["topic"], ["txlog.topics.name"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("topic", "partition"),
        schema="txlog",
    )
    op.execute(sa.schema.CreateSequence(sa.Sequence("producer_id_seq", schema="txlog", start=1000)))
    for statement in VIEWS:
        op.execute(statement)


def downgrade() -> None:
    for statement in DROP_VIEWS:
        op.execute(statement)
    op.execute(sa.schema.DropSequence(sa.Sequence("producer_id_seq", schema="txlog")))
    op.drop_table("partitions", schema="txlog")
    op.drop_index("transactions_state_started", table_name="transactions", schema="txlog")
    op.drop_index("transactions_producer_id", table_name="transactions", schema="txlog")
    op.drop_index(
        "transactions_prepared",
        table_name="transactions",
        schema="txlog",
        postgresql_where=sa.text("state IN ('PrepareCommit', 'PrepareAbort')"),
    )
    op.drop_index(
        "transactions_idle",
        table_name="transactions",
        schema="txlog",
        postgresql_where=sa.text("state IN ('Empty', 'CompleteCommit', 'CompleteAbort', 'Dead')"),
    )
    op.drop_index(
        "transactions_deadline", table_name="transactions", schema="txlog", postgresql_where=sa.text("state = 'Ongoing'")
    )
    op.drop_table("transactions", schema="txlog")
    op.drop_table("transaction_events", schema="txlog")
    op.drop_table("topics", schema="txlog")
    op.drop_table("records", schema="txlog")
    op.drop_index(
        "producer_partitions_open_txn",
        table_name="producer_partitions",
        schema="txlog",
        postgresql_where=sa.text("txn_first_offset IS NOT NULL"),
    )
    op.drop_index(
        "producer_partitions_last_timestamp",
        table_name="producer_partitions",
        schema="txlog",
        postgresql_where=sa.text("txn_first_offset IS NULL"),
    )
    op.drop_table("producer_partitions", schema="txlog")
    op.drop_index("pending_group_offsets_txn", table_name="pending_group_offsets", schema="txlog")
    op.drop_table("pending_group_offsets", schema="txlog")
    op.drop_table("group_offsets", schema="txlog")
    op.drop_table("aborted_txns", schema="txlog")
