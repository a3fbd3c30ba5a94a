"""log and coordinator v2: aborted transactions keyed by offset range, headers as Kafka has them,
log positions for retention, producer ids of transactional ids (fencing on every partition), a
transaction's partitions and groups in rows of their own

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# The views as this revision creates them (a later revision that changes them carries its own copy).
# The log with what became of each record's transaction. THE definition of "aborted", used by the
# HTTP fetch, txlog.committed_records, the Spark reader and the admin record browser alike: a
# transactional record is aborted when an aborted range of its producer id on its partition
# (Kafka's .txnindex, keyed by offset range) contains its offset. A producer's ranges on a partition
# never overlap and a transaction's records all carry its first offset (txn_first_offset), so the
# range containing a record is the one keyed (producer id, txn_first_offset): an equality on the
# index's primary key, which PostgreSQL serves as a probe per record for a page and as one hash
# join for a bulk read, and leaves out entirely when ``aborted`` is not asked for.
LOG_RECORDS = """
CREATE OR REPLACE VIEW txlog.log_records AS
SELECT r.topic,
       r.partition,
       r."offset",
       r.key,
       r.value,
       r.headers,
       r.header_keys,
       r.header_values,
       r."timestamp",
       r.producer_id,
       r.producer_epoch,
       r.sequence,
       r.is_transactional,
       r.control_type,
       r.position,
       r.txn_first_offset,
       a.producer_id IS NOT NULL AS aborted
FROM txlog.records r
LEFT JOIN txlog.aborted_txns a
  ON a.topic = r.topic AND a.partition = r.partition AND a.producer_id = r.producer_id
 AND a.first_offset = r.txn_first_offset
"""

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

# Exactly what a read_committed reader may see: from the log start to the last stable offset,
# control records excluded, aborted records (txlog.log_records.aborted) excluded.
COMMITTED_RECORDS = """
CREATE OR REPLACE VIEW txlog.committed_records AS
SELECT r.topic,
       r.partition,
       r."offset",
       r.key,
       r.value,
       r.headers,
       r."timestamp",
       r.producer_id,
       r.header_keys,
       r.header_values
FROM txlog.log_records r
JOIN txlog.partition_status s ON s.topic = r.topic AND s.partition = r.partition
WHERE r."offset" < s.last_stable_offset
  AND r."offset" >= s.log_start_offset
  AND r.control_type IS NULL
  AND NOT r.aborted
"""

TRANSACTION_STATE = """
CREATE OR REPLACE VIEW txlog.transaction_state AS
SELECT t.transactional_id, t.producer_id, t.producer_epoch, t.state, t.timeout_ms, t.started_at, t.updated_at,
       t.coordinator,
       COALESCE((SELECT jsonb_agg(jsonb_build_array(m.topic, m.partition) ORDER BY m.topic, m.partition)
                 FROM txlog.transaction_partitions m WHERE m.transactional_id = t.transactional_id),
                '[]'::jsonb) AS partitions,
       COALESCE((SELECT jsonb_agg(g.group_id ORDER BY g.group_id)
                 FROM txlog.transaction_groups g WHERE g.transactional_id = t.transactional_id),
                '[]'::jsonb) AS groups,
       t.last_producer_id, t.last_producer_epoch, t.last_result, t.fence_reason
FROM txlog.transactions t
"""

VIEWS = [LOG_RECORDS, PARTITION_STATUS, COMMITTED_RECORDS, TRANSACTION_STATE]
DROP_VIEWS = [
    "DROP VIEW IF EXISTS txlog.transaction_state",
    "DROP VIEW IF EXISTS txlog.committed_records",
    "DROP VIEW IF EXISTS txlog.partition_status",
    "DROP VIEW IF EXISTS txlog.log_records",
]


# The size of a data record as txlog counts it (key + value + header keys and values), for the
# positions of the records already in the log.
_RECORD_SIZE = """
CASE WHEN control_type IS NOT NULL THEN 0 ELSE
    COALESCE(octet_length(key), 0) + COALESCE(octet_length(value), 0)
    + COALESCE((SELECT sum(octet_length(h.k) + COALESCE(octet_length(h.v), 0))
                FROM unnest(header_keys, header_values) AS h(k, v)), 0)
END
"""


def upgrade() -> None:
    for statement in (
        "DROP VIEW IF EXISTS txlog.transaction_state",
        "DROP VIEW IF EXISTS txlog.committed_records",
        "DROP VIEW IF EXISTS txlog.partition_status",
    ):
        op.execute(statement)

    # Aborted transactions: keyed by offset range, as Kafka's .txnindex.
    op.drop_constraint("aborted_txns_pkey", "aborted_txns", schema="txlog", type_="primary")
    op.create_primary_key(
        "aborted_txns_pkey", "aborted_txns", ["topic", "partition", "producer_id", "first_offset"], schema="txlog"
    )
    op.create_index(
        "aborted_txns_last_offset", "aborted_txns", ["topic", "partition", "last_offset"], unique=False, schema="txlog"
    )

    # Headers as an ordered list of (key, value); log positions.
    op.add_column("records", sa.Column("header_keys", postgresql.ARRAY(sa.Text()), nullable=True), schema="txlog")
    op.add_column("records", sa.Column("header_values", postgresql.ARRAY(sa.LargeBinary()), nullable=True), schema="txlog")
    op.add_column("records", sa.Column("position", sa.BigInteger(), server_default=sa.text("0"), nullable=False), schema="txlog")
    op.add_column("records", sa.Column("txn_first_offset", sa.BigInteger(), nullable=True), schema="txlog")
    # Each transactional record's transaction: its producer's records on the partition between two
    # of its markers (a marker closes the transaction it follows); the first offset names it.
    op.execute(
        """
        UPDATE txlog.records r SET txn_first_offset = t.first
        FROM (
            SELECT topic, partition, "offset",
                   min("offset") OVER (PARTITION BY topic, partition, producer_id, n) AS first
            FROM (
                SELECT topic, partition, "offset", producer_id,
                       COALESCE(sum(CASE WHEN control_type IS NOT NULL THEN 1 ELSE 0 END) OVER (
                           PARTITION BY topic, partition, producer_id ORDER BY "offset"
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS n
                FROM txlog.records WHERE is_transactional
            ) numbered
        ) t
        WHERE r.topic = t.topic AND r.partition = t.partition AND r."offset" = t."offset"
        """
    )
    op.add_column(
        "partitions", sa.Column("next_position", sa.BigInteger(), server_default=sa.text("0"), nullable=False), schema="txlog"
    )
    op.add_column(
        "partitions",
        sa.Column("stored_start_offset", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        schema="txlog",
    )
    op.execute(
        """
        UPDATE txlog.records r SET header_keys = h.keys, header_values = h.vals
        FROM (
            SELECT r2.topic, r2.partition, r2."offset",
                   array_agg(e.key ORDER BY e.key) AS keys,
                   array_agg(convert_to(e.value, 'UTF8') ORDER BY e.key) AS vals
            FROM txlog.records r2, jsonb_each_text(r2.headers) AS e
            WHERE r2.headers IS NOT NULL AND jsonb_typeof(r2.headers) = 'object'
            GROUP BY r2.topic, r2.partition, r2."offset"
        ) h
        WHERE r.topic = h.topic AND r.partition = h.partition AND r."offset" = h."offset"
        """
    )
    op.execute(
        f"""
        UPDATE txlog.records r SET position = s.position
        FROM (
            SELECT topic, partition, "offset",
                   sum(size) OVER (PARTITION BY topic, partition ORDER BY "offset") - size AS position
            FROM (SELECT topic, partition, "offset", {_RECORD_SIZE} AS size FROM txlog.records) sized
        ) s
        WHERE r.topic = s.topic AND r.partition = s.partition AND r."offset" = s."offset" AND s.position <> 0
        """
    )
    op.execute(
        f"""
        UPDATE txlog.partitions p SET next_position = s.total
        FROM (SELECT topic, partition, sum({_RECORD_SIZE}) AS total FROM txlog.records GROUP BY topic, partition) s
        WHERE p.topic = s.topic AND p.partition = s.partition
        """
    )

    # The producer ids of transactional ids.
    op.create_table(
        "producer_ids",
        sa.Column("producer_id", sa.BigInteger(), nullable=False),
        sa.Column("transactional_id", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retire_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("producer_id"),
        schema="txlog",
    )
    op.create_index("producer_ids_transactional_id", "producer_ids", ["transactional_id"], unique=False, schema="txlog")
    op.create_index(
        "producer_ids_retired",
        "producer_ids",
        ["retired_at"],
        unique=False,
        schema="txlog",
        postgresql_where=sa.text("retired_at IS NOT NULL"),
    )
    op.execute(
        """
        INSERT INTO txlog.producer_ids (producer_id, transactional_id, created_at)
        SELECT producer_id, transactional_id, epoch_changed_at FROM txlog.transactions
        ON CONFLICT DO NOTHING
        """
    )
    op.execute(
        """
        INSERT INTO txlog.producer_ids (producer_id, transactional_id, created_at, retired_at, retire_reason)
        SELECT last_producer_id, transactional_id, updated_at, updated_at, 'newer_epoch' FROM txlog.transactions
        WHERE last_producer_id IS NOT NULL AND last_producer_id <> producer_id
        ON CONFLICT DO NOTHING
        """
    )

    # A transaction's partitions and groups: a row each.
    op.create_table(
        "transaction_partitions",
        sa.Column("transactional_id", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("transactional_id", "topic", "partition"),
        schema="txlog",
    )
    op.create_table(
        "transaction_groups",
        sa.Column("transactional_id", sa.Text(), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("transactional_id", "group_id"),
        schema="txlog",
    )
    op.execute(
        """
        INSERT INTO txlog.transaction_partitions (transactional_id, topic, partition)
        SELECT t.transactional_id, e->>0, (e->>1)::int FROM txlog.transactions t, jsonb_array_elements(t.partitions) e
        ON CONFLICT DO NOTHING
        """
    )
    op.execute(
        """
        INSERT INTO txlog.transaction_groups (transactional_id, group_id)
        SELECT t.transactional_id, g FROM txlog.transactions t, jsonb_array_elements_text(t.groups) g
        ON CONFLICT DO NOTHING
        """
    )
    op.drop_column("transactions", "partitions", schema="txlog")
    op.drop_column("transactions", "groups", schema="txlog")
    op.add_column(
        "transactions",
        sa.Column("transaction_version", sa.SmallInteger(), server_default=sa.text("2"), nullable=False),
        schema="txlog",
    )
    op.add_column(
        "transaction_events",
        sa.Column("transaction_version", sa.SmallInteger(), server_default=sa.text("2"), nullable=False),
        schema="txlog",
    )

    for statement in VIEWS:
        op.execute(statement)


def downgrade() -> None:
    for statement in DROP_VIEWS:
        op.execute(statement)
    op.add_column(
        "transactions",
        sa.Column("partitions", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        schema="txlog",
    )
    op.add_column(
        "transactions",
        sa.Column("groups", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False),
        schema="txlog",
    )
    op.execute(
        """
        UPDATE txlog.transactions t SET
            partitions = COALESCE((SELECT jsonb_agg(jsonb_build_array(m.topic, m.partition) ORDER BY m.topic, m.partition)
                                   FROM txlog.transaction_partitions m WHERE m.transactional_id = t.transactional_id), '[]'::jsonb),
            groups = COALESCE((SELECT jsonb_agg(g.group_id ORDER BY g.group_id)
                               FROM txlog.transaction_groups g WHERE g.transactional_id = t.transactional_id), '[]'::jsonb)
        """
    )
    op.drop_column("transaction_events", "transaction_version", schema="txlog")
    op.drop_column("transactions", "transaction_version", schema="txlog")
    op.drop_table("transaction_groups", schema="txlog")
    op.drop_table("transaction_partitions", schema="txlog")
    op.drop_index(
        "producer_ids_retired", table_name="producer_ids", schema="txlog", postgresql_where=sa.text("retired_at IS NOT NULL")
    )
    op.drop_index("producer_ids_transactional_id", table_name="producer_ids", schema="txlog")
    op.drop_table("producer_ids", schema="txlog")
    op.drop_column("partitions", "stored_start_offset", schema="txlog")
    op.drop_column("partitions", "next_position", schema="txlog")
    op.drop_column("records", "txn_first_offset", schema="txlog")
    op.drop_column("records", "position", schema="txlog")
    op.drop_column("records", "header_values", schema="txlog")
    op.drop_column("records", "header_keys", schema="txlog")
    op.drop_index("aborted_txns_last_offset", table_name="aborted_txns", schema="txlog")
    op.drop_constraint("aborted_txns_pkey", "aborted_txns", schema="txlog", type_="primary")
    # Ranges of one epoch beyond the first do not fit the old key: keep the first.
    op.execute(
        """
        DELETE FROM txlog.aborted_txns a USING txlog.aborted_txns b
        WHERE a.topic = b.topic AND a.partition = b.partition AND a.producer_id = b.producer_id
          AND a.producer_epoch = b.producer_epoch AND a.first_offset > b.first_offset
        """
    )
    op.create_primary_key(
        "aborted_txns_pkey", "aborted_txns", ["topic", "partition", "producer_id", "producer_epoch"], schema="txlog"
    )
    for statement in context.script.get_revision("0001").module.VIEWS:
        op.execute(statement)
