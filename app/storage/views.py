"""The SQL views: the contract's stable ones (columns may be added, never renamed or removed) and
``txlog.log_records``, which holds the one definition of an aborted record.

Each migration that changes a view carries its own frozen copy of the SQL; these are the current
definitions, and a test checks that a migrated database has exactly these.
"""

# The log with what became of each record's transaction. THE definition of "aborted", used by the
# HTTP fetch, txlog.committed_records, the Spark reader and the admin record browser alike: a
# transactional record is aborted when an aborted range of its producer id on its partition
# (Kafka's .txnindex, keyed by offset range) contains its offset. A producer's ranges on a partition
# never overlap and a transaction's records all carry its first offset (txn_first_offset), so the
# range containing a record is the one keyed (producer id, txn_first_offset): an equality on the
# index's primary key, which PostgreSQL serves as one hash join for a bulk read and leaves out
# entirely when ``aborted`` is not asked for. A page whose extent is known before it is read
# (Kafka's Fetch, and the HTTP fetch span by span) asks by ``page_aborted``: the same equality,
# taken once per distinct transaction of the page.
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


def page_aborted_keys(topic: str, partition: str, start: str, end: str) -> str:
    """The same definition as ``txlog.log_records.aborted``, for a page of the log: SQL selecting
    the (producer id, first offset) keys of the aborted ranges that records in offsets
    [``start``, ``end``) of the partition belong to (the arguments are SQL expressions; ``end``
    is the page's own, as every row below it is read once more for its key). A page read tests
    each record's (producer_id, txn_first_offset) against this set, which PostgreSQL builds once,
    as a hash table, from one index probe per distinct transaction of the page instead of the
    view's probe per record: its cost is bounded by the page, however long the partition's history
    of aborted transactions. A record of no transaction (txn_first_offset NULL) is never in it.
    Held equal to the view by tests/integration/test_transactions.py (through ``page_aborted``)."""
    return f"""
        SELECT k.producer_id, k.txn_first_offset FROM (
            SELECT DISTINCT k.producer_id, k.txn_first_offset FROM txlog.records k
            WHERE k.topic = {topic} AND k.partition = {partition} AND k."offset" >= {start} AND k."offset" < {end}
              AND k.txn_first_offset IS NOT NULL
        ) k
        -- a scalar subquery, so that PostgreSQL probes the index per key (a join could scan it whole)
        WHERE (SELECT true FROM txlog.aborted_txns a
               WHERE a.topic = {topic} AND a.partition = {partition}
                 AND a.producer_id = k.producer_id AND a.first_offset = k.txn_first_offset)
    """


def page_aborted(record: str, topic: str, partition: str, start: str, end: str) -> str:
    """SQL: whether the row ``record`` (an alias of txlog.records) of a page of the partition's log,
    offsets [``start``, ``end``), is a record of an aborted transaction, by ``page_aborted_keys``:
    true, or false or NULL (a record of no transaction: not aborted)."""
    keys = page_aborted_keys(topic, partition, start, end)
    return f"{record}.txn_first_offset IS NOT NULL AND ({record}.producer_id, {record}.txn_first_offset) IN ({keys})"


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

# Half messages waiting for a decision, with their last check-back (the whole history is the table
# txlog.half_message_checks). A group that never registered has RocketMQ's default max_checks, 15.
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

# The outbox's backlog per partition: rows of committed application transactions not yet drained
# into the log (rows of open transactions are invisible here, as to the drainer), and how long the
# oldest has waited.
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

# Share groups (KIP-932) for operators: each group's state, epochs and member count; each member
# with its session deadline and what it holds acquired; each in-flight run of a share partition's
# window with its state, delivery count and lock holder.
SHARE_GROUPS = """
CREATE OR REPLACE VIEW txlog.share_groups AS
SELECT g.group_id,
       CASE WHEN count(m.member_id) > 0 THEN 'Stable' ELSE 'Empty' END AS state,
       g.group_epoch,
       g.assignment_epoch,
       count(m.member_id) AS members,
       g.created_at,
       g.updated_at
FROM txlog.share_group_metadata g
LEFT JOIN txlog.share_group_member_metadata m ON m.group_id = g.group_id
GROUP BY g.group_id
"""

SHARE_GROUP_MEMBERS = """
CREATE OR REPLACE VIEW txlog.share_group_members AS
SELECT m.group_id,
       m.member_id,
       m.member_epoch,
       m.client_id,
       m.client_host,
       m.rack_id,
       m.subscribed_topic_names,
       m.assignment,
       to_timestamp(m.session_deadline_ms / 1000.0) AS session_deadline,
       (SELECT count(*) FROM txlog.share_in_flight f
         WHERE f.group_id = m.group_id AND f.member_id = m.member_id AND f.state = 1) AS acquired_runs,
       (SELECT coalesce(sum(f.last_offset - f.first_offset + 1), 0) FROM txlog.share_in_flight f
         WHERE f.group_id = m.group_id AND f.member_id = m.member_id AND f.state = 1) AS acquired_records
FROM txlog.share_group_member_metadata m
"""

SHARE_IN_FLIGHT_RECORDS = """
CREATE OR REPLACE VIEW txlog.share_in_flight_records AS
SELECT f.group_id,
       f.topic,
       f.partition,
       f.first_offset,
       f.last_offset,
       f.last_offset - f.first_offset + 1 AS records,
       CASE f.state WHEN 0 THEN 'Available' WHEN 1 THEN 'Acquired' WHEN 2 THEN 'Acknowledged'
                    WHEN 4 THEN 'Archived' END AS state,
       f.delivery_count,
       f.member_id AS lock_holder,
       to_timestamp(f.lock_deadline_ms / 1000.0) AS lock_deadline,
       p.start_offset AS share_partition_start_offset,
       p.end_offset AS share_partition_end_offset
FROM txlog.share_in_flight f
JOIN txlog.share_partitions p USING (group_id, topic, partition)
WHERE f.first_offset >= p.start_offset
"""

ALL = [
    LOG_RECORDS,
    PARTITION_STATUS,
    COMMITTED_RECORDS,
    TRANSACTION_STATE,
    PENDING_HALF_MESSAGES,
    OUTBOX_BACKLOG,
    SHARE_GROUPS,
    SHARE_GROUP_MEMBERS,
    SHARE_IN_FLIGHT_RECORDS,
]
DROP_ALL = [
    "DROP VIEW IF EXISTS txlog.share_in_flight_records",
    "DROP VIEW IF EXISTS txlog.share_group_members",
    "DROP VIEW IF EXISTS txlog.share_groups",
    "DROP VIEW IF EXISTS txlog.outbox_backlog",
    "DROP VIEW IF EXISTS txlog.pending_half_messages",
    "DROP VIEW IF EXISTS txlog.transaction_state",
    "DROP VIEW IF EXISTS txlog.committed_records",
    "DROP VIEW IF EXISTS txlog.partition_status",
    "DROP VIEW IF EXISTS txlog.log_records",
]
