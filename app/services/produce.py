"""Produce: plain, idempotent and transactional appends to a partition log.

Reads top to bottom as one database transaction: (transactional: lock the transaction row, check
the producer, join the partition to the transaction) → lock the partition row → check the
producer's sequence → insert the batch → advance the high watermark → save producer state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from app import faults
from app.domain import transactions as txn
from app.domain.limits import RecordLimits, checked_record_sizes
from app.domain.partitioner import partition_for_key
from app.domain.producer_state import Append, Duplicate, after_append, check_append
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator
from app.services.topics import partition_count
from app.storage import queries as q
from sqlalchemy.engine import Connection


@dataclass(frozen=True)
class ProduceRequest:
    records: Sequence[NewRecord]
    producer_id: int | None = None
    producer_epoch: int | None = None
    base_sequence: int | None = None
    transactional_id: str | None = None
    # The authenticated requester (None without authentication): a transaction this batch starts
    # counts against its TXLOG_MAX_OPEN_TRANSACTIONS_PER_PRINCIPAL.
    principal: str | None = None
    # A transactional batch of a Kafka client before transactions V2 (Produce below version 12):
    # its partition must be in the open transaction already, added by AddPartitionsToTxn
    # (``transactions.check_partition_added``, KIP-890 part 1). False (the HTTP API, and V2): the
    # batch adds its partition to the transaction, starting one if none is open.
    require_added: bool = False


@dataclass(frozen=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False
    partition: int | None = None


def _validate(broker: Broker, req: ProduceRequest) -> list[int]:
    """Refuse a malformed batch; the records' sizes otherwise."""
    if not req.records:
        raise TxlogError(ErrorCode.INVALID_RECORD, "A batch must contain at least one record")
    sizes = checked_record_sizes(req.records, RecordLimits.from_settings(broker.settings))
    if sum(sizes) > broker.settings.max_request_bytes:
        raise TxlogError(ErrorCode.MESSAGE_TOO_LARGE, f"The batch is larger than {broker.settings.max_request_bytes} bytes")
    idempotent_fields = (req.producer_id, req.producer_epoch, req.base_sequence)
    if req.producer_id is not None and None in idempotent_fields:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "producer_id, producer_epoch and base_sequence go together")
    if req.producer_id is None and (req.producer_epoch is not None or req.base_sequence is not None):
        raise TxlogError(ErrorCode.INVALID_REQUEST, "producer_epoch and base_sequence need a producer_id")
    if req.transactional_id is not None and req.producer_id is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A transactional produce needs producer_id, producer_epoch and base_sequence")
    return sizes


def produce(broker: Broker, topic: str, partition: int, req: ProduceRequest) -> ProduceResult:
    sizes = _validate(broker, req)
    now = broker.now()
    with broker.db.transaction() as conn:
        result = append(conn, broker, topic, partition, req, now, sizes, commit=True)
    faults.crash_point(faults.SERVER_CRASH_ENV, "produce_appended")
    return result


def append(
    conn: Connection,
    broker: Broker,
    topic: str,
    partition: int,
    req: ProduceRequest,
    now: int,
    sizes: list[int] | None = None,
    commit: bool = False,
) -> ProduceResult:
    """The append path inside a database transaction the caller holds (the caller validated the
    batch's size, or did not need to): every way into the log goes through here — a produce, a
    committed half message, a row drained from the outbox — so the lock, producer and sequence
    rules live in one place. With ``commit`` the append is the transaction's last statement."""
    sizes = sizes if sizes is not None else [r.size() for r in req.records]
    pid, epoch, seq = req.producer_id, req.producer_epoch, req.base_sequence
    transactional = req.transactional_id is not None
    meta = None
    if transactional:
        meta = coordinator.locked(conn, req.transactional_id, partitions=[(topic, partition)])  # type: ignore[arg-type]
        txn.check_producer(meta, pid, epoch)  # type: ignore[arg-type]
        if meta.state.is_prepared:
            raise TxlogError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"Transaction is in {meta.state.value}; produce after it completes (retriable)",
            )
        if req.require_added:
            txn.check_partition_added(meta, topic, partition)
    position = q.partition_lock_for_append(conn, topic, partition, pid)
    faults.stop_point(faults.SERVER_STOP_ENV, "produce_locked")  # tests only: freeze holding the locks
    base_offset, log_start, entry = position.next_offset, position.log_start_offset, position.producer_state
    owner = position.owner
    if owner is not None:
        # The producer id is a transactional id's: fenced epochs write nowhere, and while its
        # transaction is open every batch of it belongs to that transaction.
        txn.check_batch_producer(owner.transactional_id, owner.meta, owner.retire_reason, pid, epoch)  # type: ignore[arg-type]
        if not transactional and owner.meta is not None and owner.meta.state.is_open:
            raise TxlogError(
                ErrorCode.INVALID_TXN_STATE,
                f"Producer {pid} has an open transaction ({owner.transactional_id!r}); "
                "send its batches with that transactional_id",
            )
    state = None
    if pid is not None:
        decision = check_append(entry, pid, epoch, seq, len(req.records))  # type: ignore[arg-type]
        if isinstance(decision, Duplicate):
            b = decision.batch
            return ProduceResult(b.first_offset, b.last_offset, b.timestamp_ms, log_start, duplicate=True)
    if meta is not None:
        event = txn.partitions_added(meta, [(topic, partition)], now)
        if event is not None:
            coordinator.record(conn, broker, meta, event, principal=req.principal)
    last_offset = base_offset + len(req.records) - 1
    if pid is not None:
        assert isinstance(decision, Append)
        state = after_append(entry, pid, epoch, decision, base_offset, last_offset, now, transactional)  # type: ignore[arg-type]
    q.log_append(
        conn, topic, partition, base_offset, position.next_position, req.records, now, pid, epoch, seq, transactional, state,
        txn_first_offset=state.txn_first_offset if transactional and state is not None else None, sizes=sizes,
        commit=commit,
    )
    return ProduceResult(base_offset, last_offset, now, log_start)


class _RoundRobin:
    """Null keys spread over partitions in turn (per process, as a Kafka client does per producer)."""

    def __init__(self) -> None:
        import itertools
        import threading

        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next(self, n: int) -> int:
        with self._lock:
            return next(self._counter) % n


_round_robin = _RoundRobin()


def choose_partition(broker: Broker, topic: str, key: bytes | None) -> int:
    """The partition a record without one goes to: Kafka's murmur2 partitioner for a key, round-robin
    for a null key (UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist)."""
    n = partition_count(broker, topic)
    return partition_for_key(key, n) if key is not None else _round_robin.next(n)


def produce_to_topic(broker: Broker, topic: str, records: Sequence[NewRecord]) -> ProduceResult:
    """Plain produce to a topic: Kafka's murmur2 partitioner for keyed records, round-robin for
    null keys. The whole batch goes to the partition of its first record, as one Kafka batch does."""
    if not records:
        raise TxlogError(ErrorCode.INVALID_RECORD, "A batch must contain at least one record")
    partition = choose_partition(broker, topic, records[0].key)
    result = produce(broker, topic, partition, ProduceRequest(records))
    return ProduceResult(result.base_offset, result.last_offset, result.log_append_time_ms, result.log_start_offset, False, partition)
