"""Produce: plain, idempotent and transactional appends to a partition log.

Reads top to bottom as one database transaction: (transactional: lock the transaction row, check
the producer, join the partition to the transaction) → lock the partition row → check the
producer's sequence → insert the batch → advance the high watermark → save producer state.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import weakref
from dataclasses import dataclass
from typing import Sequence

from app import faults
from app.domain import transactions as txn
from app.domain.limits import RecordLimits, checked_record_sizes
from app.domain.log import AppendBatch, AppendPosition
from app.domain.partitioner import partition_for_key
from app.domain.producer_state import Append, Duplicate, after_append, check_append
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator, last_appends
from app.services.group_commit import GroupCommit, Pending
from app.services.topics import partition_count
from app.storage import append as append_store
from app.storage.db import LoopConnections
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
    if req.transactional_id is None and broker.settings.produce_group_commit_batches > 1:
        result = _group_commit(broker).submit(_Append(topic, partition, req, sizes))
    else:
        result = _produce_alone(broker, topic, partition, req, sizes)
    faults.crash_point(faults.SERVER_CRASH_ENV, "produce_appended")
    return result


def _produce_alone(broker: Broker, topic: str, partition: int, req: ProduceRequest, sizes: list[int]) -> ProduceResult:
    now = broker.now()
    last = last_appends.of(broker)  # planned ahead if it can be (optimistic append, below)
    planned = _planned_ahead(last, topic, partition, req, now, sizes)
    if planned is not None:
        (result,) = _append_planned_ahead(broker, last, [planned])
        if result is not None:
            return result
    elif req.transactional_id is not None and not req.require_added:
        result = _joined_ahead(broker, last, topic, partition, req, now, sizes)
        if result is not None:
            return result
    with broker.db.transaction() as conn:
        return append(conn, broker, topic, partition, req, now, sizes, commit=True, memory=last)


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
        txn.check_producer(meta, req.producer_id, req.producer_epoch)  # type: ignore[arg-type]
        if meta.state.is_prepared:
            raise TxlogError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"Transaction is in {meta.state.value}; produce after it completes (retriable)",
            )
        if req.require_added:
            txn.check_partition_added(meta, topic, partition)
    position = append_store.partition_lock_for_append(conn, topic, partition, req.producer_id)
    faults.stop_point(faults.SERVER_STOP_ENV, "produce_locked")  # tests only: freeze holding the locks
    plan = _planned(topic, partition, req, now, sizes, position)
    if isinstance(plan, ProduceResult):
        return plan
    if meta is not None:
        event = txn.partitions_added(meta, [(topic, partition)], now)
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
        txn.check_batch_producer(owner.transactional_id, owner.meta, owner.retire_reason, pid, epoch)  # type: ignore[arg-type]
        if not transactional and owner.meta is not None and owner.meta.state.is_open:
            raise TxlogError(
                ErrorCode.INVALID_TXN_STATE,
                f"Producer {pid} has an open transaction ({owner.transactional_id!r}); "
                "send its batches with that transactional_id",
            )
    state = None
    last_offset = base_offset + len(req.records) - 1
    if pid is not None:
        decision = check_append(entry, pid, epoch, seq, len(req.records))  # type: ignore[arg-type]
        if isinstance(decision, Duplicate):
            b = decision.batch
            return ProduceResult(b.first_offset, b.last_offset, b.timestamp_ms, log_start, duplicate=True)
        assert isinstance(decision, Append)
        state = after_append(entry, pid, epoch, decision, base_offset, last_offset, now, transactional)  # type: ignore[arg-type]
    batch = AppendBatch(
        topic, partition, base_offset, position.next_position, req.records, now, pid, epoch, seq, transactional, state,
        txn_first_offset=state.txn_first_offset if transactional and state is not None else None, sizes=sizes,
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
# it reads under the lock. Memory is only a guess here: the database decides. A process that serves
# its requests on an event loop (an HTTP worker, the Kafka gateway) may await the one statement
# there (``produce_on_loop``): the same plan and statement without a thread hand-off; anything it
# does not take goes to ``produce``.


@dataclass(frozen=True)
class _Ahead:
    """A batch planned ahead: the plan, the remembered position it was planned against, and the
    transactional id whose transaction it must still be in (None: a plain or idempotent batch)."""

    plan: _Plan
    position: AppendPosition
    transactional_id: str | None


def _planned_ahead(
    last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int]
) -> _Ahead | None:
    """The batch planned against where this process's last append left the partition, if that is
    known and the plan is an append (a refusal or a duplicate is decided under the lock)."""
    position = _remembered(last, topic, partition, req)
    return None if position is None else _ahead_at(topic, partition, req, now, sizes, position)


def _ahead_at(
    topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int], position: AppendPosition
) -> _Ahead | None:
    plan = _append_planned(topic, partition, req, now, sizes, position)
    return _Ahead(plan, position, req.transactional_id) if plan is not None else None


def _remembered(last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest) -> AppendPosition | None:
    """Where this process's last append left the partition, if a batch can be planned against it."""
    position = last.get(topic, partition, req.producer_id)
    if position is None:
        return None
    if req.transactional_id is not None and not req.require_added and (
        position.producer_state is None or position.producer_state.txn_first_offset is None
    ):
        # The transaction's first batch here (the memory is of a marker): it adds the partition to
        # the transaction, with the transition (``_joined_ahead``). A client before transactions V2
        # added it already.
        return None
    return position


def _append_planned(
    topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int], position: AppendPosition
) -> _Plan | None:
    """``_planned`` against a remembered position, if the plan is an append: a refusal or a
    duplicate is decided under the lock."""
    try:
        plan = _planned(topic, partition, req, now, sizes, position)
    except TxlogError:
        return None
    return None if isinstance(plan, ProduceResult) else plan


def _append_planned_ahead(
    broker: Broker, last: last_appends.LastAppends, planned: Sequence[_Ahead]
) -> list[ProduceResult | None]:
    """Batches planned ahead (distinct partitions) appended by one conditional statement in
    autocommit; each one's result, or None where the partition had moved on or was held, or the
    transaction was not as planned (the caller takes the locked path). A failure of the statement
    is each caller's: in autocommit it may have been committed."""
    batches = [a.plan.batch for a in planned]
    try:
        with broker.db.autocommit() as conn:
            log_starts = append_store.log_append_if_unchanged(
                conn, batches, [a.position.producer_state for a in planned], [a.transactional_id for a in planned]
            )
    except BaseException:
        for b in batches:
            last.forget(b.topic, b.partition, b.producer_id)
        raise
    return _planned_ahead_results(last, planned, log_starts)


def _planned_ahead_results(
    last: last_appends.LastAppends, planned: Sequence[_Ahead], log_starts: dict[int, int]
) -> list[ProduceResult | None]:
    """What the conditional statement's answer (the log start offset of each batch it appended, by
    index) means for each batch planned ahead; the memory learns where each left its partition."""
    results: list[ProduceResult | None] = []
    for i, a in enumerate(planned):
        b = a.plan.batch
        if i in log_starts:
            last.remember(b, a.position)
            results.append(dataclasses.replace(a.plan.result, log_start_offset=log_starts[i]))
        else:
            last.forget(b.topic, b.partition, b.producer_id)
            results.append(None)
    return results


async def produce_on_loop(
    broker: Broker, connections: LoopConnections, topic: str, partition: int, req: ProduceRequest
) -> ProduceResult | None:
    """``produce`` for a batch that can be planned ahead, its one statement awaited on the caller's
    event loop (``connections``) rather than run in a thread — the same plan, the same conditional
    statement, the same answer; a transaction's first batch on the partition with its transition
    (``_joined_ahead``). None, having written nothing, for everything else: nothing remembered,
    the partition or the transaction moved on since, a batch the rules refuse or answer as a
    duplicate, every connection in use, the clock due a reading from the database. The caller then
    calls ``produce`` (in a thread), which decides it under the locks. Never waits on anything but
    the statement."""
    now = broker.now_without_waiting()
    if now is None:
        return None
    last = last_appends.of(broker)
    position = _remembered(last, topic, partition, req)
    if position is not None:
        ahead = _ahead_at(topic, partition, req, now, _validate(broker, req), position)
        if ahead is None:
            return None
        result = await _loop_group(broker, connections).append(ahead, connections)
    elif req.transactional_id is not None and not req.require_added:
        result = await _joined_ahead_on_loop(broker, connections, last, topic, partition, req, now)
    else:
        return None  # before validating: ``produce`` validates what it is left
    if result is not None:
        faults.crash_point(faults.SERVER_CRASH_ENV, "produce_appended")
    return result


# At most this many statements of ``produce_on_loop`` in flight on one event loop: the batches that
# arrive meanwhile are appended together by the next one.
LOOP_STATEMENTS = 2


class _Waiting:
    """A batch waiting for its statement on the loop, and what became of it. ``woken`` is set when
    it is decided, or when its caller is handed the next statement to send (``sends``)."""

    __slots__ = ("ahead", "woken", "sends", "done", "result", "error")

    def __init__(self, ahead: _Ahead) -> None:
        self.ahead = ahead
        self.woken: asyncio.Future = asyncio.get_running_loop().create_future()
        self.sends = False
        self.done = False
        self.result: ProduceResult | None = None
        self.error: BaseException | None = None

    def decide(self, result: ProduceResult | None, error: BaseException | None = None) -> None:
        self.done, self.result, self.error = True, result, error
        if not self.woken.done():
            self.woken.set_result(None)

    def outcome(self) -> ProduceResult | None:
        if self.error is not None:
            raise self.error
        return self.result


class _LoopGroupCommit:
    """The group commit of one event loop's appends planned ahead (``produce_on_loop``): batches
    that arrive while ``LOOP_STATEMENTS`` statements are in flight wait, and the next statement
    appends them together (the same conditional statement, one batch per partition: a second batch
    for a partition already in the group waits for the next), one commit and one WAL flush for the
    group, up to TXLOG_PRODUCE_GROUP_COMMIT_BATCHES of them (1: each alone, at once). With one
    producer at a time each statement is its batch alone, sent at once. Each caller hears only of
    its own batch, after the commit: its result, None (not appended: the partition moved on, or no
    connection was free) or the statement's failure, which may have committed. A caller whose batch
    arrives with a statement free, or who is handed one, sends its own batch with the oldest
    waiters; once it is decided it hands the next statement to the oldest waiter. A statement runs
    to its end even if its sender is cancelled: the others of its group hear of it."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.max_batches = broker.settings.produce_group_commit_batches
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._senders = 0

    async def append(self, ahead: _Ahead, connections: LoopConnections) -> ProduceResult | None:
        me = _Waiting(ahead)
        if self.max_batches <= 1:
            await self._statement([me], connections)
            return me.outcome()
        self._waiting.append(me)
        if self._senders < LOOP_STATEMENTS:
            self._senders += 1
            me.sends = True
        else:
            try:
                await me.woken
            except asyncio.CancelledError:
                self._leave(me)
                raise
        if me.sends:
            try:
                await asyncio.shield(asyncio.ensure_future(self._statement(self._next_group(me), connections)))
            finally:
                self._hand_on()
        return me.outcome()

    def _next_group(self, me: _Waiting) -> list[_Waiting]:
        """``me`` and the oldest waiters after it, one per partition, up to the group's size. A
        waiter handed a statement of its own is left to it."""
        self._waiting.remove(me)
        group = [me]
        partitions = {(me.ahead.plan.batch.topic, me.ahead.plan.batch.partition)}
        later: list[_Waiting] = []
        while self._waiting and len(group) < self.max_batches:
            w = self._waiting.popleft()
            key = (w.ahead.plan.batch.topic, w.ahead.plan.batch.partition)
            if w.sends or key in partitions:
                later.append(w)
            else:
                partitions.add(key)
                group.append(w)
        self._waiting.extendleft(reversed(later))
        return group

    def _hand_on(self) -> None:
        """A sender is done: the oldest waiter not sending yet sends the next statement, if any."""
        for w in self._waiting:
            if not w.sends:
                w.sends = True
                w.woken.set_result(None)
                return
        self._senders -= 1

    def _leave(self, me: _Waiting) -> None:
        """A waiter's caller is cancelled: out of the queue; handed the next statement already, it
        hands it on."""
        if me in self._waiting:
            self._waiting.remove(me)
        if me.sends:
            self._hand_on()

    async def _statement(self, group: list[_Waiting], connections: LoopConnections) -> None:
        """One conditional statement for the group; each of it decided (never raises)."""
        last = last_appends.of(self.broker)
        planned = [w.ahead for w in group]
        batches = [a.plan.batch for a in planned]
        try:
            async with connections.connection() as conn:
                if conn is None:
                    results: list[ProduceResult | None] = [None] * len(group)
                else:
                    log_starts = await append_store.log_append_if_unchanged_awaited(
                        conn, batches, [a.position.producer_state for a in planned], [a.transactional_id for a in planned]
                    )
                    results = _planned_ahead_results(last, planned, log_starts)
        except BaseException as exc:  # noqa: BLE001 - each caller of the group hears of it
            for b in batches:
                last.forget(b.topic, b.partition, b.producer_id)
            for w in group:
                w.decide(None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for w, result in zip(group, results):
            w.decide(result)


def _loop_group(broker: Broker, connections: LoopConnections) -> _LoopGroupCommit:
    """The group commit of the loop ``connections`` belong to."""
    group = _loop_groups.get(connections)
    if group is None:
        group = _loop_groups[connections] = _LoopGroupCommit(broker)
    return group


_loop_groups: "weakref.WeakKeyDictionary[LoopConnections, _LoopGroupCommit]" = weakref.WeakKeyDictionary()


def _joined_ahead(
    broker: Broker, last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int]
) -> ProduceResult | None:
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
        written = coordinator.join_if_unchanged(
            broker, meta, req.producer_id, req.producer_epoch, [(topic, partition)], req.principal,  # type: ignore[arg-type]
            [plan.batch], [position],
        )
    except BaseException:
        last.forget(topic, partition, req.producer_id)
        raise
    return _joined(last, plan, position, written)


async def _joined_ahead_on_loop(
    broker: Broker, connections: LoopConnections, last: last_appends.LastAppends, topic: str, partition: int,
    req: ProduceRequest, now: int,
) -> ProduceResult | None:
    """``_joined_ahead`` with its statement awaited on the caller's event loop (``connections``):
    None, having written nothing, as well when no connection is free."""
    if last.txn(req.transactional_id) is None:  # type: ignore[arg-type]
        return None  # before validating: ``produce`` validates what it is left
    joining = _joining(last, topic, partition, req, now, _validate(broker, req))
    if joining is None:
        return None
    meta, position, plan = joining
    try:
        written = await coordinator.join_if_unchanged_on_loop(
            broker, connections, meta, req.producer_id, req.producer_epoch, [(topic, partition)], req.principal,  # type: ignore[arg-type]
            now, [plan.batch], [position],
        )
    except BaseException:
        last.forget(topic, partition, req.producer_id)
        raise
    return _joined(last, plan, position, written)


def _joining(
    last: last_appends.LastAppends, topic: str, partition: int, req: ProduceRequest, now: int, sizes: list[int]
) -> tuple[txn.TxnMetadata, AppendPosition, _Plan] | None:
    """The remembered transaction, the remembered partition and the batch planned against it, for a
    transaction's first batch on the partition; None if either is not remembered or the plan is not
    an append."""
    meta, position = last.txn(req.transactional_id), last.get(topic, partition, req.producer_id)  # type: ignore[arg-type]
    if meta is None or position is None:
        return None
    plan = _append_planned(topic, partition, req, now, sizes, position)
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
# a fenced epoch) refuses only that batch. A second batch for a partition already in the group is
# appended alone after it. If a statement of the group fails, nothing of it was committed and each
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
        _append_alone(broker, group)
        return
    now = broker.now()
    first: dict[tuple[str, int], Pending[_Append, ProduceResult]] = {}
    seconds: list[Pending[_Append, ProduceResult]] = []  # a partition's second batch and later ones
    for p in group:
        key = (p.item.topic, p.item.partition)
        if key in first:
            seconds.append(p)
        else:
            first[key] = p
    members = _group_planned_ahead(broker, list(first.values()), now)
    if not members:
        _append_alone(broker, seconds)
        return
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
    _append_alone(broker, busy + seconds)


def _group_planned_ahead(
    broker: Broker, members: list[Pending[_Append, ProduceResult]], now: int
) -> list[Pending[_Append, ProduceResult]]:
    """The group's batches that can be planned ahead appended by one conditional statement, each
    caller answered; the members left for the locked path."""
    last = last_appends.of(broker)
    ahead: list[tuple[Pending[_Append, ProduceResult], _Ahead]] = []
    rest = []
    for p in members:
        a = p.item
        planned = _planned_ahead(last, a.topic, a.partition, a.req, now, a.sizes)
        if planned is None:
            rest.append(p)
        else:
            ahead.append((p, planned))
    if not ahead:
        return rest
    try:
        results = _append_planned_ahead(broker, last, [planned for _, planned in ahead])
    except Exception as exc:  # perhaps committed: each caller hears it, as of a failed COMMIT
        for p, _ in ahead:
            p.fail(exc)
        return rest
    for (p, _), result in zip(ahead, results):
        if result is None:
            rest.append(p)
        else:
            p.resolve(result)
    return rest


def _append_alone(broker: Broker, pending: Sequence[Pending[_Append, ProduceResult]]) -> None:
    for p in pending:
        a = p.item
        try:
            p.resolve(_produce_alone(broker, a.topic, a.partition, a.req, a.sizes))
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
    return ProduceResult(result.base_offset, result.last_offset, result.log_append_time_ms, result.log_start_offset, False, partition)
