"""The stable SQL views of the contract (columns may be added, never renamed or removed)."""

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

ALL = [PARTITION_STATUS, COMMITTED_RECORDS, TRANSACTION_STATE]
DROP_ALL = [
    "DROP VIEW IF EXISTS txlog.transaction_state",
    "DROP VIEW IF EXISTS txlog.committed_records",
    "DROP VIEW IF EXISTS txlog.partition_status",
]
