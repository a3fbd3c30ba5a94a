"""A produce that commits its transaction: a transactional batch and the commit of its transaction
in one request (the HTTP API's ``"commit": true``), for transactions of one batch.

Planned ahead — the transaction as this process last wrote it, the partitions where its last appends
left them — the batch, its partition joining the transaction (starting it if none is open), the
decision, every partition's COMMIT marker and the completed state with the next epoch are written
by one conditional statement in autocommit (``coordinator.record_if_unchanged``): one request, one
statement and one WAL flush, where a produce and an EndTxn are two of each. The batch and the marker
of its own partition are one batch of that statement, its last record the marker
(``AppendBatch.trailing_marker``), stored exactly as the batch followed by its marker.

Anything else — nothing remembered, anything moved, a refusal, a retry — runs the two operations
one after the other (``produce.produce_steps``, then ``transactions.end_txn_steps``): the same
outcome in two database transactions. A crash between them leaves the transaction Ongoing with
nothing of it acknowledged, ended by the client's retry or by its timeout, as after a produce whose
EndTxn never came.

A retry of a request whose commit was written (its answer lost) finds the transaction ended at the
request's epoch: its batch is answered as the duplicate it is, with the end's outcome as a retried
EndTxn is answered — or refused as that EndTxn would be, if the transaction ended otherwise."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from app.domain import transactions as txn
from app.domain.log import AppendBatch
from app.domain.producer_state import Duplicate, after_marker, check_append
from app.domain.records import CONTROL_COMMIT, NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator, executor, last_appends, produce
from app.services.executor import Blocking, Operation
from app.services.transactions import EndTxnOutcome, end_txn_steps
from app.storage import append as append_store

# What a produce step answers a producer whose epoch is no longer the transaction's: for a retry
# of a request that committed, the look for its batch as a duplicate.
_FENCED = (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_PRODUCER_ID_MAPPING)


@dataclass(frozen=True)
class CommittedProduce:
    """The batch's answer and its transaction's end: the state and the next producer id and epoch."""

    produced: produce.ProduceResult
    ended: EndTxnOutcome


def produce_committed(broker: Broker, topic: str, partition: int, req: produce.ProduceRequest) -> CommittedProduce:
    """``produce_committed_steps``, blocking."""
    return executor.run(broker, functools.partial(produce_committed_steps, broker, topic, partition, req))


def produce_committed_steps(
    broker: Broker, topic: str, partition: int, req: produce.ProduceRequest, now: int
) -> Operation[CommittedProduce]:
    """Append ``req`` (a transactional batch) to its transaction and commit the transaction."""
    if req.transactional_id is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "commit needs a transactional_id (and its producer id, epoch and sequence)")
    sizes = produce.validate(broker, req)
    ahead = yield from _committed_ahead(broker, topic, partition, req, now, sizes)
    if ahead is not None:
        return ahead
    pid, epoch = req.producer_id, req.producer_epoch
    assert pid is not None and epoch is not None  # a transactional request has them (produce.validate)
    try:
        produced = yield from produce.produce_steps(broker, topic, partition, req, now)
    except TxlogError as exc:
        if exc.code not in _FENCED:
            raise
        duplicate = yield Blocking(functools.partial(_duplicate, broker, topic, partition, req))
        if duplicate is None:
            raise
        produced = duplicate
    ended = yield from end_txn_steps(broker, req.transactional_id, pid, epoch, "commit", txn.V2, now)
    return CommittedProduce(produced, ended)


def _duplicate(broker: Broker, topic: str, partition: int, req: produce.ProduceRequest) -> produce.ProduceResult | None:
    """The batch's original answer if the partition has it appended already (a retry), else None."""
    with broker.db.transaction() as conn:
        position = append_store.partition_lock_for_append(conn, topic, partition, req.producer_id)
    decision = check_append(position.producer_state, req.producer_id, req.producer_epoch, req.base_sequence, len(req.records))  # type: ignore[arg-type]  # a transactional request has them (produce.validate)
    if not isinstance(decision, Duplicate):
        return None
    b = decision.batch
    return produce.ProduceResult(b.first_offset, b.last_offset, b.timestamp_ms, position.log_start_offset, duplicate=True)


def _committed_ahead(
    broker: Broker, topic: str, partition: int, req: produce.ProduceRequest, now: int, sizes: list[int]
) -> Operation[CommittedProduce | None]:
    """The batch and the commit planned ahead and written by one statement; None, having written
    nothing, for the two operations."""
    planned = _planned(broker, last_appends.of(broker), topic, partition, req, now, sizes)
    if planned is None:
        return None
    meta, completion, result = planned
    written = yield from coordinator.completed_if_unchanged(broker, meta, completion)
    if written is None:
        return None
    new, log_starts = written
    produced = dataclasses.replace(result, log_start_offset=log_starts[0])
    return CommittedProduce(produced, EndTxnOutcome(new.state, new.producer_id, new.producer_epoch))


def _planned(
    broker: Broker,
    memory: last_appends.LastAppends,
    topic: str,
    partition: int,
    req: produce.ProduceRequest,
    now: int,
    sizes: list[int],
) -> tuple[txn.TxnMetadata, coordinator.Completion, produce.ProduceResult] | None:
    """The transaction's end planned ahead: its events (the partition joining it if it is not in
    it, the decision, the completion), its batches (this one ending with its partition's marker
    first, then the markers of its other partitions) and the positions they were planned against;
    None when anything is not remembered or needs the locks (a refusal, a limit to count, a new
    producer id)."""
    tid, pid, epoch = req.transactional_id, req.producer_id, req.producer_epoch
    assert tid is not None and pid is not None and epoch is not None
    meta, position = memory.txn(tid), memory.get(topic, partition, pid)
    if meta is None or position is None or meta.state.is_prepared:
        return None
    try:
        txn.check_producer(meta, pid, epoch)
    except TxlogError:
        return None
    plan = produce.append_planned(topic, partition, req, now, sizes, position)
    if plan is None:
        return None
    added = txn.partitions_added(meta, [(topic, partition)], now, transaction_version=txn.V2)
    if added is not None and req.principal is not None and not meta.state.is_open:
        return None  # the principal's open transactions are counted under the locks
    joined = txn.apply(meta, added) if added is not None else meta
    if len(joined.partitions) > broker.settings.max_partitions_per_transaction:
        return None
    decision = txn.prepared(joined, "commit", now, transaction_version=txn.V2)
    prepared = txn.apply(joined, decision)
    if txn.needs_new_producer_id(prepared.producer_epoch):
        return None
    batches, positions = [_ending_with_marker(plan.batch, now)], [position]
    for t, p in sorted(set(joined.partitions) - {(topic, partition)}):
        at = memory.get(t, p, pid)
        if at is None:
            return None
        batches.append(coordinator.marker(t, p, at, pid, epoch, True, now))
        positions.append(at)
    events = ((added,) if added is not None else ()) + (decision, txn.completed(prepared, now, None))
    return meta, coordinator.Completion(events, batches, positions, "commit"), plan.result


def _ending_with_marker(batch: AppendBatch, now: int) -> AppendBatch:
    """``batch`` with its partition's COMMIT marker as its last record."""
    assert batch.producer_id is not None and batch.producer_epoch is not None and batch.producer_state is not None
    return dataclasses.replace(
        batch,
        records=[*batch.records, NewRecord(None, None)],
        sizes=[*batch.record_sizes(), 0],
        producer_state=after_marker(batch.producer_state, batch.producer_id, batch.producer_epoch, now),
        trailing_marker=CONTROL_COMMIT,
    )
