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
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Sequence,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from app.storage._sql import IDLE_STATES_SQL, ONGOING_SQL, OPEN_STATES_SQL, PREPARED_STATES_SQL

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
    # Kafka's topic id (Metadata v10+, CreateTopics v7+): random, fixed when the topic is created.
    Column("topic_id", UUID(as_uuid=True), nullable=False, server_default=text("gen_random_uuid()")),
    CheckConstraint("partitions > 0", name="topics_partitions_positive"),
    UniqueConstraint("topic_id", name="topics_topic_id_key"),
)

# The topic catalogue's version (one row): counted up by a trigger (migration 0019) in every
# transaction that creates or deletes a topic or changes its partition count. A consumer group
# subscribed by regular expression reads every topic again only when it moved.
topics_version = Table(
    "topics_version",
    metadata,
    Column("one", Boolean, primary_key=True, server_default=text("true")),
    Column("version", BigInteger, nullable=False, server_default=text("0")),
    CheckConstraint("one", name="topics_version_one_row"),
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
    # Bytes of data records appended so far (key + value + headers): records.position of the next
    # record. next_position - position(o) is the size of the log from offset o (retention.bytes).
    Column("next_position", BigInteger, nullable=False, server_default=text("0")),
    # Records below this offset are deleted (retention trails log_start_offset, in batches).
    Column("stored_start_offset", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("topic", "partition"),
    ForeignKeyConstraint(["topic"], ["txlog.topics.name"], ondelete="CASCADE"),
)

# The partitions of deleted topics whose records are still stored: DeleteTopics removes the topic
# and its partitions at once, and the records from ``stored_start_offset`` to ``end_offset`` go a
# batch per database transaction after it (``retention.trim``). The name can be created again once
# its rows here are gone (until then: Kafka's "marked for deletion"), so a new topic's offsets,
# which start at 0, never meet an old record.
deleted_partitions = Table(
    "deleted_partitions",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("stored_start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("topic_id", UUID(as_uuid=True), nullable=False),
    Column("deleted_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("topic", "partition"),
)

# Partitions some process has long-polling fetches waiting on, until ``expires_at`` (a lease the
# process renews while they wait). An append notifies (NOTIFY txlog_append) only when its partition
# has a live lease, so appends nobody waits for take no notify lock and wake nobody.
fetch_listeners = Table(
    "fetch_listeners",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("expires_at", TS, nullable=False),
    PrimaryKeyConstraint("topic", "partition"),
    ForeignKeyConstraint(["topic", "partition"], ["txlog.partitions.topic", "txlog.partitions.partition"], ondelete="CASCADE"),
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
    # Kafka's headers exactly: an ordered list of (key, value) pairs, keys may repeat, values are
    # bytes or null. ``headers`` is the same list as a JSON object for convenience (the last value
    # of each key, as UTF-8 text).
    Column("headers", JSONB),
    Column("header_keys", ARRAY(Text)),
    Column("header_values", ARRAY(LargeBinary)),
    Column("timestamp", TS, nullable=False),
    Column("producer_id", BigInteger),
    Column("producer_epoch", SmallInteger),
    Column("sequence", Integer),
    Column("is_transactional", Boolean, nullable=False, server_default=text("false")),
    Column("control_type", SmallInteger),  # NULL for data; 0 ABORT, 1 COMMIT (Kafka's ControlRecordType)
    # Bytes of data records before this one in the partition (Kafka's log position).
    Column("position", BigInteger, nullable=False, server_default=text("0")),
    # For a transactional record (a marker too): the first offset of its transaction on this
    # partition, so (producer_id, txn_first_offset) is the key of its range in aborted_txns.
    Column("txn_first_offset", BigInteger),
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

# Kafka's transaction index (.txnindex): one row per aborted transaction per partition, its offset
# range from the producer's first record in it to its ABORT marker. A producer's ranges on a
# partition never overlap, so "is offset o of producer p aborted?" is one probe: p's range with
# the largest first offset <= o, and whether it reaches o. Exact whatever the epochs: clients that
# keep one epoch for many transactions get one row per aborted transaction too.
aborted_txns = Table(
    "aborted_txns",
    metadata,
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),  # the ABORT marker's offset
    Column("producer_epoch", SmallInteger, nullable=False),  # the marker's epoch (for inspection)
    PrimaryKeyConstraint("topic", "partition", "producer_id", "first_offset"),
    Index("aborted_txns_last_offset", "topic", "partition", "last_offset"),  # retention drops ranges below the log start
)

producer_id_seq = Sequence("producer_id_seq", metadata=metadata, start=1000)

# The producer ids a transactional id has been given. A batch of a producer id found here is
# checked against its transactional id's current producer id and epoch wherever it is appended, so
# a fenced producer cannot write anywhere, with or without its transactional id. ``retired_at``:
# the id is no longer its transactional id's (epoch exhausted, or the transactional id expired);
# every epoch of it is fenced, for ``retire_reason``.
producer_ids = Table(
    "producer_ids",
    metadata,
    Column("producer_id", BigInteger, primary_key=True),
    Column("transactional_id", Text, nullable=False),
    Column("created_at", TS, nullable=False),
    Column("retired_at", TS),
    Column("retire_reason", Text),
    Index("producer_ids_transactional_id", "transactional_id"),
    Index("producer_ids_retired", "retired_at", postgresql_where=text("retired_at IS NOT NULL")),
)

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
    Column("last_producer_id", BigInteger),
    Column("last_producer_epoch", SmallInteger),
    Column("last_result", Text),
    Column("fence_reason", Text),
    Column("coordinator", Integer, nullable=False),
    # 2: each transaction gets its own epoch (KIP-890); 1: the producer keeps its epoch
    Column("transaction_version", SmallInteger, nullable=False, server_default=text("2")),
    # The principal whose request started the open transaction (null without authentication): what
    # TXLOG_MAX_OPEN_TRANSACTIONS_PER_PRINCIPAL counts.
    Column("principal", Text),
    Index("transactions_producer_id", "producer_id"),
    Index("transactions_state_started", "state", "started_at"),
    # The partial indexes name the domain's groups of states (the migrations that created them keep
    # their own literal copies, held equal to these by tests/migration).
    Index("transactions_deadline", "deadline", postgresql_where=text(f"state = {ONGOING_SQL}")),
    Index("transactions_prepared", "updated_at", postgresql_where=text(f"state IN {PREPARED_STATES_SQL}")),
    Index("transactions_idle", "updated_at", postgresql_where=text(f"state IN {IDLE_STATES_SQL}")),
    Index(
        "transactions_open_by_principal",
        "principal",
        postgresql_where=text(f"state IN {OPEN_STATES_SQL} AND principal IS NOT NULL"),
    ),
)

# The partitions and consumer groups of each transactional id's current (or last) transaction: a
# row per member, so adding one never rewrites the others, however long the transaction runs.
transaction_partitions = Table(
    "transaction_partitions",
    metadata,
    Column("transactional_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    PrimaryKeyConstraint("transactional_id", "topic", "partition"),
)

transaction_groups = Table(
    "transaction_groups",
    metadata,
    Column("transactional_id", Text, nullable=False),
    Column("group_id", Text, nullable=False),
    PrimaryKeyConstraint("transactional_id", "group_id"),
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
    Column("transaction_version", SmallInteger, nullable=False, server_default=text("2")),
    PrimaryKeyConstraint("transactional_id", "version"),
)

group_offsets = Table(
    "group_offsets",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("metadata", LargeBinary, nullable=False, server_default=text("''::bytea")),  # a string's UTF-8: Kafka's may hold a NUL
    Column("committed_at", TS, nullable=False, server_default=text("now()")),
    # the leader epoch the consumer committed with (OffsetCommit v6+, TxnOffsetCommit v2+); -1: none
    Column("leader_epoch", Integer, nullable=False, server_default=text("-1")),
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
    Column("metadata", LargeBinary, nullable=False, server_default=text("''::bytea")),  # a string's UTF-8: Kafka's may hold a NUL
    Column("committed_at", TS, nullable=False, server_default=text("now()")),
    Column("leader_epoch", Integer, nullable=False, server_default=text("-1")),
    PrimaryKeyConstraint("group_id", "topic", "partition", "transactional_id"),
    Index("pending_group_offsets_txn", "transactional_id"),
)

# --- half messages (RocketMQ's transactional messages) and the outbox -----------------------------
# None of these tables has a foreign key to ``partitions``: checking one takes a key-share lock on
# the partition row, which the append lock (FOR UPDATE) waits for — an application transaction
# holding it for its whole length would hold up every producer of the partition.

# A producer group's check-back endpoint and RocketMQ's knobs (defaults when a group never registered).
producer_groups = Table(
    "producer_groups",
    metadata,
    Column("producer_group", Text, primary_key=True),
    Column("check_url", Text),
    Column("check_interval_ms", BigInteger, nullable=False),
    Column("check_immunity_ms", BigInteger, nullable=False),
    Column("max_checks", Integer, nullable=False),
    Column("updated_at", TS, nullable=False),
)

# Half messages: stored here, not in their partition (RocketMQ's RMQ_SYS_TRANS_HALF_TOPIC), so an
# undecided one holds back no reader's last stable offset. A committed one is appended to its
# partition in the same database transaction that marks it Committed (``offset``: where).
half_messages = Table(
    "half_messages",
    metadata,
    Column("transaction_id", Text, primary_key=True),
    Column("producer_group", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("header_keys", ARRAY(Text)),
    Column("header_values", ARRAY(LargeBinary)),
    Column("encoding", Text, nullable=False, server_default=text("'utf8'")),  # the producer's, for its check-backs
    Column("created_at", TS, nullable=False),
    Column("state", Text, nullable=False),
    Column("check_count", Integer, nullable=False, server_default=text("0")),
    Column("next_check_at", TS),  # while Prepared: when the checker asks the producer group next
    Column("decided_at", TS),
    Column("decided_by", Text),  # producer, check_back, max_checks, delivery_time
    Column("reason", Text),
    Column("offset", BigInteger),
    # who checks it: the HTTP checker (its group's check-back URL) or a RocketMQ gateway (a live
    # producer's Telemetry stream); each claims only its own. ``delay``: a delayed message, checked
    # by nobody, committed by any of them at its delivery time (its next_check_at)
    Column("check_channel", Text, nullable=False, server_default=text("'http'")),
    CheckConstraint("state IN ('Prepared', 'Committed', 'RolledBack')", name="half_messages_state"),
    CheckConstraint("check_channel IN ('http', 'rocketmq', 'delay')", name="half_messages_check_channel"),
    Index("half_messages_due", "check_channel", "next_check_at", postgresql_where=text("state = 'Prepared'")),
    Index("half_messages_decided", "decided_at", postgresql_where=text("state <> 'Prepared'")),
    Index("half_messages_group", "producer_group", "created_at"),
)

# Every check-back asked: when, where, what the group answered (or why there was no answer), and
# what that did. A row without ``finished_at`` is a check whose checker died before recording it.
half_message_checks = Table(
    "half_message_checks",
    metadata,
    Column("transaction_id", Text, nullable=False),
    Column("check_no", Integer, nullable=False),
    Column("started_at", TS, nullable=False),
    Column("finished_at", TS),
    Column("check_url", Text),
    Column("answer", Text),
    Column("error", Text),
    Column("outcome", Text),
    PrimaryKeyConstraint("transaction_id", "check_no"),
    ForeignKeyConstraint(["transaction_id"], ["txlog.half_messages.transaction_id"], ondelete="CASCADE"),
)

# The in-database outbox: rows ``txlog.send()`` inserts inside an application's own transaction,
# drained into their partitions by the server (each row appended once and deleted in the same
# database transaction). ``id`` comes from ``outbox_id_seq`` when the row is sent: a row of a
# transaction that committed before another began has a smaller id than every row of the other.
outbox_id_seq = Sequence("outbox_id_seq", metadata=metadata, start=1)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("key", LargeBinary),
    Column("value", LargeBinary),
    Column("header_keys", ARRAY(Text)),
    Column("header_values", ARRAY(LargeBinary)),
    Column("created_at", TS, nullable=False),
    Index("outbox_partition", "topic", "partition", "id"),
)

# Principals (Kafka's users) and their API tokens. A token is ``txlog_<token_id>_<secret>``:
# ``token_id`` finds the row, the secret is checked against ``token_hash`` (scrypt, salted with the
# token id). The secret itself is never stored. A revoked principal keeps its row.
principals = Table(
    "principals",
    metadata,
    Column("name", Text, primary_key=True),
    Column("token_id", Text, nullable=False, unique=True),
    Column("token_hash", LargeBinary, nullable=False),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    Column("revoked_at", TS),
)

# A principal's SCRAM credentials (RFC 5802), one per mechanism: a salt, an iteration count and the
# two keys derived from the password, never the password itself.
scram_credentials = Table(
    "scram_credentials",
    metadata,
    Column("principal", Text, nullable=False),
    Column("mechanism", Text, nullable=False),
    Column("salt", LargeBinary, nullable=False),
    Column("iterations", Integer, nullable=False),
    Column("stored_key", LargeBinary, nullable=False),
    Column("server_key", LargeBinary, nullable=False),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("principal", "mechanism"),
    ForeignKeyConstraint(["principal"], ["txlog.principals.name"], ondelete="CASCADE"),
    CheckConstraint("mechanism IN ('SCRAM-SHA-256', 'SCRAM-SHA-512')", name="scram_credentials_mechanism"),
    CheckConstraint("iterations BETWEEN 4096 AND 16384", name="scram_credentials_iterations"),
)

# Kafka's ACLs: one row per binding (principal or '*', resource pattern, operation, permission).
acls = Table(
    "acls",
    metadata,
    Column("principal", Text, nullable=False),
    Column("resource_type", Text, nullable=False),
    Column("resource_name", Text, nullable=False),
    Column("pattern_type", Text, nullable=False),
    Column("operation", Text, nullable=False),
    Column("permission_type", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("principal", "resource_type", "resource_name", "pattern_type", "operation", "permission_type"),
    CheckConstraint("resource_type IN ('topic', 'group', 'transactional_id', 'cluster')", name="acls_resource_type"),
    CheckConstraint("pattern_type IN ('literal', 'prefixed')", name="acls_pattern_type"),
    CheckConstraint(
        "operation IN ('All', 'Read', 'Write', 'Create', 'Delete', 'Alter', 'Describe', 'IdempotentWrite', "
        "'DescribeConfigs', 'AlterConfigs', 'ClusterAction')",
        name="acls_operation",
    ),
    CheckConstraint("permission_type IN ('allow', 'deny')", name="acls_permission_type"),
)

# --- the Kafka wire gateway's cluster --------------------------------------------------------------

# One row: the cluster's id, as Kafka's Metadata answers it (22 characters of URL-safe base64 of a
# random UUID, as Kafka formats its cluster ids), made once by the migration that creates the table.
cluster = Table(
    "cluster",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("cluster_id", Text, nullable=False),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    CheckConstraint("id = 1", name="cluster_one_row"),
)

# The gateway processes acting as the cluster's brokers: each holds its node id by a lease it
# renews (``expires_at``, the database's clock). ``process_token`` is random per process: a second
# process asking for a node id that a live lease holds is refused; once the lease ends the id is
# anyone's. Rows whose lease ended stay until their id is taken again (they list no live node).
kafka_nodes = Table(
    "kafka_nodes",
    metadata,
    Column("node_id", Integer, primary_key=True, autoincrement=False),
    Column("host", Text, nullable=False),
    Column("port", Integer, nullable=False),
    Column("process_token", Text, nullable=False),
    Column("registered_at", TS, nullable=False),
    # Every listener of the process: {listener name: {"host", "port", "security_protocol"}}; Metadata
    # answers a client with the endpoints of the listener it connected to.
    Column("listeners", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("expires_at", TS, nullable=False),
    # The node's rack (Kafka's broker.rack; null: none), and whether it is a read replica: it
    # serves Fetch and ListOffsets from a hot standby and leads no partition (KIP-392).
    Column("rack", Text, nullable=True),
    Column("read_replica", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("node_id >= 0", name="kafka_nodes_node_id"),
    CheckConstraint("port BETWEEN 1 AND 65535", name="kafka_nodes_port"),
)

# The live RocketMQ gateways (``txlog rocketmq``), each by a lease its process renews: QueryRoute
# routes clients to every one whose lease runs. Apart from kafka_nodes: they are no Kafka brokers.
rocketmq_gateways = Table(
    "rocketmq_gateways",
    metadata,
    Column("process_token", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("port", Integer, nullable=False),
    Column("registered_at", TS, nullable=False),
    Column("expires_at", TS, nullable=False),
    CheckConstraint("port BETWEEN 1 AND 65535", name="rocketmq_gateways_port"),
)

# One row: raised in the same database transaction as every change of principals or ACLs, so each
# server process, polling it, reloads them when (and only when) they changed. ``session_key`` signs
# the admin pages' session cookies (set at the first start).
security_version = Table(
    "security_version",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False),
    Column("session_key", LargeBinary),
    CheckConstraint("id = 1", name="security_version_one_row"),
)

# --- Kafka's client quotas -------------------------------------------------------------------------

# A quota entity's config values: ``entity`` is Kafka's entity as {type: name or null (the default)}
# ({"user": "alice", "client-id": null} is /users/alice/clients/<default>). Every change raises
# ``security_version``, which each process polls to reload them.
client_quotas = Table(
    "client_quotas",
    metadata,
    Column("entity", JSONB, nullable=False),
    Column("quota_key", Text, nullable=False),
    Column("value", Double, nullable=False),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("entity", "quota_key"),
    CheckConstraint(
        "quota_key IN ('producer_byte_rate', 'consumer_byte_rate', 'request_percentage')", name="client_quotas_quota_key"
    ),
    CheckConstraint("value > 0", name="client_quotas_value_positive"),
)

# What every process recorded against a quota, per budget (Kafka's metric tags: the user and the
# client id a matched entity names, "" where it has no such part), quota key and window (the
# window's index: epoch seconds over quota.window.size.seconds). Each process adds its counts every
# few hundred milliseconds and reads the sums back in the same statement; windows older than the
# last quota.window.num are deleted then, so the table holds a few windows per active budget.
client_quota_usage = Table(
    "client_quota_usage",
    metadata,
    Column("user_tag", Text, nullable=False),
    Column("client_tag", Text, nullable=False),
    Column("quota_key", Text, nullable=False),
    Column("window_index", BigInteger, nullable=False),
    Column("amount", Double, nullable=False),
    PrimaryKeyConstraint("user_tag", "client_tag", "quota_key", "window_index"),
    Index("client_quota_usage_window", "window_index"),
)

# --- share groups (KIP-932) -----------------------------------------------------------------------

# A share group's delivery state on one topic partition: the share-partition start offset (SPSO:
# every record below it is done) and the end offset (exclusive: one past the last offset taken in
# flight, Kafka's SPEO + 1). Its row lock serialises every change of the share partition's state,
# whichever process serves it. ``state_epoch`` grows each time the state starts over
# (AlterShareGroupOffsets), as Kafka's state epoch does. Gone with its partition.
share_partitions = Table(
    "share_partitions",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("state_epoch", Integer, nullable=False, server_default=text("0")),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("group_id", "topic", "partition"),
    ForeignKeyConstraint(["topic", "partition"], ["txlog.partitions.topic", "txlog.partitions.partition"], ondelete="CASCADE"),
    CheckConstraint("start_offset >= 0 AND end_offset >= start_offset", name="share_partitions_window"),
)

# A share partition's in-flight records, one row per run of offsets in one state
# (``app.domain.share_partition.InFlightRange``), keyed by its first offset: the rows of a share
# partition are those of its window [start_offset, end_offset), one primary-key range scan, bounded
# by the window (group.share.partition.max.record.locks), never by the log. ``state`` is Kafka's
# record state id (0 Available, 1 Acquired, 2 Acknowledged, 4 Archived); only an Acquired run has a
# member and a lock deadline (epoch ms of the database's clock). The partial index finds the locks
# due to expire without reading any other row.
share_in_flight = Table(
    "share_in_flight",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("topic", Text, nullable=False),
    Column("partition", Integer, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("state", SmallInteger, nullable=False),
    Column("member_id", Text),
    Column("lock_deadline_ms", BigInteger),
    Column("delivery_count", Integer, nullable=False),
    PrimaryKeyConstraint("group_id", "topic", "partition", "first_offset"),
    ForeignKeyConstraint(
        ["group_id", "topic", "partition"],
        ["txlog.share_partitions.group_id", "txlog.share_partitions.topic", "txlog.share_partitions.partition"],
        ondelete="CASCADE",
    ),
    CheckConstraint("last_offset >= first_offset", name="share_in_flight_range"),
    CheckConstraint("state IN (0, 1, 2, 4)", name="share_in_flight_state"),
    CheckConstraint(
        "(state = 1) = (member_id IS NOT NULL AND lock_deadline_ms IS NOT NULL)", name="share_in_flight_acquired_lock"
    ),
    CheckConstraint("delivery_count >= 0", name="share_in_flight_delivery_count"),
    Index("share_in_flight_lock_deadline", "lock_deadline_ms", postgresql_where=text("state = 1")),
)

# A share group's configs (Kafka's GROUP config resource, the share.* keys), those set: a key not
# here takes its default.
share_group_configs = Table(
    "share_group_configs",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("value", Text, nullable=False),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("group_id", "name"),
    CheckConstraint(
        "name IN ('share.auto.offset.reset', 'share.isolation.level', 'share.record.lock.duration.ms', "
        "'share.delivery.count.limit', 'share.session.timeout.ms', 'share.heartbeat.interval.ms')",
        name="share_group_configs_name",
    ),
)

# A share group's membership (``app.domain.share_groups.ShareGroup``): its epochs and the metadata
# of the subscribed topics its assignment was computed from (topic name -> {"topic_id",
# "partitions"}). Its row lock serialises every heartbeat of the group, whichever process serves it.
# Named after Kafka's coordinator record (ShareGroupMetadata); the view ``txlog.share_groups`` shows it.
share_group_metadata = Table(
    "share_group_metadata",
    metadata,
    Column("group_id", Text, primary_key=True),
    Column("group_epoch", Integer, nullable=False),
    Column("assignment_epoch", Integer, nullable=False),
    Column("subscription_metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
)

# A share group's members: epochs, subscriptions, the assignment last answered and the target
# assignment (topic id -> partition indexes), and the session deadline (epoch ms of the database's
# clock): past it the member is fenced and its acquired records given back. The index finds the
# expired sessions without reading any other row. The view ``txlog.share_group_members`` shows it.
share_group_member_metadata = Table(
    "share_group_member_metadata",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("member_id", Text, nullable=False),
    Column("member_epoch", Integer, nullable=False),
    Column("previous_member_epoch", Integer, nullable=False),
    Column("subscribed_topic_names", ARRAY(Text), nullable=False),
    Column("assignment", JSONB, nullable=False),
    Column("target_assignment", JSONB, nullable=False),
    Column("session_deadline_ms", BigInteger, nullable=False),
    Column("rack_id", Text),
    Column("client_id", Text, nullable=False, server_default=text("''")),
    Column("client_host", Text, nullable=False, server_default=text("''")),
    PrimaryKeyConstraint("group_id", "member_id"),
    ForeignKeyConstraint(["group_id"], ["txlog.share_group_metadata.group_id"], ondelete="CASCADE"),
    Index("share_group_member_metadata_session_deadline", "session_deadline_ms"),
)

# A consumer group of the next-generation protocol (KIP-848, ``app.domain.groups.consumer_group``):
# its epochs and the metadata of the subscribed topics its target assignment was computed from.
# Its row lock serialises every heartbeat of the group, whichever gateway serves it. Named after
# Kafka's coordinator record (ConsumerGroupMetadata).
consumer_group_metadata = Table(
    "consumer_group_metadata",
    metadata,
    Column("group_id", Text, primary_key=True),
    Column("group_epoch", Integer, nullable=False),
    Column("assignment_epoch", Integer, nullable=False),
    Column("subscription_metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TS, nullable=False, server_default=text("now()")),
    Column("updated_at", TS, nullable=False, server_default=text("now()")),
    # the topic catalogue's version (topics_version) its subscriptions were last resolved against
    # every topic at; NULL: never
    Column("topics_version", BigInteger, nullable=True),
)

# Its members: epochs and reconciliation state, subscriptions (names, regular expression, server
# assignor), what each owns (topic id -> partition -> the epoch it was given at), what it still
# has to revoke, its target assignment, and its deadlines (epoch ms of the database's clock): the
# session's, and while revoking the rebalance timeout's; past either the member is fenced. The
# indexes find the due members without reading any other row.
consumer_group_member_metadata = Table(
    "consumer_group_member_metadata",
    metadata,
    Column("group_id", Text, nullable=False),
    Column("member_id", Text, nullable=False),
    Column("instance_id", Text),
    Column("member_epoch", Integer, nullable=False),
    Column("previous_member_epoch", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("rebalance_timeout_ms", Integer, nullable=False),
    Column("subscribed_topic_names", ARRAY(Text), nullable=False),
    Column("subscribed_topic_regex", Text),
    Column("server_assignor", Text),
    Column("assignment", JSONB, nullable=False),
    Column("pending_revocation", JSONB, nullable=False),
    Column("target_assignment", JSONB, nullable=False),
    Column("session_deadline_ms", BigInteger, nullable=False),
    Column("rebalance_deadline_ms", BigInteger),
    Column("rack_id", Text),
    Column("client_id", Text, nullable=False, server_default=text("''")),
    Column("client_host", Text, nullable=False, server_default=text("''")),
    PrimaryKeyConstraint("group_id", "member_id"),
    ForeignKeyConstraint(["group_id"], ["txlog.consumer_group_metadata.group_id"], ondelete="CASCADE"),
    Index("consumer_group_member_metadata_session_deadline", "session_deadline_ms"),
    Index("consumer_group_member_metadata_rebalance_deadline", "rebalance_deadline_ms"),
)
