"""The transaction coordinator's state machine, event-sourced.

The seven states and their valid previous states are declared once, as data (Kafka's
TransactionState). Every change of a transaction is a ``TxnEvent``: a frozen value produced by a
pure function here, persisted by storage (event row + current-state row in one database
transaction), and folded by ``apply`` — replaying a transactional id's events rebuilds its current
state exactly. Time is passed in as ``now`` (epoch milliseconds). What Kafka's ListTransactions and
DescribeTransactions answer of these states is ``app.domain.transaction_listing``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Iterable, Literal

from app.domain.producer_state import MAX_EPOCH, fenced
from app.domain.records import MAX_STRING_LENGTH
from app.errors import ErrorCode, TxlogError

TopicPartition = tuple[str, int]
Result = Literal["commit", "abort"]

MAX_TRANSACTIONAL_ID_LENGTH = MAX_STRING_LENGTH  # a Kafka STRING


class TxnState(Enum):
    """Stored by name; the names are Kafka's."""

    EMPTY = "Empty"  # InitProducerId, or a transaction just ended: nothing in flight
    ONGOING = "Ongoing"  # AddPartitionsToTxn / transactional produce / AddOffsetsToTxn
    PREPARE_COMMIT = "PrepareCommit"  # EndTxn(commit): the decision is durable, markers follow
    PREPARE_ABORT = "PrepareAbort"  # EndTxn(abort), timeout, operator abort, or fencing init
    COMPLETE_COMMIT = "CompleteCommit"  # every partition carries its COMMIT marker
    COMPLETE_ABORT = "CompleteAbort"  # every partition carries its ABORT marker
    DEAD = "Dead"  # the transactional id expired; it is removed next

    @property
    def is_open(self) -> bool:
        return self in OPEN_STATES

    @property
    def is_prepared(self) -> bool:
        return self in PREPARED_STATES

    @property
    def expiration_allowed(self) -> bool:
        return self in ENDED_STATES


S = TxnState
# The groups of states, defined here once; every other list of state names (the SQL of storage
# and its partial indexes, the CLI, the admin pages) is derived from these.
# Prepared: the decision is durable and the markers are being written.
PREPARED_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})
# Open: a transaction is in flight (its records may still be undecided or unmarked); the last
# stable offsets of its partitions wait for it.
OPEN_STATES = frozenset({S.ONGOING, *PREPARED_STATES})
# Ended: nothing in flight; the transactional id may expire from here.
ENDED_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
# The names, in TxnState's order (Kafka's), as stored and shown.
STATE_NAMES: tuple[str, ...] = tuple(s.value for s in TxnState)
OPEN_STATE_NAMES: tuple[str, ...] = tuple(s.value for s in TxnState if s in OPEN_STATES)

# Which states each state may be entered from. ``None`` is "the transactional id did not exist".
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState | None]] = {
    S.EMPTY: frozenset({None, *ENDED_STATES}),
    S.ONGOING: frozenset({S.ONGOING, *ENDED_STATES}),
    # Ending a transaction with nothing in it is allowed (transactions V2): from Empty/Complete*.
    S.PREPARE_COMMIT: frozenset({S.ONGOING, *ENDED_STATES}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, *ENDED_STATES}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: ENDED_STATES,
}


def check_transition(from_state: TxnState | None, to_state: TxnState) -> None:
    """The one place a transition is validated."""
    if from_state not in VALID_PREVIOUS[to_state]:
        name = from_state.value if from_state else "(none)"
        raise TxlogError(ErrorCode.INVALID_TXN_STATE, f"Transaction cannot move from {name} to {to_state.value}")


# Why a producer epoch stopped being current (the "reason" of a PRODUCER_FENCED error):
# another InitProducerId took over, the server aborted the transaction at its timeout, an operator
# aborted it, the transactional id expired, or the producer's own EndTxn ended the transaction
# (its next transaction has the next epoch).
FenceReason = Literal["newer_epoch", "timed_out", "aborted_by_operator", "expired", "transaction_ended"]

# The transaction protocols (Kafka's clientTransactionVersion): V1, of Kafka clients before
# transactions V2, keeps the producer's epoch across its transactions; V2 (KIP-890) ends each
# transaction with a new epoch.
V1, V2 = 1, 2


@dataclass(frozen=True)
class TxnMetadata:
    """The current state of a transactional id: the fold of its events."""

    transactional_id: str
    producer_id: int
    producer_epoch: int  # the epoch of the open transaction, or of the next one
    state: TxnState
    timeout_ms: int
    version: int
    updated_at_ms: int
    epoch_changed_at_ms: int
    started_at_ms: int | None = None
    partitions: tuple[TopicPartition, ...] = ()
    groups: tuple[str, ...] = ()
    # The last transaction that ended: its producer id and epoch and the decision taken, so that a
    # late or repeated EndTxn for it is recognised as a retry (transactions V2, KIP-890).
    last_producer_id: int | None = None
    last_producer_epoch: int | None = None
    last_result: Result | None = None
    fence_reason: FenceReason | None = None  # why the previous epoch was superseded
    # How the producer ends its transactions: 2 (Kafka's transactions V2, KIP-890; the HTTP API)
    # gives every transaction its own epoch; 1 (Kafka clients before V2) keeps the epoch across
    # transactions of one producer session.
    transaction_version: int = V2


@dataclass(frozen=True)
class TxnEvent:
    """One state transition. Scalar fields are the state after the event; collections are deltas."""

    transactional_id: str
    version: int
    from_state: TxnState | None
    to_state: TxnState
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    at_ms: int
    partitions_added: tuple[TopicPartition, ...] = ()
    groups_added: tuple[str, ...] = ()
    last_producer_id: int | None = None
    last_producer_epoch: int | None = None
    result: Result | None = None
    reason: FenceReason | None = None
    transaction_version: int = V2


def apply(meta: TxnMetadata | None, event: TxnEvent) -> TxnMetadata:
    """Fold one event into the state. Pure; replay is ``functools.reduce(apply, events, None)``."""
    check_transition(meta.state if meta else None, event.to_state)
    if meta is not None and event.version != meta.version + 1:
        raise ValueError(f"event version {event.version} does not follow {meta.version}")
    to = event.to_state
    starts_new = starts_transaction(meta, event)
    if meta is None or resets_members(meta, event):
        partitions: tuple[TopicPartition, ...] = ()
        groups: tuple[str, ...] = ()
    else:
        partitions, groups = meta.partitions, meta.groups
    partitions = tuple(sorted(set(partitions) | set(event.partitions_added)))
    groups = tuple(sorted(set(groups) | set(event.groups_added)))
    epoch_changed = meta is None or (meta.producer_id, meta.producer_epoch) != (event.producer_id, event.producer_epoch)
    if starts_new:
        started = event.at_ms
    elif to is S.EMPTY:
        started = None
    else:
        started = meta.started_at_ms if meta else None
    return TxnMetadata(
        transactional_id=event.transactional_id,
        producer_id=event.producer_id,
        producer_epoch=event.producer_epoch,
        state=to,
        timeout_ms=event.timeout_ms,
        version=event.version,
        updated_at_ms=event.at_ms,
        epoch_changed_at_ms=event.at_ms if epoch_changed or meta is None else meta.epoch_changed_at_ms,
        started_at_ms=started,
        partitions=partitions,
        groups=groups,
        last_producer_id=event.last_producer_id,
        last_producer_epoch=event.last_producer_epoch,
        last_result=event.result
        if to in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
        else (meta.last_result if meta and to is not S.EMPTY else None),
        fence_reason=event.reason,
        transaction_version=event.transaction_version,
    )


def starts_transaction(meta: TxnMetadata | None, event: TxnEvent) -> bool:
    """A transaction starts when a partition or group joins it (Ongoing) or, for an empty
    transaction, when it is ended straight from Empty/Complete*."""
    return (event.to_state is S.ONGOING or event.to_state.is_prepared) and (meta is None or meta.state in ENDED_STATES)


def resets_members(meta: TxnMetadata | None, event: TxnEvent) -> bool:
    """Whether the event leaves the previous transaction's partitions and groups behind: a new
    transaction starts (no markers go there), or a producer (re)initialises."""
    return meta is None or event.to_state is S.EMPTY or starts_transaction(meta, event)


def replay(events: Iterable[TxnEvent]) -> TxnMetadata | None:
    meta: TxnMetadata | None = None
    for event in events:
        meta = apply(meta, event)
    return meta


def _event(meta: TxnMetadata, to: TxnState, now: int, **changes: Any) -> TxnEvent:
    check_transition(meta.state, to)
    base: dict[str, Any] = dict(
        transactional_id=meta.transactional_id,
        version=meta.version + 1,
        from_state=meta.state,
        to_state=to,
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        timeout_ms=meta.timeout_ms,
        at_ms=now,
        last_producer_id=meta.last_producer_id,
        last_producer_epoch=meta.last_producer_epoch,
        reason=meta.fence_reason,
        transaction_version=meta.transaction_version,
    )
    base.update(changes)
    return TxnEvent(**base)


def needs_new_producer_id(epoch: int) -> bool:
    """Raising the epoch past MAX_EPOCH needs a new producer id (at epoch 0)."""
    return epoch >= MAX_EPOCH


def bumped(producer_id: int, epoch: int, new_producer_id: int | None) -> tuple[int, int]:
    if needs_new_producer_id(epoch):
        if new_producer_id is None:
            raise ValueError("epoch exhausted: a new producer id is required")
        return new_producer_id, 0
    return producer_id, epoch + 1


# --- the transitions, one function per cause --------------------------------------------------


def created(transactional_id: str, producer_id: int, timeout_ms: int, now: int) -> TxnEvent:
    """InitProducerId for an unknown transactional id."""
    return TxnEvent(transactional_id, 1, None, S.EMPTY, producer_id, 0, timeout_ms, now)


def reinitialized(
    meta: TxnMetadata,
    timeout_ms: int,
    now: int,
    new_producer_id: int | None = None,
    *,
    ended_open: bool = False,
    previous: tuple[int, int] | None = None,
) -> TxnEvent:
    """InitProducerId for a known, ended transactional id: raise the epoch by one, fencing older
    holders. When this init had to end the previous epoch's open transaction (``ended_open``), that
    ending already moved the epoch on and nobody holds the new one yet, so the init takes it as it
    is: the caller's epoch is raised by exactly one either way.

    ``previous``: the producer id and epoch the request named (KIP-360, ``check_init_producer``),
    remembered as the last ones so that a retry of this very init is answered with the epoch it
    handed out instead of being fenced. An init that names none forgets them: a new producer
    instance took over, and no older request may come back."""
    pid, epoch = (
        (meta.producer_id, meta.producer_epoch) if ended_open else bumped(meta.producer_id, meta.producer_epoch, new_producer_id)
    )
    last_pid, last_epoch = previous if previous is not None else (None, None)
    return _event(
        meta,
        S.EMPTY,
        now,
        producer_id=pid,
        producer_epoch=epoch,
        timeout_ms=timeout_ms,
        last_producer_id=last_pid,
        last_producer_epoch=last_epoch,
        reason="newer_epoch",
    )


def _check_not_prepared(meta: TxnMetadata) -> None:
    if meta.state.is_prepared:
        raise TxlogError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"Transaction {meta.transactional_id!r} is in {meta.state.value}; retry when it completes",
        )


def check_transaction_version(transaction_version: int) -> None:
    if transaction_version not in (V1, V2):
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unknown transaction version {transaction_version}")


def partitions_added(
    meta: TxnMetadata, partitions: Iterable[TopicPartition], now: int, groups: Iterable[str] = (), transaction_version: int = V2
) -> TxnEvent | None:
    """AddPartitionsToTxn / AddOffsetsToTxn (explicit or by a transactional produce). Starts the
    transaction if none is open. ``None`` when nothing changes.

    ``transaction_version``: the protocol of the request that adds them — V1 for AddPartitionsToTxn
    and AddOffsetsToTxn (and a batch or TxnOffsetCommit of a client before V2, which adds nothing:
    its partition or group is in already), V2 for Produce v12 and TxnOffsetCommit v5 that add
    theirs, and the HTTP API. It is recorded with the event as the transaction's version, from the
    transaction's start: as Kafka's coordinator (4.x) records the adding request's
    ``clientTransactionVersion`` with every transition that adds to a transaction. A request of one
    protocol joining a transaction begun in the other is not refused, in Kafka neither: the version
    becomes that of the latest request that added something (one that adds nothing changes
    nothing), and the EndTxn that decides the transaction records its own (``prepared``)."""
    check_transaction_version(transaction_version)
    new_parts = tuple(sorted(set(partitions) - (set(meta.partitions) if meta.state is S.ONGOING else set())))
    new_groups = tuple(sorted(set(groups) - (set(meta.groups) if meta.state is S.ONGOING else set())))
    if meta.state is S.ONGOING and not new_parts and not new_groups:
        return None
    _check_not_prepared(meta)
    return _event(
        meta, S.ONGOING, now, partitions_added=new_parts, groups_added=new_groups, transaction_version=transaction_version
    )


def check_partition_added(meta: TxnMetadata, topic: str, partition: int) -> None:
    """Transactions before V2 add each partition with AddPartitionsToTxn before producing to it; a
    transactional batch for a partition that is not in the open transaction is refused (KIP-890
    part 1, Kafka's transaction verification): it is a batch delayed from a transaction that has
    ended, and appending it would open the next transaction behind the producer's back. ``meta``
    is the transaction's state with this partition among its members if it is one. Transactions V2
    (and the HTTP API) add the partition with the batch instead. While the transaction is being
    ended, CONCURRENT_TRANSACTIONS (retriable), as everywhere."""
    _check_not_prepared(meta)
    if meta.state is not S.ONGOING or (topic, partition) not in meta.partitions:
        raise TxlogError(
            ErrorCode.INVALID_TXN_STATE,
            f"Partition was not added to the transaction: {topic}-{partition} is not in the open transaction "
            f"of {meta.transactional_id!r} ({meta.state.value}); add it with AddPartitionsToTxn first",
            not_added=True,
        )


def check_group_added(meta: TxnMetadata, group_id: str) -> None:
    """The same for TxnOffsetCommit: before V2 the group joins with AddOffsetsToTxn first."""
    _check_not_prepared(meta)
    if meta.state is not S.ONGOING or group_id not in meta.groups:
        raise TxlogError(
            ErrorCode.INVALID_TXN_STATE,
            f"Group was not added to the transaction: {group_id!r} is not in the open transaction of "
            f"{meta.transactional_id!r} ({meta.state.value}); add it with AddOffsetsToTxn first",
            not_added=True,
        )


def prepare_state(result: Result) -> TxnState:
    return S.PREPARE_COMMIT if result == "commit" else S.PREPARE_ABORT


def complete_state(result: Result) -> TxnState:
    return S.COMPLETE_COMMIT if result == "commit" else S.COMPLETE_ABORT


def prepared_result(state: TxnState) -> Result:
    """The decision a PrepareCommit/PrepareAbort state holds."""
    assert state.is_prepared, state
    return "commit" if state is S.PREPARE_COMMIT else "abort"


def prepared(
    meta: TxnMetadata, result: Result, now: int, reason: FenceReason | None = None, transaction_version: int = V2
) -> TxnEvent:
    """EndTxn, a timeout, an operator abort or a fencing init decides the transaction's outcome.
    ``transaction_version`` 1 (an EndTxn from a client before transactions V2) keeps the producer's
    epoch once the transaction completes; the server's own aborts always move it on."""
    check_transaction_version(transaction_version)
    if reason is not None:
        transaction_version = V2
    return _event(meta, prepare_state(result), now, reason=reason, transaction_version=transaction_version)


def completed(meta: TxnMetadata, now: int, new_producer_id: int | None = None) -> TxnEvent:
    """Every marker is written: the transaction is complete and the epoch moves on, so the next
    transaction (or, after a fencing abort, nobody) uses a fresh epoch — except for a version 1
    transaction, whose producer keeps its epoch (and its sequences) for the next one."""
    if not meta.state.is_prepared:
        raise TxlogError(ErrorCode.INVALID_TXN_STATE, f"Transaction is in {meta.state.value}, not prepared")
    result = prepared_result(meta.state)
    if meta.transaction_version == V1:
        pid, epoch = meta.producer_id, meta.producer_epoch
    else:
        pid, epoch = bumped(meta.producer_id, meta.producer_epoch, new_producer_id)
    return _event(
        meta,
        complete_state(result),
        now,
        producer_id=pid,
        producer_epoch=epoch,
        last_producer_id=meta.producer_id,
        last_producer_epoch=meta.producer_epoch,
        result=result,
    )


def expired(meta: TxnMetadata, now: int) -> TxnEvent:
    """The transactional id was idle past transactional.id.expiration.ms."""
    return _event(meta, S.DEAD, now, reason="expired")


# What the sweeper finds overdue (and the admin pages report): an Ongoing transaction past its
# timeout, to abort; a prepared one not completed since a moment ago, whose EndTxn died between
# its steps, to complete. Storage states the same in SQL, served by a partial index each
# (``app.storage.transactions.OVERDUE``); tests/integration/test_sweeper.py holds the two equal.


def is_timed_out(meta: TxnMetadata, now: int) -> bool:
    return meta.state is S.ONGOING and meta.started_at_ms is not None and now - meta.started_at_ms > meta.timeout_ms


def is_stuck_prepared(meta: TxnMetadata, before_ms: int) -> bool:
    """Prepared, and not completed since before ``before_ms``."""
    return meta.state.is_prepared and meta.updated_at_ms < before_ms


def is_overdue(meta: TxnMetadata, now: int, prepared_before_ms: int) -> bool:
    return is_timed_out(meta, now) or is_stuck_prepared(meta, prepared_before_ms)


def deadline_ms(meta: TxnMetadata) -> int | None:
    if meta.state is not S.ONGOING or meta.started_at_ms is None:
        return None
    return meta.started_at_ms + meta.timeout_ms


# --- checks of a client's producer id and epoch --------------------------------------------------


def check_producer(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> None:
    """The request's producer id and epoch must be the transactional id's current ones."""
    if producer_id != meta.producer_id and producer_id != meta.last_producer_id:
        raise TxlogError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"Producer id {producer_id} is not assigned to transactional id {meta.transactional_id!r}",
        )
    if meta.state is S.DEAD:
        raise fenced_error(meta, producer_epoch, "expired")
    if (producer_id, producer_epoch) == (meta.producer_id, meta.producer_epoch):
        return
    if producer_id == meta.producer_id and producer_epoch > meta.producer_epoch:
        raise TxlogError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"Producer epoch {producer_epoch} is newer than the current epoch {meta.producer_epoch}",
            reason="newer_epoch",
        )
    raise fenced_error(meta, producer_epoch)


def check_init_producer(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> bool:
    """InitProducerId from a producer that names its producer id and epoch (KIP-360, version 3 and
    later: a producer recovering from an abortable error, or bumping its epoch, keeps its identity).
    False when they are the transactional id's current ones: the init goes ahead and raises the
    epoch, ending an open transaction first, as every init does. True when they are the ones the
    last init was made with and nothing happened since (``reinitialized(previous=...)``): a retry of
    that init whose answer was lost, answered with the epoch it handed out, changing nothing.
    Anything else is a producer that another init or an ended transaction left behind:
    PRODUCER_FENCED (Kafka answers INVALID_PRODUCER_EPOCH to requests before version 4)."""
    if (producer_id, producer_epoch) == (meta.producer_id, meta.producer_epoch):
        return False
    if (
        meta.state is S.EMPTY
        and meta.last_result is None
        and (producer_id, producer_epoch) == (meta.last_producer_id, meta.last_producer_epoch)
    ):
        return True
    err = fenced_error(meta, producer_epoch)
    if producer_id not in (meta.producer_id, meta.last_producer_id):
        err.message = (
            f"Producer id {producer_id} is fenced: transactional id {meta.transactional_id!r} now uses producer id "
            f"{meta.producer_id} at epoch {meta.producer_epoch}; reason: {err.details['reason']}"
        )
    raise err


def fenced_error(meta: TxnMetadata, producer_epoch: int, reason: FenceReason | None = None) -> TxlogError:
    since = datetime.fromtimestamp(meta.epoch_changed_at_ms / 1000, UTC).isoformat(timespec="milliseconds")
    if reason is None:
        # The epoch just before the current one knows exactly why it was superseded: the server
        # or an operator ended its transaction (fence_reason), or its producer's own EndTxn did.
        just_superseded = producer_epoch == meta.last_producer_epoch and meta.last_result is not None
        if just_superseded:
            reason = meta.fence_reason or "transaction_ended"
        else:
            reason = "newer_epoch"
    return fenced(meta.producer_epoch, producer_epoch, reason, since)


def check_batch_producer(
    transactional_id: str, meta: TxnMetadata | None, retire_reason: FenceReason | None, producer_id: int, producer_epoch: int
) -> None:
    """A batch from a producer id that was given to ``transactional_id``, wherever it is appended
    and whether or not it names the transactional id: only the transactional id's current producer
    id and epoch may write. ``meta`` is the transactional id's state (``None``: removed since);
    ``retire_reason`` is set when the producer id is no longer the transactional id's."""
    if meta is None or meta.state is S.DEAD:
        raise TxlogError(
            ErrorCode.PRODUCER_FENCED,
            f"Producer id {producer_id} is fenced: its transactional id {transactional_id!r} expired; reason: expired",
            reason="expired",
        )
    if retire_reason is not None or producer_id not in (meta.producer_id, meta.last_producer_id):
        err = fenced_error(meta, producer_epoch, retire_reason or "newer_epoch")
        err.message = (
            f"Producer id {producer_id} is fenced: transactional id {transactional_id!r} now uses producer id "
            f"{meta.producer_id} at epoch {meta.producer_epoch}; reason: {err.details['reason']}"
        )
        raise err
    check_producer(meta, producer_id, producer_epoch)


def is_retry_of_last_end(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> bool:
    """An EndTxn for the transaction that ended last: with transactions V2 its epoch is behind the
    current one; with version 1 (same epoch) only while no newer transaction has started — once
    one has, a late EndTxn cannot be told from the new transaction's own (Kafka's known hole of
    version 1, closed by V2)."""
    if meta.last_result is None or (producer_id, producer_epoch) != (meta.last_producer_id, meta.last_producer_epoch):
        return False
    same_epoch = (producer_id, producer_epoch) == (meta.producer_id, meta.producer_epoch)
    return not same_epoch or meta.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)


def check_end_retry(meta: TxnMetadata, result: Result) -> None:
    """An EndTxn for the transaction that already ended (late or repeated). It may only repeat the
    decision the producer itself took; it never touches the newer transaction. If the server ended
    that transaction (timeout, operator, a newer producer), its producer is fenced."""
    if meta.fence_reason is not None:
        raise fenced_error(meta, meta.last_producer_epoch or 0, meta.fence_reason)
    if meta.last_result != result:
        raise TxlogError(
            ErrorCode.INVALID_TXN_STATE,
            f"Transaction at epoch {meta.last_producer_epoch} already ended with {meta.last_result}; cannot {result} it",
        )
