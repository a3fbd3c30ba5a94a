"""The operator's aborts of transactions (kafka-transactions.sh abort, the HTTP API's and the admin
pages'): a transactional id's open transaction through its coordinator, and the open transaction a
producer holds on one partition, through the coordinator when it has that transaction open there,
else by an ABORT marker on the partition alone (Kafka's WriteTxnMarkers)."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.log import unknown_partition
from app.domain.transactions import TxnMetadata
from app.errors import ErrorCode, TxlogError
from app.services import Broker, coordinator
from app.services.inspect import transactions as inspect_transactions
from app.storage import append as append_store
from app.storage import transactions as transactions_store


def abort_by_operator(broker: Broker, transactional_id: str) -> TxnMetadata:
    """kafka-transactions.sh abort: abort the open transaction and fence its producer. A prepared
    transaction keeps its decision (a PrepareCommit completes as a commit)."""
    with broker.db.transaction() as conn:
        meta = transactions_store.txn_get(conn, transactional_id, for_update=True)
        if meta is None:
            raise TxlogError(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"Transactional id {transactional_id!r} not found")
        if not meta.state.is_open:
            raise TxlogError(
                ErrorCode.INVALID_TXN_STATE, f"Transaction {transactional_id!r} is {meta.state.value}: nothing to abort"
            )
        return coordinator.finish_open(conn, broker, meta, "aborted_by_operator")


@dataclass(frozen=True)
class PartitionAbort:
    """What ``abort_on_partition`` ended: the whole transaction through its coordinator
    (``transaction`` set), or only the partition's open transaction by an ABORT marker."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    start_offset: int
    transactional_id: str | None
    marker_offset: int | None  # the ABORT marker written on the partition, without the coordinator
    transaction: TxnMetadata | None  # the transaction as the coordinator's abort left it


def abort_on_partition(
    broker: Broker, topic: str, partition: int, producer_id: int | None = None, start_offset: int | None = None
) -> PartitionAbort:
    """kafka-transactions.sh abort ``--topic --partition --start-offset`` (or ``--producer-id``):
    end the open transaction a producer holds on a partition. One the coordinator has open with
    this partition is aborted through the coordinator, on every partition, its producer fenced —
    never torn; one it does not (a hanging transaction) gets an ABORT marker on this partition
    alone (Kafka's WriteTxnMarkers), which moves the last stable offset past it."""
    found = [
        o
        for o in inspect_transactions.open_transactions(broker, topic, partition)
        if (producer_id is None or o.producer_id == producer_id) and (start_offset is None or o.start_offset == start_offset)
    ]
    wanted = " and ".join(
        w
        for w in (
            f"producer id {producer_id}" if producer_id is not None else "",
            f"start offset {start_offset}" if start_offset is not None else "",
        )
        if w
    )
    if not found:
        raise TxlogError(
            ErrorCode.INVALID_TXN_STATE, f"No open transaction on {topic}-{partition}" + (f" with {wanted}" if wanted else "")
        )
    if len(found) > 1:
        raise TxlogError(
            ErrorCode.INVALID_REQUEST,
            f"{len(found)} open transactions on {topic}-{partition}; name one by producer id or start offset: "
            + ", ".join(f"producer id {o.producer_id} from offset {o.start_offset}" for o in found),
        )
    o = found[0]
    if o.ongoing_at_coordinator:
        assert o.transactional_id is not None
        meta = abort_by_operator(broker, o.transactional_id)
        return PartitionAbort(topic, partition, o.producer_id, o.producer_epoch, o.start_offset, o.transactional_id, None, meta)
    with broker.db.transaction() as conn:
        position = append_store.partition_lock_for_append(conn, topic, partition, o.producer_id)
        entry = position.producer_state
        if entry is None or entry.txn_first_offset != o.start_offset or entry.producer_epoch != o.producer_epoch:
            raise TxlogError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"The open transaction of producer id {o.producer_id} on {topic}-{partition} changed meanwhile; look again",
            )
        marker = coordinator.write_marker(conn, topic, partition, position, o.producer_id, o.producer_epoch, False, broker.now())
    return PartitionAbort(topic, partition, o.producer_id, o.producer_epoch, o.start_offset, o.transactional_id, marker, None)


def write_abort_marker(
    broker: Broker, topic: str, partition: int, producer_id: int, producer_epoch: int
) -> PartitionAbort | None:
    """Kafka's WriteTxnMarkers with an ABORT marker for one partition, as kafka-transactions.sh abort
    sends it (the producer id and epoch DescribeProducers showed): the producer's open transaction
    on the partition ends by ``abort_on_partition``, the one way an operator aborts — through the
    coordinator when it has the transaction open there, else by a marker on this partition alone.
    An epoch older than the open transaction's is INVALID_PRODUCER_EPOCH, as a partition refuses a
    marker of a fenced epoch. ``None`` when the producer has no open transaction there: nothing to
    abort. Kafka would append a marker that changes nothing and answer success; the answer is the
    same, with nothing written."""
    if "\x00" in topic:
        raise unknown_partition(topic, partition)  # no topic's name has a NUL
    open_here = [o for o in inspect_transactions.open_transactions(broker, topic, partition) if o.producer_id == producer_id]
    if not open_here:
        return None
    if producer_epoch < open_here[0].producer_epoch:
        raise TxlogError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"Producer id {producer_id} holds its open transaction on {topic}-{partition} at epoch "
            f"{open_here[0].producer_epoch}, not the older {producer_epoch}",
        )
    try:
        return abort_on_partition(broker, topic, partition, producer_id)
    except TxlogError as exc:
        if exc.code is ErrorCode.INVALID_TXN_STATE:
            return None  # it ended meanwhile: nothing left to abort
        raise
