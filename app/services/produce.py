"""Produce: plain, idempotent and transactional appends to a partition log.

Reads top to bottom as one database transaction: (transactional: lock the transaction row, check
the producer, join the partition to the transaction) → lock the partition row → check the
producer's sequence → insert the batch → advance the high watermark → save producer state.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Sequence

from sqlalchemy.engine import Connection

from app import faults
from app.domain import transactions as txn
from app.domain.limits import RecordLimits, checked_record_sizes
from app.domain.log import AppendBatch, AppendPosition
from app.domain.partitioner import partition_for_key
from app.domain.producer_state import Append, Duplicate, after_append, check_append
from app.domain.records import NewRecord, record_sizes
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator, executor, last_appends
from app.services.executor import Blocking, Operation, Together
from app.services.group_commit import GroupCommit, Pending
from app.services.topics import partition_count
from app.storage import append as append_store
from app.storage.statements import Statement


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
    # A Kafka client's record batch, its size as framed (compressed): bounded as a whole by
    # message.max.bytes (TXLOG_MAX_REQUEST_BYTES), as Kafka bounds it, and its records by nothing
    # more. None (the HTTP API): each record is bounded by the TXLOG_MAX_*_BYTES limits, and their
    # sum by TXLOG_MAX_REQUEST_BYTES.
    batch_bytes: int | None = None


@dataclass(frozen=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False
    partition: int | None = None


def validate(broker: Broker, req: ProduceRequest) -> list[int]:
    """Refuse a malformed batch; the records' sizes otherwise."""
    if not req.records:
        raise TxlogError(ErrorCode.INVALID_RECORD, "A batch must contain at least one record")
    limit = broker.settings.max_request_bytes
    if req.batch_bytes is not None:
        if req.batch_bytes > limit:
            raise TxlogError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"The record batch is {req.batch_bytes} bytes, larger than message.max.bytes ({limit})",
            )
        sizes = record_sizes(req.records)
    else:
        sizes = checked_record_sizes(req.records, RecordLimits.from_settings(broker.settings))
        if sum(sizes) > limit:
            raise TxlogError(ErrorCode.MESSAGE_TOO_LARGE, f"The batch is larger than {limit} bytes")
    idempotent_fields = (req.producer_id, req.producer_epoch, req.base_sequence)
    if req.producer_id is not None and None in idempotent_fields:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "producer_id, producer_epoch and base_sequence go together")
    if req.producer_id is None and (req.producer_epoch is not None or req.base_sequence is not None):
        raise TxlogError(ErrorCode.INVALID_REQUEST, "producer_epoch and base_sequence need a producer_id")
    if req.transactional_id is not None and req.producer_id is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A transactional produce needs producer_id, producer_epoch and base_sequence")
    return sizes


def produce(broker: Broker, topic: str, partition: int, req: ProduceRequest) -> ProduceResult:
    """Produce, blocking (``produce_steps``)."""
    return executor.run(broker, functools.partial(produce_steps, broker, topic, partition, req))


def produce_steps(broker: Broker, topic: str, partition: int, req: ProduceRequest, now: int) -> Operation[ProduceResult]:
    """Produce: the batch appended as planned ahead (below) if it can be, else under the locks
    (``append``; plain and idempotent batches in a group commit)."""
    sizes = validate(broker, req)
    result = yield from _appended_ahead(broker, topic, partition, req, now, sizes)
    if result is None:
        result = yield Blocking(functools.partial(_produce_locked, broker, topic, partition, req, sizes))
    faults.crash_point(faults.SERVER_CRASH_ENV, "produce_appended")
    return result


def _produce_locked(broker: Broker, topic: str, partition: int, req: ProduceRequest, sizes: list[int]) -> ProduceResult:
    if req.transactional_id is None and broker.settings.produce_group_commit_batches > 1:
        return _group_commit(broker).submit(_Append(topic, partition, req, sizes), (topic, partition))
    return _append_alone(broker, topic, partition, req, sizes)


def _append_alone(broker: Broker, topic: str, partition: int, req: ProduceRequest, sizes: list[int]) -> ProduceResult:
    with broker.db.transaction() as conn:
        return append(conn, broker, topic, partition, req, broker.now(), sizes, commit=True, memory=last_appends.of(broker))


def append(
    conn: Connection,
    broker: Broker,
    topic: str,
    partition: int,
    req: ProduceRequest,
    now: int,
    sizes: list[int] | None = None,
    commit: bool = False,
    memory: last_appends.LastAppends | None = None,
) -> ProduceResult:
    """The append path inside a database transaction the caller holds (the caller validated the
    batch's size, or did not need to): every way into the log goes through here or through the
    group commit below, which share ``_planned`` — a produce, a committed half message, a row
    drained from the outbox — so the lock, producer and sequence rules live in one place. With
    ``commit`` the append is the transaction's last statement (and ``memory`` learns where
    it left the partition)."""
    meta = None
    if req.transactional_id is not None:
        meta = coordinator.locked(conn, req.transactional_id, partitions=[(topic, partition)])
        txn.check_producer(meta, req.producer_id, req.producer_epoch)  # type: ignore[arg-type]  # a transactional request has its producer id and epoch (checked by validate)
        if meta.state.is_prepared:
            raise TxlogError(
                ErrorCode.CONCURRENT_TRANSACTIONS, f"Transaction is in {meta.state.value}; produce after it completes (retriable)"
            )
        if req.require_added:
            txn.check_partition_added(meta, topic, partition)
    position = append_store.partition_lock_for_append(conn, topic, partition, req.producer_id)
    faults.stop_point(faults.SERVER_STOP_ENV, "produce_locked")  # tests only: freeze holding the locks
    plan = _planned(topic, partition, req, now, sizes, position)
    if isinstance(plan, ProduceResult):
        return plan
    if meta is not None:
        event = txn.partitions_added(meta, [(topic, partition)], now, transaction_version=_transaction_version(req))
        if event is not None:
            coordinator.record(conn, broker, meta, event, principal=req.principal)
    append_store.log_append(conn, [plan.batch], commit=commit)
    if memory is not None and commit:
        memory.remember(plan.batch, position)
    return plan.result


@dataclass(frozen=True)
class _Plan:
    batch: AppendBatch
    result: ProduceResult


def _planned(
    topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int] | None, position: AppendPosition
) -> _Plan | ProduceResult:
    """What appending ``req`` at ``position`` (its partition's lock held) comes to, by the producer
    rules: the batch to write, or — a producer's retry of a batch already appended — the original
    answer; or a refusal (TxlogError)."""
    pid, epoch, seq = req.producer_id, req.producer_epoch, req.base_sequence
    transactional = req.transactional_id is not None
    base_offset, log_start, entry = position.next_offset, position.log_start_offset, position.producer_state
    owner = position.owner
    if owner is not None:
        # The producer id is a transactional id's: fenced epochs write nowhere, and while its
        # transaction is open every batch of it belongs to that transaction.
        txn.check_batch_producer(owner.transactional_id, owner.meta, owner.retire_reason, pid, epoch)  # type: ignore[arg-type]  # an owned producer id comes with its epoch (checked by validate)
        if not transactional and owner.meta is not None and owner.meta.state.is_open:
            raise TxlogError(
                ErrorCode.INVALID_TXN_STATE,
                f"Producer {pid} has an open transaction ({owner.transactional_id!r}); "
                "send its batches with that transactional_id",
            )
    state = None
    last_offset = base_offset + len(req.records) - 1
    if pid is not None:
        decision = check_append(entry, pid, epoch, seq, len(req.records))  # type: ignore[arg-type]  # pid given: epoch and sequence too (checked by validate)
        if isinstance(decision, Duplicate):
            b = decision.batch
            return ProduceResult(b.first_offset, b.last_offset, b.timestamp_ms, log_start, duplicate=True)
        assert isinstance(decision, Append)
        state = after_append(entry, pid, epoch, decision, base_offset, last_offset, now, transactional)  # type: ignore[arg-type]  # pid given: epoch and sequence too (checked by validate)
    batch = AppendBatch(
        topic,
        partition,
        base_offset,
        position.next_position,
        req.records,
        now,
        pid,
        epoch,
        seq,
        transactional,
        state,
        txn_first_offset=state.txn_first_offset if transactional and state is not None else None,
        sizes=sizes,
    )
    return _Plan(batch, ProduceResult(base_offset, last_offset, now, log_start))


# --- optimistic append ----------------------------------------------------------------------------
#
# A producer sending batch after batch to a partition finds it, each time, where its previous batch
# left it. ``LastAppends`` remembers where this process's last append of each producer (or plain
# appender) left each partition; the next batch is planned against that by the same rules
# (``_planned``) and written by one statement in autocommit, which locks the partition and appends
# only if the partition and the producer's state are still exactly as planned against
# (``append_store.log_append_if_unchanged``): one round trip and one database transaction instead of four
# round trips (BEGIN, lock, write, COMMIT), and no lock held between round trips. A group commit
# sends all its batches that can be planned so in one such statement. A transactional batch is
# planned so too once its partition is in the open transaction; the statement then also checks,
# under a shared lock of the transaction's row, that the transaction is still Ongoing at the
# producer's epoch with the partition in it. A transaction's first batch on a partition is planned
# against the marker that ended the producer's previous transaction there, when this process wrote
# it (``coordinator.complete_if_unchanged``). A client before transactions V2 added the partition
# with AddPartitionsToTxn, and the batch is appended as the next ones are; otherwise the batch adds
# the partition to the transaction, starting one if none is open, and the transition is planned
# against the transaction as this process last wrote it: one statement writes both
# (``_joined_ahead``). Anything else — nothing remembered, another writer was there first, a
# partition or transaction another database transaction holds (not waited for), a batch the rules
# would refuse or answer as a duplicate — takes the locked path, whose answer stands on the state
# it reads under the lock. Memory is only a guess here: the database decides. Where the statement
# runs — an event loop's own connection, a worker thread — is the executor's (``app.services.executor``).


@dataclass(frozen=True)
class _Ahead:
    """A batch planned ahead: the plan, the remembered position it was planned against, and the
    transactional id whose transaction it must still be in (None: a plain or idempotent batch)."""

    plan: _Plan
    position: AppendPosition
    transactional_id: str | None


def _ahead_at(
    topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int], position: AppendPosition
) -> _Ahead | None:
    plan = append_planned(topic, partition, req, now, sizes, position)
    return _Ahead(plan, position, req.transactional_id) if plan is not None else None


def _remembered(last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest) -> AppendPosition | None:
    """Where this process's last append left the partition, if a batch can be planned against it."""
    position = last.get(topic, partition, req.producer_id)
    if position is None:
        return None
    if (
        req.transactional_id is not None
        and not req.require_added
        and (position.producer_state is None or position.producer_state.txn_first_offset is None)
    ):
        # The transaction's first batch here (the memory is of a marker): it adds the partition to
        # the transaction, with the transition (``_joined_ahead``). A client before transactions V2
        # added it already.
        return None
    return position


def append_planned(
    topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int], position: AppendPosition
) -> _Plan | None:
    """``_planned`` against a remembered position, if the plan is an append: a refusal or a
    duplicate is decided under the lock."""
    try:
        plan = _planned(topic, partition, req, now, sizes, position)
    except TxlogError:
        return None
    return None if isinstance(plan, ProduceResult) else plan


def _appended_ahead(
    broker: Broker, topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int]
) -> Operation[ProduceResult | None]:
    """The batch appended as planned ahead, sharing its statement with other batches planned ahead
    (``appends_if_unchanged``); a transaction's first batch on the partition with its transition
    (``_joined_ahead``). None, having written nothing, for the locked path: nothing remembered,
    the partition or the transaction moved on since, a batch the rules refuse or answer as a
    duplicate."""
    last = last_appends.of(broker)
    position = _remembered(last, topic, partition, req)
    if position is None:
        if req.transactional_id is not None and not req.require_added:
            return (yield from _joined_ahead(broker, last, topic, partition, req, now, sizes))
        return None
    ahead = _ahead_at(topic, partition, req, now, sizes, position)
    if ahead is None:
        return None
    b = ahead.plan.batch
    try:
        log_start = yield Together(ahead, (topic, partition), appends_if_unchanged)
    except Exception:  # perhaps committed: the caller hears it; the memory is stale
        last.forget(topic, partition, b.producer_id)
        raise
    # (A caller cancelled meanwhile leaves the memory be: if its statement was sent and appended the
    # batch, the next batch planned against the memory finds the partition moved on, and writes
    # nothing.)
    if log_start is None:
        last.forget(topic, partition, b.producer_id)
        return None
    last.remember(b, ahead.position)
    return dataclasses.replace(ahead.plan.result, log_start_offset=log_start)


def appends_if_unchanged(planned: Sequence[_Ahead]) -> Statement[list[int | None]]:
    """Batches planned ahead (distinct partitions) appended by one conditional statement in
    autocommit (``append_store.log_append_if_unchanged``): each one's log start offset, or None where the
    partition had moved on or was held, or the transaction was not as planned."""
    n = len(planned)
    statement = append_store.log_append_if_unchanged(
        [a.plan.batch for a in planned], [a.position.producer_state for a in planned], [a.transactional_id for a in planned]
    )
    return statement.then(lambda log_starts: [log_starts.get(i) for i in range(n)])


def _joined_ahead(
    broker: Broker, last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int]
) -> Operation[ProduceResult | None]:
    """A transactional batch that adds its partition to the transaction (starting one if none is
    open), planned against this process's memory of both — the transaction as this process last
    wrote it, the partition where it last left it — and written with the transition by one
    conditional statement (``coordinator.join_if_unchanged``). None for the locked path: nothing
    remembered, anything the rules would refuse or that the limits decide, anything moved."""
    joining = _joining(last, topic, partition, req, now, sizes)
    if joining is None:
        return None
    meta, position, plan = joining
    try:
        written = yield from coordinator.join_if_unchanged(
            broker,
            meta,
            req.producer_id,  # type: ignore[arg-type]  # a transactional request has its producer id and epoch (checked by validate)
            req.producer_epoch,  # type: ignore[arg-type]  # (the same)
            [(topic, partition)],
            req.principal,
            now,
            [plan.batch],
            [position],
            _transaction_version(req),
        )
    except BaseException:
        last.forget(topic, partition, req.producer_id)
        raise
    return _joined(last, plan, position, written)


def _transaction_version(req: ProduceRequest) -> int:
    """The protocol a transactional batch joins its transaction in: V1 for a Kafka client's before
    transactions V2 (its partition added by AddPartitionsToTxn), else V2 (Produce v12, the HTTP
    API), recorded with the transaction when the batch adds its partition."""
    return txn.V1 if req.require_added else txn.V2


def _joining(
    last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int]
) -> tuple[txn.TxnMetadata, AppendPosition, _Plan] | None:
    """The remembered transaction, the remembered partition and the batch planned against it, for a
    transaction's first batch on the partition; None if either is not remembered or the plan is not
    an append."""
    meta, position = last.txn(req.transactional_id), last.get(topic, partition, req.producer_id)  # type: ignore[arg-type]  # only transactional requests come here
    if meta is None or position is None:
        return None
    plan = append_planned(topic, partition, req, now, sizes, position)
    return None if plan is None else (meta, position, plan)


def _joined(
    last: last_appends.LastAppends, plan: _Plan, position: AppendPosition, written: tuple[txn.TxnMetadata, list[int]] | None
) -> ProduceResult | None:
    """The batch's answer once its statement ran (None: it wrote nothing); the memory learns where
    it left the partition."""
    b = plan.batch
    if written is None:
        last.forget(b.topic, b.partition, b.producer_id)
        return None
    last.remember(b, position)
    return dataclasses.replace(plan.result, log_start_offset=written[1][0])


# --- group commit ---------------------------------------------------------------------------------
#
# Plain and idempotent batches that arrive together (concurrent requests of one process) are
# appended in one database transaction: their partitions locked by one statement, their records
# written by one, one COMMIT and one WAL flush for the group, by the same rules (``_planned``) as
# one batch alone. Each caller hears only of its own batch, and only after the group committed.
# One statement takes the group's locks in (topic, partition) order and waits for none: a partition
# another transaction holds is appended to alone after the group, so a stuck holder of one
# partition never delays another partition's batch. A rule that refuses one batch (a sequence gap,
# a fenced epoch) refuses only that batch. A second batch for a partition already in the group waits
# for a later group (``GroupCommit``'s key). If a statement of the group fails, nothing of it was committed and each
# batch is appended again, alone; if the COMMIT itself fails, whether it took effect is unknown and
# each of its callers hears the error, as a lone append's caller would. Transactional batches are
# appended alone: they lock their transaction first.


@dataclass(frozen=True)
class _Append:
    topic: str
    partition: int
    req: ProduceRequest
    sizes: list[int]


def _group_commit(broker: Broker) -> GroupCommit[_Append, ProduceResult]:
    groups = broker.extensions.get("produce_group_commit")
    if groups is None:
        groups = broker.extensions.setdefault(
            "produce_group_commit",
            GroupCommit(lambda group: _append_group(broker, group), max_items=broker.settings.produce_group_commit_batches),
        )
    return groups


def _append_group(broker: Broker, group: Sequence[Pending[_Append, ProduceResult]]) -> None:
    if len(group) == 1:
        _each_alone(broker, group)
        return
    now = broker.now()
    members = list(group)  # one batch per partition: the group commit's key
    busy: list[Pending[_Append, ProduceResult]] = []
    answers: list[tuple[Pending[_Append, ProduceResult], ProduceResult]] = []
    statements_done = False
    appended: list[tuple[AppendBatch, AppendPosition]] = []
    try:
        with broker.db.transaction() as conn:
            positions = append_store.partitions_lock_for_append(
                conn, [(p.item.topic, p.item.partition, p.item.req.producer_id) for p in members], skip_locked=True
            )
            faults.stop_point(faults.SERVER_STOP_ENV, "produce_locked")  # tests only: freeze holding the locks
            for p, position in zip(members, positions):
                if position is None:
                    busy.append(p)
                    continue
                a = p.item
                try:
                    plan = _planned(a.topic, a.partition, a.req, now, a.sizes, position)
                except TxlogError as exc:
                    p.fail(exc)
                    continue
                if isinstance(plan, ProduceResult):
                    answers.append((p, plan))
                else:
                    appended.append((plan.batch, position))
                    answers.append((p, plan.result))
            if appended:
                append_store.log_append(conn, [batch for batch, _ in appended])
            statements_done = True
    except Exception as exc:
        if statements_done:  # the COMMIT failed: its batches' callers hear it
            for p, _ in answers:
                p.fail(exc)
            answers = []
        else:  # nothing of the group committed: each batch again, alone
            for p in members:
                p.reopen()
            answers, busy = [], members
    else:
        last = last_appends.of(broker)
        for batch, position in appended:
            last.remember(batch, position)
    for p, result in answers:
        p.resolve(result)
    _each_alone(broker, busy)


def _each_alone(broker: Broker, pending: Sequence[Pending[_Append, ProduceResult]]) -> None:
    for p in pending:
        a = p.item
        try:
            p.resolve(_append_alone(broker, a.topic, a.partition, a.req, a.sizes))
        except TxlogError as exc:
            p.fail(exc)


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
    return ProduceResult(
        result.base_offset, result.last_offset, result.log_append_time_ms, result.log_start_offset, False, partition
    )
