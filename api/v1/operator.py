"""What an operator's tools read and do besides the client protocol: consumer groups with their lag
(Kafka's ListGroups and DescribeGroups with kafka-consumer-groups.sh's offsets), the open
transactions on partitions and the hanging ones among them (kafka-transactions.sh find-hanging of
KIP-664), and the abort of a partition's open transaction (its abort). Routes parse and shape; the
services decide."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from api.auth import requires, visible
from api.v1 import schemas as s
from api.v1.responses import errors
from api.v1.routes import broker, txn_json
from app.domain.acls import Api
from app.errors import TxlogError
from app.services import Broker, kafka_groups, producers, transaction_aborts
from app.services.inspect import groups as inspect_groups
from app.services.inspect import transactions as inspect_transactions

router = APIRouter(prefix="/v1")


@router.get(
    "/groups", dependencies=[Depends(requires(Api.LIST_GROUPS))], response_model=s.GroupList, responses=errors(), tags=["groups"]
)
def list_groups(request: Request, b: Broker = Depends(broker)) -> dict:
    """Every consumer group with committed or pending offsets, its partitions and total lag (what a
    read_committed consumer of the group still has to read: up to each last stable offset)."""
    return {"groups": [vars(g) for g in visible(request, Api.LIST_GROUPS, inspect_groups.groups(b), lambda g: g.group_id)]}


@router.get(
    "/groups/{group}",
    dependencies=[Depends(requires(Api.DESCRIBE_GROUPS))],
    response_model=s.GroupDescription,
    responses=errors(400),
    tags=["groups"],
)
def describe_group(group: str, b: Broker = Depends(broker)) -> dict:
    """A group's committed offsets beside each partition's log start, high watermark and last
    stable offset, with the lag against the last stable offset, and its offsets still pending in
    open transactions. A group that never committed has none (as Kafka's OffsetFetch answers)."""
    d = inspect_groups.group_detail(b, group)
    return {
        "group_id": d.group_id,
        "lag": d.lag,
        "offsets": [{**vars(p), "lag": p.lag} for p in d.offsets],
        "pending_offsets": d.pending,
    }


@router.delete(
    "/groups/{group}",
    dependencies=[Depends(requires(Api.DELETE_GROUPS))],
    response_model=s.GroupDeleted,
    responses=errors(400, 404, 409),
    tags=["groups"],
)
def delete_group(group: str, b: Broker = Depends(broker)) -> dict:
    """Kafka's DeleteGroups, at the group's coordinator (the gateway that holds its members): a
    group with members is 409 NON_EMPTY_GROUP; otherwise it goes with its committed offsets and
    those pending in open transactions; one with neither is 404 GROUP_ID_NOT_FOUND. 503
    COORDINATOR_NOT_AVAILABLE when the coordinator does not answer in time."""
    kafka_groups.delete_group(b, group)
    return {"group_id": group, "deleted": True}


def _open_json(o: inspect_transactions.OpenTransaction) -> dict:
    return {**vars(o), "hanging": list(o.hanging)}


@router.get(
    "/open-transactions",
    dependencies=[Depends(requires(Api.DESCRIBE_PRODUCERS))],
    response_model=s.OpenTransactions,
    responses=errors(400, 404),
    tags=["transactions"],
)
def open_transactions(
    topic: str | None = None,
    partition: int | None = Query(None, ge=0, le=s.INT32),
    hanging: bool = False,
    max_transaction_timeout_ms: int | None = Query(None, ge=0, le=s.INT64),
    b: Broker = Depends(broker),
) -> dict:
    """The open transactions on every partition, a topic's or one partition's, as the partitions'
    producer states have them (Kafka's DescribeProducers), each with the reasons it is hanging:
    ``unknown_to_coordinator``, ``not_ongoing_at_coordinator``, ``partition_not_in_transaction``
    (nothing will write its marker there) or ``open_too_long`` (open longer than
    ``max_transaction_timeout_ms``, default the server's maximum transaction timeout). With
    ``hanging=true`` only the hanging ones (kafka-transactions.sh find-hanging)."""
    found = (inspect_transactions.find_hanging if hanging else inspect_transactions.open_transactions)(
        b, topic, partition, max_transaction_timeout_ms
    )
    limit = b.settings.max_transaction_timeout_ms if max_transaction_timeout_ms is None else max_transaction_timeout_ms
    return {"max_transaction_timeout_ms": limit, "open_transactions": [_open_json(o) for o in found]}


@router.get(
    "/topics/{topic}/partitions/{partition}/producers",
    dependencies=[Depends(requires(Api.DESCRIBE_PRODUCERS))],
    response_model=s.PartitionProducers,
    responses=errors(400, 404),
    tags=["transactions"],
)
def describe_producers(topic: str, partition: int, b: Broker = Depends(broker)) -> dict:
    """The partition's active producers (Kafka's DescribeProducers, kafka-transactions.sh
    describe-producers): each producer id's epoch, last sequence and timestamp, and the first
    offset of its open transaction there (null: none). 404 UNKNOWN_TOPIC_OR_PARTITION for a
    partition that does not exist."""
    answer = producers.describe_producers(b, [(topic, partition)])[(topic, partition)]
    if isinstance(answer, TxlogError):
        raise answer
    return {
        "topic": topic,
        "partition": partition,
        "producers": [
            {
                "producer_id": p.producer_id,
                "producer_epoch": p.producer_epoch,
                "last_sequence": p.last_seq,
                "last_timestamp_ms": p.last_timestamp_ms,
                "current_txn_start_offset": p.txn_first_offset,
            }
            for p in answer
        ],
    }


@router.post(
    "/topics/{topic}/partitions/{partition}/abort-transaction",
    dependencies=[Depends(requires(Api.ABORT_TRANSACTION))],
    response_model=s.PartitionAbortResponse,
    responses=errors(400, 404, 409, 413),
    tags=["transactions"],
)
def abort_on_partition(topic: str, partition: int, body: s.PartitionAbortBody, b: Broker = Depends(broker)) -> dict:
    """kafka-transactions.sh abort by partition: end the open transaction on the partition (the only
    one, or the one of ``producer_id`` / starting at ``start_offset``). One its coordinator has open
    with this partition is aborted whole and its producer fenced (``transaction`` in the answer); a
    hanging one gets an ABORT marker on this partition alone (``marker_offset``)."""
    r = transaction_aborts.abort_on_partition(b, topic, partition, body.producer_id, body.start_offset)
    return {
        "topic": r.topic,
        "partition": r.partition,
        "producer_id": r.producer_id,
        "producer_epoch": r.producer_epoch,
        "start_offset": r.start_offset,
        "transactional_id": r.transactional_id,
        "marker_offset": r.marker_offset,
        "transaction": txn_json(r.transaction, b) if r.transaction is not None else None,
    }
