"""The operator's transaction APIs of KIP-664 (kafka-transactions.sh and the admin clients'
listTransactions, describeTransactions, describeProducers and abortTransaction): ListTransactions,
DescribeTransactions, DescribeProducers and WriteTxnMarkers as its abort sends it, over
``app.services.transactions`` and ``app.services.producers``.

Every gateway is the coordinator of every transaction and serves every partition (their state is
in PostgreSQL), so ListTransactions sent to any of them answers every transactional id, and no
partition is answered NOT_LEADER_OR_FOLLOWER.

ACLs, as Kafka: ListTransactions lists only the transactional ids the principal may describe;
DescribeTransactions answers each id it may not describe TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and
only the partitions of topics it may describe; DescribeProducers needs Read on each topic (else
its partitions are TOPIC_AUTHORIZATION_FAILED); WriteTxnMarkers needs ClusterAction on the cluster,
a broker's right (the operator's abort is sent with it: ``Api.WRITE_TXN_MARKERS``).
"""

from __future__ import annotations

from typing import Any

from api.kafka.handlers import RequestContext, access, error_code
from app.domain import transaction_listing
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import producers as producers_service
from app.services import transaction_aborts
from app.services import transactions as txn_service
from app.wire.kafka.messages import ApiKey

# DescribeProducers' coordinator epoch: the epoch of the coordinator that wrote the producer's last
# marker. One coordinator, in PostgreSQL, never moves: no epoch to tell (Kafka's "none yet").
NO_COORDINATOR_EPOCH = -1
NO_SEQUENCE = -1
NO_OFFSET = -1


def _code(api_key: int, exc: TxlogError) -> int:
    return error_code(api_key, exc).kafka_code


async def handle_list_transactions(ctx: RequestContext, request: Any) -> dict:
    """Every transactional id but the Dead ones, filtered by Kafka's state names (unknown names
    answered back in ``unknown_state_filters``), producer ids, from v1 a duration (running longer
    than ``duration_filter`` ms; negative: any), from v2 a pattern that must match the whole id
    (INVALID_REGULAR_EXPRESSION when it does not compile)."""
    duration = request.duration_filter if ctx.api_version >= 1 else -1
    pattern = request.transactional_id_pattern if ctx.api_version >= 2 else None
    try:
        found, unknown = await ctx.call(
            txn_service.list_transaction_states,
            ctx.broker,
            list(request.state_filters or ()),
            list(request.producer_id_filters or ()),
            duration,
            pattern,
        )
    except TxlogError as exc:
        return {
            "throttle_time_ms": 0,
            "error_code": _code(ApiKey.ListTransactions, exc),
            "unknown_state_filters": [],
            "transaction_states": [],
        }
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "unknown_state_filters": list(unknown),
        "transaction_states": [
            {"transactional_id": m.transactional_id, "producer_id": m.producer_id, "transaction_state": m.state.value}
            for m in found
            if access.shows(ctx, Api.LIST_TRANSACTIONS, m.transactional_id)
        ],
    }


async def handle_describe_transactions(ctx: RequestContext, request: Any) -> dict:
    """Each transactional id's state, producer id and epoch, timeout, the start of its current or
    last transaction (-1: none since the producer initialised) and the partitions of the
    transaction in flight; TRANSACTIONAL_ID_NOT_FOUND for one unknown."""
    asked = list(request.transactional_ids or ())
    refused = access.refused(ctx, Api.DESCRIBE_TRANSACTIONS, "transactional_id", asked)
    ids = [tid for tid in asked if tid not in refused]
    try:
        found = await ctx.call(txn_service.describe_transactions, ctx.broker, ids) if ids else []
    except TxlogError as exc:
        found = [exc] * len(ids)
    described = dict(zip(ids, found))
    answers = [refused[tid] if tid in refused else described[tid] for tid in asked]
    states = []
    for tid, answer in zip(asked, answers):
        if isinstance(answer, TxlogError):
            states.append(
                {
                    "error_code": _code(ApiKey.DescribeTransactions, answer),
                    "transactional_id": tid,
                    "transaction_state": "",
                    "transaction_timeout_ms": 0,
                    "transaction_start_time_ms": -1,
                    "producer_id": -1,
                    "producer_epoch": -1,
                    "topics": [],
                }
            )
            continue
        topics: dict[str, list[int]] = {}
        for topic, partition in transaction_listing.described_partitions(answer):
            if access.shows(ctx, Api.DESCRIBE_TRANSACTIONS, topic):
                topics.setdefault(topic, []).append(partition)
        states.append(
            {
                "error_code": 0,
                "transactional_id": tid,
                "transaction_state": answer.state.value,
                "transaction_timeout_ms": answer.timeout_ms,
                "transaction_start_time_ms": transaction_listing.start_time_ms(answer),
                "producer_id": answer.producer_id,
                "producer_epoch": answer.producer_epoch,
                "topics": [{"topic": t, "partitions": parts} for t, parts in topics.items()],
            }
        )
    return {"throttle_time_ms": 0, "transaction_states": states}


async def handle_describe_producers(ctx: RequestContext, request: Any) -> dict:
    """Each partition's active producers: id, epoch, last sequence (-1: none at this epoch), last
    timestamp, and the first offset of its open transaction there (-1: none);
    UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist."""
    asked = [(t.name, p) for t in request.topics for p in t.partition_indexes]
    refused = access.refused(ctx, Api.DESCRIBE_TOPIC_PRODUCERS, "topic", (t for t, _ in asked))
    allowed = [tp for tp in asked if tp[0] not in refused]
    try:
        answers: dict = await ctx.call(producers_service.describe_producers, ctx.broker, allowed) if allowed else {}
    except TxlogError as exc:
        answers = {tp: exc for tp in allowed}
    answers.update({tp: refused[tp[0]] for tp in asked if tp[0] in refused})
    topics: dict[str, list[dict]] = {}
    for topic, partition in asked:
        answer = answers[(topic, partition)]
        if isinstance(answer, TxlogError):
            entry = {
                "partition_index": partition,
                "error_code": _code(ApiKey.DescribeProducers, answer),
                "error_message": answer.message,
                "active_producers": [],
            }
        else:
            entry = {
                "partition_index": partition,
                "error_code": 0,
                "error_message": None,
                "active_producers": [
                    {
                        "producer_id": p.producer_id,
                        "producer_epoch": p.producer_epoch,
                        "last_sequence": NO_SEQUENCE if p.last_seq is None else p.last_seq,
                        "last_timestamp": p.last_timestamp_ms,
                        "coordinator_epoch": NO_COORDINATOR_EPOCH,
                        "current_txn_start_offset": NO_OFFSET if p.txn_first_offset is None else p.txn_first_offset,
                    }
                    for p in answer
                ],
            }
        topics.setdefault(topic, []).append(entry)
    return {"throttle_time_ms": 0, "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}


async def handle_write_txn_markers(ctx: RequestContext, request: Any) -> dict:
    """v1, as kafka-transactions.sh abort and the admin clients' abortTransaction send it: an ABORT
    marker for a producer's open transaction on a partition (its producer id and epoch from
    DescribeProducers; the coordinator epoch is not checked: one coordinator, which never moves).
    Each partition's transaction ends through the operator's one abort
    (``transaction_aborts.write_abort_marker``): a transaction the coordinator has open there is aborted
    whole, on every partition, its producer fenced; a hanging one gets its marker on that partition.
    A producer with nothing open there is answered as Kafka answers: no error. A COMMIT marker is
    the coordinator's alone to write (a Kafka broker requires CLUSTER_ACTION, a broker's right):
    INVALID_REQUEST."""
    access.check(ctx, Api.WRITE_TXN_MARKERS)
    markers = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for partition in topic.partition_indexes:
                code = await _abort_marker(ctx, marker, topic.name, partition)
                partitions.append({"partition_index": partition, "error_code": code})
            topics.append({"name": topic.name, "partitions": partitions})
        markers.append({"producer_id": marker.producer_id, "topics": topics})
    return {"markers": markers}


async def _abort_marker(ctx: RequestContext, marker: Any, topic: str, partition: int) -> int:
    if marker.transaction_result:
        return ErrorCode.INVALID_REQUEST.kafka_code
    try:
        await ctx.call(
            transaction_aborts.write_abort_marker, ctx.broker, topic, partition, marker.producer_id, marker.producer_epoch
        )
    except TxlogError as exc:
        return _code(ApiKey.WriteTxnMarkers, exc)
    return 0
