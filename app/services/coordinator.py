"""The transaction coordinator's write path, shared by every operation that moves a transaction.

Lock order, everywhere: the transaction row (``transactions``, FOR UPDATE) first, then partition
rows in (topic, partition) order, then producer state and group offset rows in the same order.
A database transaction touches at most one transaction row, so no two can wait on each other in a
cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlalchemy.engine import Connection

from app.domain import limits
from app.domain import transactions as txn
from app.domain.log import AppendBatch, AppendPosition
from app.domain.partitioner import coordinator_partition
from app.domain.producer_state import after_marker
from app.domain.records import CONTROL_ABORT, CONTROL_COMMIT, NewRecord
from app.domain.transactions import TxnEvent, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError
from app.services import Broker, last_appends
from app.services.executor import Operation
from app.storage import append as append_store
from app.storage import groups as groups_store
from app.storage import producers as producers_store
from app.storage import transactions as transactions_store


def record(
    conn: Connection, broker: Broker, meta: TxnMetadata | None, *events: TxnEvent, principal: str | None = None
) -> TxnMetadata:
    """Persist transitions: append the events and update the current-state row (and the rows of
    the partitions and groups they add), in one statement of the caller's database transaction.
    Only the first event may leave the previous transaction's members behind. A new producer id is
    recorded as the transactional id's and the previous ones retired, so that no partition takes a
    batch of theirs again. Returns the new state (the fold of the events).

    The limits are checked in the same statement: partitions joining a transaction
    (``TXLOG_MAX_PARTITIONS_PER_TRANSACTION``, POLICY_VIOLATION) and, when ``principal`` (the
    authenticated requester) starts a transaction, its open transactions
    (``TXLOG_MAX_OPEN_TRANSACTIONS_PER_PRINCIPAL``, THROTTLING_QUOTA_EXCEEDED); the caller's
    database transaction then fails whole."""
    steps, new = _folded(meta, events)
    tid = new.transactional_id
    # This process's memory of the transaction (transitions planned ahead) is stale from here.
    last_appends.of(broker).forget_txn(tid)
    if meta is not None and txn.resets_members(meta, events[0]):
        transactions_store.txn_members_clear(conn, tid)
    settings = broker.settings
    adding = sum(len(e.partitions_added) for e in events)
    starts = meta is not None and not meta.state.is_open and events[0].to_state is TxnState.ONGOING
    max_open = settings.max_open_transactions_per_principal if starts and principal is not None else None
    if max_open is not None:
        transactions_store.txn_principal_lock(conn, principal)  # type: ignore[arg-type]  # a limit is checked only with a principal
    recorded = transactions_store.txn_record(
        conn,
        events,
        new,
        coordinator_partition(tid, settings.transaction_state_partitions),
        txn.deadline_ms(new),
        max_partitions=settings.max_partitions_per_transaction if adding else None,
        principal=principal,
        starts=starts,
        max_open=max_open,
    )
    if not recorded:
        in_transaction, open_now = transactions_store.txn_limit_usage(conn, tid, principal)
        if adding and in_transaction > settings.max_partitions_per_transaction:
            raise limits.partitions_per_transaction_exceeded(
                adding, in_transaction - adding, settings.max_partitions_per_transaction
            )
        raise limits.open_transactions_exceeded(principal or "", open_now, settings.max_open_transactions_per_principal)
    for before, event in steps:
        if before is None or event.producer_id != before.producer_id:
            producers_store.producer_id_assign(conn, event.producer_id, tid, event.at_ms)
            producers_store.producer_ids_retire(conn, tid, event.producer_id, "newer_epoch", event.at_ms)
    if new.state is TxnState.DEAD:
        producers_store.producer_ids_retire(conn, tid, None, "expired", new.updated_at_ms)
    return new


def _folded(
    meta: TxnMetadata | None, events: tuple[TxnEvent, ...]
) -> tuple[list[tuple[TxnMetadata | None, TxnEvent]], TxnMetadata]:
    """Each event with the state it applies to, and the state they lead to. Only the first event
    may reset the members."""
    steps: list[tuple[TxnMetadata | None, TxnEvent]] = []
    state = meta
    for event in events:
        if steps and txn.resets_members(state, event):
            raise ValueError(f"{event.to_state.value} would reset the members of the transaction it is recorded with")
        steps.append((state, event))
        state = txn.apply(state, event)
    assert state is not None
    return steps, state


def locked(
    conn: Connection, transactional_id: str, partitions: list[txn.TopicPartition] | None = None, groups: list[str] | None = None
) -> TxnMetadata:
    """The transactional id's state, its row locked. With ``partitions``/``groups``, only those of
    them are read back as members (enough to know whether they are in the transaction already)."""
    meta = transactions_store.txn_get(conn, transactional_id, for_update=True, partitions=partitions, groups=groups)
    if meta is None:
        raise TxlogError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"Transactional id {transactional_id!r} is unknown: call InitProducerId (POST /v1/producers) first",
        )
    return meta


def new_producer_id_if_exhausted(conn: Connection, epoch: int) -> int | None:
    return producers_store.producer_id_next(conn) if txn.needs_new_producer_id(epoch) else None


def complete(conn: Connection, broker: Broker, meta: TxnMetadata, decision: TxnEvent | None = None) -> TxnMetadata:
    """Write the marker on every partition of the transaction, apply or drop its pending group
    offsets, and record CompleteCommit/CompleteAbort — all in the caller's database transaction.

    With ``decision`` (the PrepareCommit/PrepareAbort event of an Ongoing transaction), the decision
    is taken in the same database transaction and recorded with the completion, in one statement:
    the history reads PrepareCommit then CompleteCommit, and a crash before the commit leaves the
    transaction as it was, Ongoing, with nothing written. Without it, ``meta`` is a prepared
    transaction whose decision was made durable earlier (``end_txn_prepare``), which a crash
    leaves prepared."""
    before = meta
    if decision is not None:
        meta = txn.apply(meta, decision)
    commit = txn.prepared_result(meta.state) == "commit"
    now = broker.now()
    partitions = sorted(meta.partitions)
    positions = (
        append_store.partitions_lock_for_append(conn, [(t, p, meta.producer_id) for t, p in partitions]) if partitions else []
    )
    markers = [
        marker(topic, partition, position, meta.producer_id, meta.producer_epoch, commit, now)
        for (topic, partition), position in zip(partitions, positions)
        if position is not None  # None: the topic is gone, nothing to mark
    ]
    if markers:
        append_store.log_append(conn, markers)
        # The markers moved these partitions on: a next batch of the producer there is not planned
        # against this process's memory of them (it would only find them moved).
        memory = last_appends.of(broker)
        for m in markers:
            memory.forget(m.topic, m.partition, m.producer_id)
    if meta.groups:  # pending offsets are only ever written for a group of the transaction
        groups_store.pending_offsets_apply(conn, meta.transactional_id, commit)
    new_pid = new_producer_id_if_exhausted(conn, meta.producer_epoch) if meta.transaction_version >= 2 else None
    completed = txn.completed(meta, now, new_pid)
    if decision is not None:
        return record(conn, broker, before, decision, completed)
    return record(conn, broker, meta, completed)


def complete_if_unchanged(broker: Broker, meta: TxnMetadata, decision: TxnEvent, now: int) -> Operation[TxnMetadata | None]:
    """``complete`` planned ahead: an Ongoing transaction, as read without a lock or as this process
    last wrote it (``meta``, exact at its version), ended by ``decision`` in one statement in
    autocommit, its markers planned against where this process's last appends left its partitions
    (``last_appends``), its pending group offsets applied or dropped. Answers the completed state,
    or None when it was not written — a partition not remembered, a transaction without partitions
    or in need of a new producer id, anything moved or held — and the caller takes the locked path
    (``complete``)."""
    planned = _completion_planned(broker, meta, decision, now)
    if planned is None:
        return None
    written = yield from completed_if_unchanged(broker, meta, planned)
    return written[0] if written is not None else None


def completed_if_unchanged(
    broker: Broker, meta: TxnMetadata, planned: Completion
) -> Operation[tuple[TxnMetadata, list[int]] | None]:
    """``planned`` written by ``record_if_unchanged``; this process then remembers where its
    batches left their partitions, or forgets them if it was not written."""
    written = None
    try:
        written = yield from record_if_unchanged(broker, meta, *planned.record_args())
    finally:
        planned.remember(broker, written is not None)
    return written


@dataclass(frozen=True)
class Completion:
    """A transaction's end planned ahead: the events, its markers (a marker may end a batch of the
    transaction: ``AppendBatch.trailing_marker``) and the positions they were planned against."""

    events: tuple[TxnEvent, ...]
    markers: list[AppendBatch]
    positions: list[AppendPosition]
    ends: txn.Result

    def record_args(self) -> tuple:
        return self.events, self.markers, self.positions, self.ends

    def remember(self, broker: Broker, written: bool) -> None:
        """Written, the markers are where the partitions now end (what a client before
        transactions V2 appends next, once it has added a partition again); not written, they were
        not where remembered."""
        memory = last_appends.of(broker)
        for m, position in zip(self.markers, self.positions):
            if written:
                memory.remember(m, position)
            else:
                memory.forget(m.topic, m.partition, m.producer_id)


def _completion_planned(broker: Broker, meta: TxnMetadata, decision: TxnEvent, now: int) -> Completion | None:
    if meta.state is not TxnState.ONGOING or not meta.partitions:
        return None
    prepared = txn.apply(meta, decision)
    if prepared.transaction_version >= 2 and txn.needs_new_producer_id(prepared.producer_epoch):
        return None
    memory = last_appends.of(broker)
    partitions = sorted(meta.partitions)
    remembered = [memory.get(t, p, meta.producer_id) for t, p in partitions]
    positions = [position for position in remembered if position is not None]
    if len(positions) < len(remembered):
        return None
    commit = txn.prepared_result(prepared.state) == "commit"
    markers = [
        marker(t, p, position, meta.producer_id, meta.producer_epoch, commit, now)
        for (t, p), position in zip(partitions, positions)
    ]
    return Completion((decision, txn.completed(prepared, now, None)), markers, positions, "commit" if commit else "abort")


def join_if_unchanged(
    broker: Broker,
    meta: TxnMetadata,
    producer_id: int,
    producer_epoch: int,
    partitions: Sequence[txn.TopicPartition],
    principal: str | None,
    now: int,
    batches: Sequence[AppendBatch] = (),
    positions: Sequence[AppendPosition] = (),
    transaction_version: int = txn.V2,
) -> Operation[tuple[TxnMetadata, list[int]] | None]:
    """Partitions joining the transaction — starting one if none is open — planned against the
    transaction as this process last wrote it (``meta``), recorded with ``batches`` (the batch that
    adds its partition; none for AddPartitionsToTxn) by ``record_if_unchanged``, with the version
    of the request that adds them (``txn.partitions_added``). None, for the
    locked path, when the producer is not the transaction's, the partitions are in it already (as
    remembered), or a limit needs counting under the locks (open transactions of a principal), or
    is exceeded; or when anything moved."""
    if meta.state.is_prepared:
        return None
    try:
        txn.check_producer(meta, producer_id, producer_epoch)
    except TxlogError:
        return None
    event = txn.partitions_added(meta, partitions, now, transaction_version=transaction_version)
    if event is None or (principal is not None and not meta.state.is_open):
        return None
    if len(txn.apply(meta, event).partitions) > broker.settings.max_partitions_per_transaction:
        return None
    return (yield from record_if_unchanged(broker, meta, (event,), batches, positions))


def record_if_unchanged(
    broker: Broker,
    meta: TxnMetadata,
    events: tuple[TxnEvent, ...],
    batches: Sequence[AppendBatch],
    positions: Sequence[AppendPosition],
    ends: txn.Result | None = None,
) -> Operation[tuple[TxnMetadata, list[int]] | None]:
    """Transitions of a transaction known without its lock (``meta``: read, or as this process last
    wrote it — exact at its version) recorded with batches of it planned against ``positions``, in
    one statement in autocommit that writes all of them only if nothing moved since
    (``append_store.txn_append_if_unchanged``): two round trips with a read, or one, against six on the locked
    path (BEGIN, the transaction's lock, the partitions' locks, the batches, the events, COMMIT).
    ``ends``: the events end the transaction so (its pending group offsets applied or dropped).
    Answers the new state and each batch's log start offset, or None if nothing was written. This
    process remembers the new state (``last_appends``), for the next transitions planned ahead. A
    failure of the statement is the caller's: in autocommit it may have been committed."""
    new, args = _recording(broker, meta, events, batches, positions, ends)
    try:
        log_starts = yield append_store.txn_append_if_unchanged(*args)
    except BaseException:
        last_appends.of(broker).forget_txn(meta.transactional_id)
        raise
    return _recorded(broker, meta, new, log_starts)


def _recording(
    broker: Broker,
    meta: TxnMetadata,
    events: tuple[TxnEvent, ...],
    batches: Sequence[AppendBatch],
    positions: Sequence[AppendPosition],
    ends: txn.Result | None,
) -> tuple[TxnMetadata, tuple]:
    """The state the events lead to, and the conditional statement's arguments after its
    connection."""
    _, new = _folded(meta, events)
    return new, (
        batches,
        [position.producer_state for position in positions],
        events,
        meta,
        new,
        coordinator_partition(new.transactional_id, broker.settings.transaction_state_partitions),
        txn.deadline_ms(new),
        txn.resets_members(meta, events[0]),
        ends,
    )


def _recorded(
    broker: Broker, meta: TxnMetadata, new: TxnMetadata, log_starts: list[int] | None
) -> tuple[TxnMetadata, list[int]] | None:
    memory = last_appends.of(broker)
    if log_starts is None:
        memory.forget_txn(meta.transactional_id)
        return None
    memory.remember_txn(new)
    return new, log_starts


def write_marker(
    conn: Connection,
    topic: str,
    partition: int,
    position: AppendPosition,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    now_ms: int,
) -> int:
    """Append a COMMIT or ABORT control record for the producer on a partition whose append lock
    ``position`` holds, closing its open transaction there (Kafka's WriteTxnMarkers). Answers the
    marker's offset."""
    append_store.log_append(conn, [marker(topic, partition, position, producer_id, producer_epoch, commit, now_ms)])
    return position.next_offset


def marker(
    topic: str, partition: int, position: AppendPosition, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
) -> AppendBatch:
    """The COMMIT or ABORT marker batch of ``write_marker``, to append with others in one statement."""
    entry = position.producer_state
    return AppendBatch(
        topic,
        partition,
        position.next_offset,
        position.next_position,
        [NewRecord(None, None)],
        now_ms,
        producer_id,
        producer_epoch,
        transactional=True,
        producer_state=after_marker(entry, producer_id, producer_epoch, now_ms) if entry else None,
        control_type=CONTROL_COMMIT if commit else CONTROL_ABORT,
        aborted_first_offset=entry.txn_first_offset if entry is not None and not commit else None,
        txn_first_offset=entry.txn_first_offset if entry is not None else None,
    )


def finish_open(conn: Connection, broker: Broker, meta: TxnMetadata, reason: txn.FenceReason) -> TxnMetadata:
    """End whatever is open, in one database transaction (timeouts, operator aborts, fencing inits):
    an Ongoing transaction is aborted for ``reason``; a prepared one keeps its decision — a
    PrepareCommit always completes as a commit."""
    if meta.state is TxnState.ONGOING:
        return complete(conn, broker, meta, txn.prepared(meta, "abort", broker.now(), reason))
    if meta.state.is_prepared:
        return complete(conn, broker, meta)
    return meta
