"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn + TxnOffsetCommit, EndTxn, and the read side
(describe, list, events). The operator's aborts are ``app.services.transaction_aborts``'s."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

from sqlalchemy.engine import Connection

from app import faults
from app.domain import transaction_listing
from app.domain import transactions as txn
from app.domain.groups.offsets import GroupOffset, check_committable, last_per_partition
from app.domain.limits import check_partitions_added
from app.domain.transactions import Result, TopicPartition, TxnEvent, TxnMetadata, TxnState
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator, executor, last_appends
from app.services.executor import Blocking, Operation
from app.storage import groups as groups_store
from app.storage import producers as producers_store
from app.storage import topics as topics_store
from app.storage import transactions as transactions_store


@dataclass(frozen=True)
class ProducerIdAndEpoch:
    producer_id: int
    producer_epoch: int


def _check_timeout(broker: Broker, timeout_ms: int | None) -> int:
    timeout = broker.settings.default_transaction_timeout_ms if timeout_ms is None else timeout_ms
    if not 0 < timeout <= broker.settings.max_transaction_timeout_ms:
        raise TxlogError(
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"Transaction timeout {timeout} ms must be positive and at most {broker.settings.max_transaction_timeout_ms} ms",
        )
    return timeout


def _check_tid(transactional_id: str) -> None:
    if not transactional_id or "\x00" in transactional_id or len(transactional_id) > txn.MAX_TRANSACTIONAL_ID_LENGTH:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A transactional id must be a non-empty string without NUL characters")


def init_producer_id(
    broker: Broker,
    transactional_id: str | None,
    timeout_ms: int | None = None,
    producer_id: int | None = None,
    producer_epoch: int | None = None,
) -> ProducerIdAndEpoch:
    """InitProducerId. Without a transactional id: a fresh producer id at epoch 0 (whatever producer
    id and epoch the request names: an idempotent producer recovering from UNKNOWN_PRODUCER_ID just
    starts over). With one: the first call creates the mapping at epoch 0; later calls raise the
    epoch, ending the previous epoch's open transaction (``_init_transactional``).

    ``producer_id``/``producer_epoch`` (both or neither) are KIP-360's, sent by Kafka clients from
    InitProducerId version 3 (the gateway passes ``None`` for Kafka's -1): when they are the
    transactional id's current ones the epoch is raised as above; when they are those of the init
    that made the current epoch, that init's answer is repeated; otherwise PRODUCER_FENCED
    (``transactions.check_init_producer``). ``None`` (the HTTP API, and Kafka's versions 0 to 2)
    always raises the epoch."""
    timeout = _check_timeout(broker, timeout_ms)
    if (producer_id is None) != (producer_epoch is None):
        raise TxlogError(ErrorCode.INVALID_REQUEST, "producer_id and producer_epoch go together")
    if transactional_id is None:
        with broker.db.transaction() as conn:
            return ProducerIdAndEpoch(producers_store.producer_id_next(conn), 0)
    _check_tid(transactional_id)
    caller = (producer_id, producer_epoch) if producer_id is not None and producer_epoch is not None else None
    for attempt in range(3):
        try:
            return _init_transactional(broker, transactional_id, timeout, caller)
        except TxlogError as exc:
            # Two first inits of one transactional id raced on its primary key (a duplicate key is
            # CONCURRENT_TRANSACTIONS); the loser retries and now finds the row.
            if exc.code is not ErrorCode.CONCURRENT_TRANSACTIONS or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _init_transactional(
    broker: Broker, transactional_id: str, timeout: int, caller: tuple[int, int] | None
) -> ProducerIdAndEpoch:
    with broker.db.transaction() as conn:
        meta = transactions_store.txn_get(conn, transactional_id, for_update=True)
        if meta is not None and meta.state is TxnState.DEAD:
            transactions_store.txn_delete(conn, transactional_id)
            meta = None
        if meta is None:
            # Unknown (or expired): whatever producer id the request names, it starts afresh.
            meta = coordinator.record(
                conn, broker, None, txn.created(transactional_id, producers_store.producer_id_next(conn), timeout, broker.now())
            )
        elif caller is not None and txn.check_init_producer(meta, *caller):
            pass  # a retry of the init that made the current epoch: the same answer, nothing changes
        else:
            # Fence the previous producer: abort its open transaction (or finish a prepared one),
            # which moves the epoch on — except a prepared one of a client that keeps its epoch
            # (transaction version 1) — otherwise raise the epoch here.
            holder = (meta.producer_id, meta.producer_epoch)
            meta = coordinator.finish_open(conn, broker, meta, "newer_epoch")
            ended_open = (meta.producer_id, meta.producer_epoch) != holder
            new_pid = None if ended_open else coordinator.new_producer_id_if_exhausted(conn, meta.producer_epoch)
            event = txn.reinitialized(meta, timeout, broker.now(), new_pid, ended_open=ended_open, previous=caller)
            meta = coordinator.record(conn, broker, meta, event)
        return ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch)


def _check_partitions_exist(conn, partitions: Sequence[TopicPartition]) -> None:
    missing = topics_store.partitions_missing(conn, partitions)
    if missing:
        raise TxlogError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "Unknown topic-partitions: " + ", ".join(f"{t}-{p}" for t, p in missing),
            partitions=[tuple(tp) for tp in missing],
        )


def add_partitions_to_txn(
    broker: Broker,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Sequence[TopicPartition],
    principal: str | None = None,
    transaction_version: int = txn.V2,
) -> TxnMetadata:
    """AddPartitionsToTxn, blocking (``add_partitions_to_txn_steps``)."""
    return executor.run(
        broker,
        functools.partial(
            add_partitions_to_txn_steps,
            broker,
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
            principal,
            transaction_version=transaction_version,
        ),
    )


def add_partitions_to_txn_steps(
    broker: Broker,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Sequence[TopicPartition],
    principal: str | None,
    now: int,
    transaction_version: int = txn.V2,
) -> Operation[TxnMetadata]:
    """AddPartitionsToTxn. ``principal``: the authenticated requester, whose open transactions are
    limited when this starts one (``coordinator.record``). Answers the transaction's state with the
    partitions asked for as its members (the locked path reads only those). ``transaction_version``:
    the request's protocol, recorded with the transaction (V1 for a Kafka client's request, V2 for
    the HTTP API's; ``txn.partitions_added``).

    Planned ahead against the transaction as this process last wrote it, if it did (Kafka clients
    before transactions V2 send one for every transaction): one conditional statement. Whatever
    that does not take is decided under the transaction's lock."""
    check_partitions_added(len(set(partitions)), broker.settings.max_partitions_per_transaction)
    remembered = last_appends.of(broker).txn(transactional_id)
    if remembered is not None:
        joined = yield from coordinator.join_if_unchanged(
            broker, remembered, producer_id, producer_epoch, partitions, principal, now, transaction_version=transaction_version
        )
        if joined is not None:
            return _added(joined[0], partitions)
    return (
        yield Blocking(
            functools.partial(
                _add_partitions_locked,
                broker,
                transactional_id,
                producer_id,
                producer_epoch,
                partitions,
                principal,
                transaction_version,
            )
        )
    )


def _add_partitions_locked(
    broker: Broker,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Sequence[TopicPartition],
    principal: str | None,
    transaction_version: int,
) -> TxnMetadata:
    with broker.db.transaction() as conn:
        meta = coordinator.locked(conn, transactional_id, partitions=list(partitions), groups=[])
        txn.check_producer(meta, producer_id, producer_epoch)
        _check_partitions_exist(conn, partitions)
        event = txn.partitions_added(meta, partitions, broker.now(), transaction_version=transaction_version)
        return coordinator.record(conn, broker, meta, event, principal=principal) if event else meta


def _added(meta: TxnMetadata, partitions: Sequence[TopicPartition]) -> TxnMetadata:
    """The answer to AddPartitionsToTxn: the state with the partitions asked for as its members."""
    return dataclasses.replace(meta, partitions=tuple(sorted(set(partitions))), groups=())


def add_offsets_to_txn(
    broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str, principal: str | None = None
) -> TxnMetadata:
    """AddOffsetsToTxn alone (Kafka clients before transactions V2 send it before TxnOffsetCommit):
    the group joins the transaction, starting it if none is open, in the first protocol (V1)."""
    return txn_offset_commit(
        broker, transactional_id, producer_id, producer_epoch, group_id, (), principal, transaction_version=txn.V1
    )


def txn_offset_commit(
    broker: Broker,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    group_id: str,
    offsets: Sequence[GroupOffset],
    principal: str | None = None,
    require_added: bool = False,
    fence: Callable[[Connection], None] | None = None,
    transaction_version: int | None = None,
) -> TxnMetadata:
    """AddOffsetsToTxn and TxnOffsetCommit in one: the group joins the transaction and the offsets
    wait, invisible to the group, until the transaction commits (dropped if it aborts). A partition
    given more than once keeps its last offset.

    ``require_added`` (TxnOffsetCommit from a Kafka client before transactions V2): the group must
    have joined the open transaction already (``add_offsets_to_txn``), else INVALID_TXN_STATE, so a
    delayed commit of an ended transaction cannot open the next one. The consumer group's own
    fence (generation and member id, KIP-447) is the caller's: the gateway's group coordinator
    checks it before calling, and ``fence`` (a consumer group of the next-generation protocol:
    ``consumer_groups.offset_commit_fence``) checks it again in the database transaction that
    writes the offsets, after the producer's checks; the offsets here are the transaction's.
    ``transaction_version``: the protocol the group joins in, recorded with the transaction
    (``txn.partitions_added``); by default V1 with ``require_added``, else V2 (TxnOffsetCommit v5,
    the HTTP API)."""
    if not group_id or "\x00" in group_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "group_id must be a non-empty string")
    offsets = last_per_partition(offsets)
    check_committable(offsets, broker.settings.offset_metadata_max_bytes)
    with broker.db.transaction() as conn:
        meta = coordinator.locked(conn, transactional_id, partitions=[], groups=[group_id])
        txn.check_producer(meta, producer_id, producer_epoch)
        if require_added:
            txn.check_group_added(meta, group_id)
        _check_partitions_exist(conn, [(o.topic, o.partition) for o in offsets])
        if fence is not None:
            fence(conn)
        version = transaction_version or (txn.V1 if require_added else txn.V2)
        event = txn.partitions_added(meta, (), broker.now(), groups=[group_id], transaction_version=version)
        if event:
            meta = coordinator.record(conn, broker, meta, event, principal=principal)
        if offsets:
            groups_store.pending_offsets_upsert(conn, group_id, transactional_id, producer_id, producer_epoch, offsets)
        return meta


@dataclass(frozen=True)
class EndTxnOutcome:
    state: TxnState
    producer_id: int  # for the next transaction
    producer_epoch: int


def end_txn(
    broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int, result: Result, transaction_version: int = 2
) -> EndTxnOutcome:
    """EndTxn, blocking (``end_txn_steps``)."""
    return executor.run(
        broker,
        functools.partial(end_txn_steps, broker, transactional_id, producer_id, producer_epoch, result, transaction_version),
    )


def end_txn_steps(
    broker: Broker,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    result: Result,
    transaction_version: int,
    now: int,
) -> Operation[EndTxnOutcome]:
    """EndTxn, in one database transaction: lock the transaction row, record the decision
    (PrepareCommit/PrepareAbort), write the markers, apply or drop the pending offsets and record
    CompleteCommit/CompleteAbort with the next epoch. Every partition lives in this database, so
    the decision and its completion commit together: a crash before the commit leaves the
    transaction Ongoing with nothing of it acknowledged (the client's retry or the timeout ends it).
    A transaction found prepared — its decision made durable by ``end_txn_prepare`` alone — is
    completed the same way.

    ``transaction_version`` is the transaction's protocol mode, taken from the EndTxn that decides
    it and recorded with the decision (``transactions.transaction_version``), so whoever completes
    the transaction does the same. 2 (the HTTP API; Kafka's transactions V2, EndTxn version 5)
    raises the epoch and answers the next transaction's; 1 (Kafka clients before V2, EndTxn
    versions 0 to 4) keeps the producer's epoch and its sequences. A retried EndTxn of a version 1
    transaction is answered while its state is still CompleteCommit/CompleteAbort; once the
    producer's next transaction is open at the same epoch a late EndTxn cannot be told from that
    transaction's own and ends it — the hole Kafka's protocol before V2 keeps, which V2 and the HTTP
    API close.

    An Ongoing transaction of the requesting producer is first ended as planned ahead
    (``coordinator.complete_if_unchanged``): known as this process last wrote it, or read without
    a lock, then ended by one conditional statement. Whatever that does not take — a retry, a
    refusal, anything moved meanwhile — is decided here under the transaction's lock."""
    _check_result(result)
    meta = last_appends.of(broker).txn(transactional_id)  # as this process last wrote it, if it did
    if meta is None or meta.state is not TxnState.ONGOING:
        meta = yield transactions_store.txn_read(transactional_id)
    decision = _end_decision(meta, producer_id, producer_epoch, result, transaction_version, now)
    if decision is not None:
        assert meta is not None
        faults.crash_point(faults.SERVER_CRASH_ENV, "end_txn_uncommitted")  # tests only: nothing committed
        ended = _ended((yield from coordinator.complete_if_unchanged(broker, meta, decision, now)), result)
        if ended is not None:
            return ended
    args = (broker, transactional_id, producer_id, producer_epoch, result, transaction_version)
    return (yield Blocking(functools.partial(_end_txn_locked, *args)))


def _end_txn_locked(
    broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int, result: Result, transaction_version: int
) -> EndTxnOutcome:
    with broker.db.transaction() as conn:
        meta = coordinator.locked(conn, transactional_id)
        retried = _retried_end(meta, producer_id, producer_epoch, result)
        if retried is not None:
            return retried
        decision = _decision(meta, producer_id, producer_epoch, result, transaction_version, broker.now())
        meta = coordinator.complete(conn, broker, meta, decision)
        faults.crash_point(faults.SERVER_CRASH_ENV, "end_txn_uncommitted")  # tests only: all written, nothing committed
    faults.crash_point(faults.SERVER_CRASH_ENV, "end_txn_committed")  # tests only: committed, not answered
    return EndTxnOutcome(txn.complete_state(result), meta.producer_id, meta.producer_epoch)


def _end_decision(
    meta: TxnMetadata | None, producer_id: int, producer_epoch: int, result: Result, transaction_version: int, now: int
) -> TxnEvent | None:
    """The decision an EndTxn planned ahead records: for an Ongoing transaction of the producer
    (as read without a lock, or remembered), None for anything else (decided under the lock)."""
    if meta is None or meta.state is not TxnState.ONGOING:
        return None
    try:
        decision = _decision(meta, producer_id, producer_epoch, result, transaction_version, now)
    except TxlogError:
        return None  # refused as of a read without a lock: decided again under it
    assert decision is not None
    return decision


def _ended(meta: TxnMetadata | None, result: Result) -> EndTxnOutcome | None:
    if meta is None:
        return None
    faults.crash_point(faults.SERVER_CRASH_ENV, "end_txn_committed")  # tests only: committed, not answered
    return EndTxnOutcome(txn.complete_state(result), meta.producer_id, meta.producer_epoch)


def _check_result(result: str) -> None:
    if result not in ("commit", "abort"):
        raise TxlogError(ErrorCode.INVALID_REQUEST, "result must be 'commit' or 'abort'")


def _retried_end(meta: TxnMetadata, producer_id: int, producer_epoch: int, result: Result) -> EndTxnOutcome | None:
    """The answer to an EndTxn for the transaction that already ended, ``None`` for any other."""
    if not txn.is_retry_of_last_end(meta, producer_id, producer_epoch):
        return None
    txn.check_end_retry(meta, result)
    return EndTxnOutcome(txn.complete_state(result), meta.producer_id, meta.producer_epoch)


def _decision(
    meta: TxnMetadata, producer_id: int, producer_epoch: int, result: Result, transaction_version: int, now: int
) -> TxnEvent | None:
    """The PrepareCommit/PrepareAbort event this EndTxn records, or ``None`` when the transaction is
    prepared with this decision already."""
    txn.check_producer(meta, producer_id, producer_epoch)
    if not meta.state.is_prepared:
        return txn.prepared(meta, result, now, transaction_version=transaction_version)
    if meta.state is not txn.prepare_state(result):
        raise TxlogError(ErrorCode.INVALID_TXN_STATE, f"Transaction is in {meta.state.value}; it cannot {result}")
    return None


def end_txn_prepare(
    broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int, result: Result, transaction_version: int = 2
) -> EndTxnOutcome | None:
    """EndTxn's decision alone, made durable in its own database transaction: the first step of
    ending a transaction whose partitions are not all in this database (their markers follow, by
    ``end_txn_complete``). What a crash between the steps leaves — a prepared transaction — is
    completed the same way by the sweeper, the next InitProducerId or a retried EndTxn. Answers a
    retry of an ended transaction itself."""
    _check_result(result)
    with broker.db.transaction() as conn:
        meta = coordinator.locked(conn, transactional_id, partitions=[], groups=[])
        retried = _retried_end(meta, producer_id, producer_epoch, result)
        if retried is not None:
            return retried
        decision = _decision(meta, producer_id, producer_epoch, result, transaction_version, broker.now())
        if decision is not None:
            coordinator.record(conn, broker, meta, decision)
    return None


def end_txn_complete(
    broker: Broker, transactional_id: str, producer_id: int, producer_epoch: int, result: Result
) -> EndTxnOutcome:
    """The second step after ``end_txn_prepare``: markers, offsets, the completed state and the
    next epoch."""
    with broker.db.transaction() as conn:
        meta = coordinator.locked(conn, transactional_id)
        if meta.state.is_prepared and (meta.producer_id, meta.producer_epoch) == (producer_id, producer_epoch):
            meta = coordinator.complete(conn, broker, meta)
        if (meta.last_producer_id, meta.last_producer_epoch) != (producer_id, producer_epoch):
            # Completed by someone else and the transactional id has moved on since (a newer
            # producer took over): the decision stands, but the epoch is no longer ours to hand out.
            # Say so, since a prepared decision is never reversed.
            err = txn.fenced_error(meta, producer_epoch)
            err.message += f"; this transaction's {result} was completed before the producer was fenced"
            err.details["transaction_result"] = result
            raise err
        return EndTxnOutcome(txn.complete_state(result), meta.producer_id, meta.producer_epoch)


# --- read side ------------------------------------------------------------------------------------


def describe(broker: Broker, transactional_id: str) -> TxnMetadata:
    with broker.db.read() as conn:
        meta = transactions_store.txn_get(conn, transactional_id)
    if meta is None:
        raise TxlogError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"Transactional id {transactional_id!r} not found")
    return meta


def list_transactions(
    broker: Broker, state: str | None = None, older_than_ms: int | None = None, limit: int = 1000
) -> list[TxnMetadata]:
    """``GET /v1/transactions``: the first ``limit`` transactional ids, Dead ones included, in one
    state when asked, whose transaction started more than ``older_than_ms`` ago when asked."""
    if state is not None and state not in {s.value for s in TxnState}:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown state {state!r}; one of {', '.join(s.value for s in TxnState)}")
    started_before = broker.now() - older_than_ms if older_than_ms is not None else None
    with broker.db.read() as conn:
        return transactions_store.txn_page(
            conn, None if state is None else [state], started_before_ms=started_before, limit=limit
        )


MAX_EVENTS_PAGE = 1000


def events(
    broker: Broker, transactional_id: str, limit: int = MAX_EVENTS_PAGE, before_version: int | None = None
) -> list[TxnEvent]:
    """One page of a transactional id's history, oldest first: the ``limit`` most recent events
    older than ``before_version`` (all of the newest when it is not given). A page costs its size,
    however long the history is."""
    if not 1 <= limit <= MAX_EVENTS_PAGE:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"limit must be between 1 and {MAX_EVENTS_PAGE}")
    with broker.db.read() as conn:
        evs = transactions_store.txn_events(conn, transactional_id, limit, before_version)
        if not evs and transactions_store.txn_get(conn, transactional_id) is None:
            raise TxlogError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"Transactional id {transactional_id!r} not found")
    return evs


def pending_offsets(broker: Broker, transactional_id: str) -> list[dict]:
    with broker.db.read() as conn:
        return groups_store.pending_offsets_of_txn(conn, transactional_id)


# Kafka's ListTransactions answers every transactional id at once; they are read a page at a time.
_LIST_PAGE = 1000


def list_transaction_states(
    broker: Broker,
    state_names: Sequence[str] = (),
    producer_ids: Sequence[int] = (),
    duration_ms: int = -1,
    pattern: str | None = None,
) -> tuple[list[TxnMetadata], tuple[str, ...]]:
    """Kafka's ListTransactions (kafka-transactions.sh list): every transactional id but the Dead
    ones, filtered as ``transaction_listing.list_filter`` and ``transaction_listing.is_listed`` say — by Kafka's state names, by
    producer id, running longer than ``duration_ms`` (negative: any), matching the whole of
    ``pattern``. Answers them (without their members) in id order, and the state names given that
    are unknown."""
    f = transaction_listing.list_filter(state_names, producer_ids, duration_ms, pattern)
    if f.matches_nothing:
        return [], f.unknown_states
    states = sorted(s.value for s in (f.states or set(TxnState) - {TxnState.DEAD}))
    pids = sorted(f.producer_ids) or None
    now = broker.now()
    found: list[TxnMetadata] = []
    after: str | None = None
    with broker.db.read() as conn:
        while True:
            page = transactions_store.txn_page(conn, states, pids, after=after, limit=_LIST_PAGE)
            found.extend(m for m in page if transaction_listing.is_listed(f, m, now))
            if len(page) < _LIST_PAGE:
                return found, f.unknown_states
            after = page[-1].transactional_id


def describe_transactions(broker: Broker, transactional_ids: Sequence[str]) -> list[TxnMetadata | TxlogError]:
    """Kafka's DescribeTransactions (kafka-transactions.sh describe): each id's state, or its error —
    INVALID_REQUEST for an empty id, TRANSACTIONAL_ID_NOT_FOUND for one unknown or Dead (being
    removed), as Kafka's coordinator answers. One read for all of them."""
    answers: list[TxnMetadata | TxlogError] = []
    with broker.db.read() as conn:
        for tid in transactional_ids:
            if not tid:
                answers.append(TxlogError(ErrorCode.INVALID_REQUEST, "A transactional id must not be empty"))
                continue
            meta = None if "\x00" in tid else transactions_store.txn_get(conn, tid)  # no id has a NUL
            if meta is None or meta.state is TxnState.DEAD:
                answers.append(TxlogError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"Transactional id {tid!r} not found"))
            else:
                answers.append(meta)
    return answers
