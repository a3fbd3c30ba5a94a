"""The schema, declared once with SQLAlchemy Core. Alembic migrations are written from it and a
test fails if the two drift apart. Everything lives in the PostgreSQL schema ``txlog``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Sequence,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

SCHEMA = "txlog"
metadata = MetaData(schema=SCHEMA)

TS = DateTime(timezone=True)

topics = Table(
    "topics",
    metadata,
    Column("name", Text, primary_key=True),
    Column("partitions", Integer, nullable=False),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    CheckConstraint("partitions > 0", name="topics_partitions_positive"),
)

# One row per topic partition. Its row lock is the append lock: offsets are assigned while it is
# held and it is held until commit, so offsets become visible in order (no holes for readers).
partitions = Table(
    "partitions",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("log_start_offset", BigInteger, nullable=False, server_default=text("0")),
    Column("next_offset", BigInteger, nullable=False, server_default=text("0")),  # the high watermark
    PrimaryKeyConstraint("topic", "partition"),
    ForeignKeyConstraint(["topic"], ["txlog.topics.name"], ondelete="CASCADE"),
)

# The partition logs. Data records and control records (transaction markers) share the offset space.
records = Table(
    "records",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("headers", JSONB),
    Column("timestamp", TS, nullable=False),
    Column("producer_id", BigInteger),
    Column("producer_epoch", SmallInteger),
    Column("sequence", Integer),
    Column("is_transactional", Boolean, nullable=False, server_default=text("false")),
    Column("control_type", SmallInteger),  # NULL for data; 0 ABORT, 1 COMMIT (Kafka's ControlRecordType)
    PrimaryKeyConstraint("topic", "partition", "offset"),
)

# Kafka's ProducerStateEntry: per partition and producer id, the epoch, the last five batches and
# the first offset of the producer's open transaction on the partition (which bounds the LSO).
producer_partitions = Table(
    "producer_partitions",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("batches", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("txn_first_offset", BigInteger),
    Column("last_timestamp", TS, nullable=False),
    PrimaryKeyConstraint("topic", "partition", "producer_id"),
    Index(
        "producer_partitions_open_txn",
        "topic",
        "partition",
        "txn_first_offset",
        postgresql_where=text("txn_first_offset IS NOT NULL"),
    ),
    Index("producer_partitions_last_timestamp", "last_timestamp", postgresql_where=text("txn_first_offset IS NULL")),
)

# Kafka's transaction index (.txnindex): one row per aborted transaction per partition.
# With a fresh epoch per transaction, (producer id, epoch) names a transaction exactly.
aborted_txns = Table(
    "aborted_txns",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),  # the ABORT marker's offset
    PrimaryKeyConstraint("topic", "partition", "producer_id", "producer_epoch"),
)

producer_id_seq = Sequence("producer_id_seq", metadata=metadata, start=1000)

# The transaction coordinator's current state per transactional id: the fold of its events.
transactions = Table(
    "transactions",
    metadata,
    Column("transactional_id", Text, primary_key=True),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("state", Text, nullable=False),
    Column("timeout_ms", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("started_at", TS),
    Column("updated_at", TS, nullable=False),
    Column("epoch_changed_at", TS, nullable=False),
    Column("deadline", TS),  # started_at + timeout while Ongoing: what the sweeper looks for
    Column("partitions", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("groups", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("last_producer_id", BigInteger),
    Column("last_producer_epoch", SmallInteger),
    Column("last_result", Text),
    Column("fence_reason", Text),
    Column("coordinator", Integer, nullable=False),
    Index("transactions_producer_id", "producer_id"),
    Index("transactions_state_started", "state", "started_at"),
    Index("transactions_deadline", "deadline", postgresql_where=text("state = 'Ongoing'")),
    Index("transactions_prepared", "updated_at", postgresql_where=text("state IN ('PrepareCommit', 'PrepareAbort')")),
    Index("transactions_idle", "updated_at", postgresql_where=text("state IN ('Empty', 'CompleteCommit', 'CompleteAbort', 'Dead')")),
)

# Append-only history: one row per transition, keyed by (transactional id, version) so a second
# writer of the same version fails on the primary key.
transaction_events = Table(
    "transaction_events",
    metadata,
    Column("transactional_id", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("from_state", Text),
    Column("to_state", Text, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("timeout_ms", Integer, nullable=False),
    Column("at", TS, nullable=False),
    Column("partitions_added", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("groups_added", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("last_producer_id", BigInteger),
    Column("last_producer_epoch", SmallInteger),
    Column("result", Text),
    Column("reason", Text),
    PrimaryKeyConstraint("transactional_id", "version"),
)

group_offsets = Table(
    "group_offsets",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("metadata", Text, nullable=False, server_default=text("''")),
    Column("committed_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("group_id", "topic", "partition"),
)

# TxnOffsetCommit: offsets waiting for their transaction's outcome (applied on commit, dropped on abort).
pending_group_offsets = Table(
    "pending_group_offsets",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("transactional_id", Text, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("producer_epoch", SmallInteger, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("metadata", Text, nullable=False, server_default=text("''")),
    Column("committed_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("group_id", "topic", "partition", "transactional_id"),
    Index("pending_group_offsets_txn", "transactional_id"),
)
