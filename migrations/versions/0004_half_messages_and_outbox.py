"""half messages with check-back (RocketMQ's transactional messages) and the in-database outbox:
producer groups, half messages and their check history, the outbox table, txlog.murmur2 and
txlog.send, the views txlog.pending_half_messages and txlog.outbox_backlog

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Kafka's Utils.murmur2 (seed 0x9747b28c), as app/domain/partitioner.py has it: unsigned 32-bit
# arithmetic in bigint (a product of two 32-bit values fits), the result as Java's signed int.
# PostgreSQL's bitwise operators all share one precedence, hence the parentheses.
MURMUR2 = """
CREATE FUNCTION txlog.murmur2(data bytea) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    m CONSTANT bigint := 1540483477;  -- 0x5bd1e995
    mask CONSTANT bigint := 4294967295;
    len CONSTANT integer := length(data);
    full_len CONSTANT integer := len - len % 4;
    h bigint := (2538058380 # len) & 4294967295;  -- 0x9747b28c ^ length
    k bigint;
    i integer := 0;
BEGIN
    WHILE i < full_len LOOP
        k := get_byte(data, i)::bigint | (get_byte(data, i + 1)::bigint << 8)
             | (get_byte(data, i + 2)::bigint << 16) | (get_byte(data, i + 3)::bigint << 24);
        k := (k * m) & mask;
        k := k # (k >> 24);
        k := (k * m) & mask;
        h := (h * m) & mask;
        h := h # k;
        i := i + 4;
    END LOOP;
    IF len % 4 = 3 THEN
        h := h # (get_byte(data, full_len + 2)::bigint << 16);
    END IF;
    IF len % 4 >= 2 THEN
        h := h # (get_byte(data, full_len + 1)::bigint << 8);
    END IF;
    IF len % 4 >= 1 THEN
        h := h # get_byte(data, full_len)::bigint;
        h := (h * m) & mask;
    END IF;
    h := h # (h >> 13);
    h := (h * m) & mask;
    h := h # (h >> 15);
    RETURN (CASE WHEN h >= 2147483648 THEN h - 4294967296 ELSE h END)::integer;
END
$$
"""

# Append a record to the outbox inside the caller's own transaction: it reaches its partition if
# and only if that transaction commits. Validates the topic, the partition and the headers (a JSON
# object of text values, or Kafka's ordered list [{"key", "value"}]); without a partition the key
# picks it as the HTTP API does (toPositive(murmur2(key)) % partitions), a null key takes turns
# over the outbox's sequence. Reads the topic without locking it and inserts one row: it never
# waits for, nor holds up, any producer. Returns the row's id.
SEND = """
CREATE FUNCTION txlog.send(topic text, key bytea, value bytea, headers jsonb DEFAULT NULL, "partition" integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
    chosen integer;
    row_id bigint;
    hk text[];
    hv bytea[];
BEGIN
    IF send.topic IS NULL THEN
        RAISE EXCEPTION 'INVALID_TOPIC_EXCEPTION: the topic must not be null' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT t.partitions INTO n FROM txlog.topics t WHERE t.name = send.topic;
    IF n IS NULL THEN
        RAISE EXCEPTION 'UNKNOWN_TOPIC_OR_PARTITION: topic % does not exist', quote_literal(send.topic)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF send."partition" IS NOT NULL AND (send."partition" < 0 OR send."partition" >= n) THEN
        RAISE EXCEPTION 'UNKNOWN_TOPIC_OR_PARTITION: topic % has no partition % (it has %)',
            quote_literal(send.topic), send."partition", n USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF send.headers IS NULL OR jsonb_typeof(send.headers) = 'null' THEN
        NULL;
    ELSIF jsonb_typeof(send.headers) = 'object' THEN
        IF EXISTS (SELECT 1 FROM jsonb_each(send.headers) e WHERE jsonb_typeof(e.value) NOT IN ('string', 'null')) THEN
            RAISE EXCEPTION 'INVALID_RECORD: header values must be text or null' USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT array_agg(e.key ORDER BY e.key), array_agg(convert_to(e.value #>> '{}', 'UTF8') ORDER BY e.key)
          INTO hk, hv FROM jsonb_each(send.headers) e;
    ELSIF jsonb_typeof(send.headers) = 'array' THEN
        IF EXISTS (
            SELECT 1 FROM jsonb_array_elements(send.headers) e(h)
            WHERE jsonb_typeof(e.h) <> 'object' OR jsonb_typeof(e.h -> 'key') IS DISTINCT FROM 'string'
               OR COALESCE(jsonb_typeof(e.h -> 'value'), 'null') NOT IN ('string', 'null')
        ) THEN
            RAISE EXCEPTION 'INVALID_RECORD: headers as a list are [{"key": text, "value": text or null}, ...]'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT array_agg(e.h ->> 'key' ORDER BY e.o), array_agg(convert_to(e.h ->> 'value', 'UTF8') ORDER BY e.o)
          INTO hk, hv FROM jsonb_array_elements(send.headers) WITH ORDINALITY e(h, o);
    ELSE
        RAISE EXCEPTION 'INVALID_RECORD: headers must be a JSON object or a list' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    row_id := nextval('txlog.outbox_id_seq');
    IF send."partition" IS NOT NULL THEN
        chosen := send."partition";
    ELSIF send.key IS NOT NULL THEN
        chosen := (txlog.murmur2(send.key) & 2147483647) % n;
    ELSE
        chosen := (row_id % n)::integer;
    END IF;
    INSERT INTO txlog.outbox (id, topic, "partition", key, value, header_keys, header_values, created_at)
    VALUES (row_id, send.topic, chosen, send.key, send.value, hk, hv, clock_timestamp());
    RETURN row_id;
END
$$
"""

# The views as this revision creates them (a later revision that changes them carries its own copy).
PENDING_HALF_MESSAGES = """
CREATE OR REPLACE VIEW txlog.pending_half_messages AS
SELECT h.transaction_id,
       h.producer_group,
       h.topic,
       h.partition,
       h.created_at,
       now() - h.created_at AS age,
       h.check_count,
       COALESCE(g.max_checks, 15) AS max_checks,
       h.next_check_at,
       g.check_url,
       c.started_at AS last_check_at,
       c.answer AS last_answer,
       c.error AS last_error
FROM txlog.half_messages h
LEFT JOIN txlog.producer_groups g ON g.producer_group = h.producer_group
LEFT JOIN LATERAL (
    SELECT k.started_at, k.answer, k.error
    FROM txlog.half_message_checks k
    WHERE k.transaction_id = h.transaction_id
    ORDER BY k.check_no DESC
    LIMIT 1
) c ON true
WHERE h.state = 'Prepared'
"""

OUTBOX_BACKLOG = """
CREATE OR REPLACE VIEW txlog.outbox_backlog AS
SELECT o.topic,
       o.partition,
       count(*) AS "rows",
       min(o.id) AS oldest_id,
       min(o.created_at) AS oldest_created_at,
       now() - min(o.created_at) AS age
FROM txlog.outbox o
GROUP BY o.topic, o.partition
"""


def upgrade() -> None:
    op.create_table(
        "producer_groups",
        sa.Column("producer_group", sa.Text(), nullable=False),
        sa.Column("check_url", sa.Text(), nullable=True),
        sa.Column("check_interval_ms", sa.BigInteger(), nullable=False),
        sa.Column("check_immunity_ms", sa.BigInteger(), nullable=False),
        sa.Column("max_checks", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("producer_group"),
        schema="txlog",
    )
    op.create_table(
        "half_messages",
        sa.Column("transaction_id", sa.Text(), nullable=False),
        sa.Column("producer_group", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("header_keys", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("header_values", postgresql.ARRAY(sa.LargeBinary()), nullable=True),
        sa.Column("encoding", sa.Text(), server_default=sa.text("'utf8'"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("check_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_check_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("offset", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("state IN ('Prepared', 'Committed', 'RolledBack')", name="half_messages_state"),
        sa.PrimaryKeyConstraint("transaction_id"),
        schema="txlog",
    )
    op.create_index(
        "half_messages_due", "half_messages", ["next_check_at"], schema="txlog", postgresql_where=sa.text("state = 'Prepared'")
    )
    op.create_index(
        "half_messages_decided", "half_messages", ["decided_at"], schema="txlog", postgresql_where=sa.text("state <> 'Prepared'")
    )
    op.create_index("half_messages_group", "half_messages", ["producer_group", "created_at"], schema="txlog")
    op.create_table(
        "half_message_checks",
        sa.Column("transaction_id", sa.Text(), nullable=False),
        sa.Column("check_no", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("check_url", sa.Text(), nullable=True),
        sa.Column("answer", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["transaction_id"], ["txlog.half_messages.transaction_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("transaction_id", "check_no"),
        schema="txlog",
    )
    op.execute(sa.schema.CreateSequence(sa.Sequence("outbox_id_seq", schema="txlog", start=1)))
    op.create_table(
        "outbox",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=True),
        sa.Column("value", sa.LargeBinary(), nullable=True),
        sa.Column("header_keys", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("header_values", postgresql.ARRAY(sa.LargeBinary()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        schema="txlog",
    )
    op.create_index("outbox_partition", "outbox", ["topic", "partition", "id"], schema="txlog")
    op.execute(MURMUR2)
    op.execute(SEND)
    op.execute(PENDING_HALF_MESSAGES)
    op.execute(OUTBOX_BACKLOG)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS txlog.outbox_backlog")
    op.execute("DROP VIEW IF EXISTS txlog.pending_half_messages")
    op.execute("DROP FUNCTION IF EXISTS txlog.send(text, bytea, bytea, jsonb, integer)")
    op.execute("DROP FUNCTION IF EXISTS txlog.murmur2(bytea)")
    op.drop_index("outbox_partition", table_name="outbox", schema="txlog")
    op.drop_table("outbox", schema="txlog")
    op.execute(sa.schema.DropSequence(sa.Sequence("outbox_id_seq", schema="txlog")))
    op.drop_table("half_message_checks", schema="txlog")
    op.drop_index("half_messages_group", table_name="half_messages", schema="txlog")
    op.drop_index(
        "half_messages_decided", table_name="half_messages", schema="txlog", postgresql_where=sa.text("state <> 'Prepared'")
    )
    op.drop_index("half_messages_due", table_name="half_messages", schema="txlog", postgresql_where=sa.text("state = 'Prepared'"))
    op.drop_table("half_messages", schema="txlog")
    op.drop_table("producer_groups", schema="txlog")
