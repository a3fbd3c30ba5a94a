"""The transaction APIs: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and
EndTxn, over ``app.services.transactions``.

Both of Kafka's transaction protocols are served, each transaction in the one its client speaks
(``api.kafka.transaction_protocol``). In the first, a producer keeps its epoch and its sequences
across transactions, adds each partition and group with AddPartitionsToTxn / AddOffsetsToTxn
before writing to it, and EndTxn (below v5) does not bump the epoch: the coordinator's version-1
mode. In transactions V2 (KIP-890: Java clients from 4.0, when ApiVersions finalizes
``transaction.version`` 2), Produce v12 and TxnOffsetCommit v5 add their partition or group
themselves, and EndTxn v5 ends the transaction with a new epoch, answered for the next one (a new
producer id once the epoch is exhausted): a late EndTxn of an ended transaction is then told apart
from the next one's. The rules (fencing, states, timeouts, the refusal of a batch for a partition
not added) are the services'. Any gateway can coordinate any transaction: its state is in
PostgreSQL, under the transaction's row lock.

ACLs, as Kafka: every request needs Write on its transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an idempotent InitProducerId needs IdempotentWrite on the
cluster or Write on some topic (KIP-679; else CLUSTER_AUTHORIZATION_FAILED); AddPartitionsToTxn
needs Write on each topic (the refused TOPIC_AUTHORIZATION_FAILED, the others
OPERATION_NOT_ATTEMPTED); AddOffsetsToTxn and TxnOffsetCommit need Read on the group
(GROUP_AUTHORIZATION_FAILED), and TxnOffsetCommit Read on each topic (per partition).
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

from api.kafka import transaction_protocol
from api.kafka.handlers import RequestContext, access, error_code
from api.kafka.handlers.offsets import committed_offsets, offset_commit_refusal
from app.domain.acls import Api
from app.domain.transactions import Result
from app.errors import ErrorCode, TxlogError
from app.services import transactions as txn_service
from app.wire.kafka.messages import ApiKey

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

# PRODUCER_FENCED (KIP-588) is sent only from these versions; older clients know the fencing of
# a producer as INVALID_PRODUCER_EPOCH.
_PRODUCER_FENCED_SINCE = {"InitProducerId": 4, "AddPartitionsToTxn": 2, "AddOffsetsToTxn": 2, "EndTxn": 2, "TxnOffsetCommit": 3}


def _code(exc: TxlogError, api: str, version: int) -> int:
    if exc.code is ErrorCode.PRODUCER_FENCED and version < _PRODUCER_FENCED_SINCE[api]:
        return ErrorCode.INVALID_PRODUCER_EPOCH.kafka_code
    if exc.details.get("not_added"):
        return transaction_protocol.not_in_transaction_code(ApiKey[api], version, exc).kafka_code
    return error_code(ApiKey[api], exc).kafka_code


async def handle_init_producer_id(ctx: RequestContext, request: Any) -> dict:
    """A producer id and epoch: fresh for an idempotent producer; for a transactional id, the
    current producer id at the next epoch, which fences the previous producer and ends its open
    transaction. From v3 a producer that already holds an id and epoch names them (KIP-360): a
    retry of the init that made the current epoch gets the same answer, a stale one is fenced."""
    pid = request.producer_id if ctx.api_version >= 3 else NO_PRODUCER_ID
    epoch = request.producer_epoch if ctx.api_version >= 3 else -1
    transactional = request.transactional_id is not None
    given = pid != NO_PRODUCER_ID and transactional
    api = Api.INIT_TRANSACTIONAL_PRODUCER_ID if transactional else Api.INIT_IDEMPOTENT_PRODUCER_ID
    refused = access.refusal(ctx, api, transactional_id=request.transactional_id)
    if refused is not None:
        return {"throttle_time_ms": 0, "error_code": refused.code.kafka_code, "producer_id": NO_PRODUCER_ID, "producer_epoch": -1}
    try:
        got = await ctx.call(
            txn_service.init_producer_id,
            ctx.broker,
            request.transactional_id,
            # an idempotent producer has no transaction to time out (librdkafka sends its default)
            request.transaction_timeout_ms if transactional else None,
            pid if given else None,
            epoch if given else None,
        )
    except TxlogError as exc:
        return {
            "throttle_time_ms": 0,
            "error_code": _code(exc, "InitProducerId", ctx.api_version),
            "producer_id": NO_PRODUCER_ID,
            "producer_epoch": -1,
        }
    return {"throttle_time_ms": 0, "error_code": 0, "producer_id": got.producer_id, "producer_epoch": got.producer_epoch}


async def handle_add_partitions_to_txn(ctx: RequestContext, request: Any) -> dict:
    """v0-3: the partitions join the producer's transaction, starting it if none is open. One
    outcome for all of them, as the coordinator records them in one step; when some partition does
    not exist, it is UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED."""
    # v0-3 name their fields v3_and_below_* (v4+ is between brokers, a batch of transactions).
    asked = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    access.check(ctx, Api.ADD_PARTITIONS_TO_TXN, transactional_id=request.v3_and_below_transactional_id)
    refused = access.refused(ctx, Api.ADD_PARTITIONS_TO_TXN, "topic", (t for t, _ in asked))
    if refused:
        not_attempted = ErrorCode.OPERATION_NOT_ATTEMPTED.kafka_code
        return _added({tp: refused[tp[0]].code.kafka_code if tp[0] in refused else not_attempted for tp in asked})
    args = (request.v3_and_below_transactional_id, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch, asked)
    try:
        version = transaction_protocol.transaction_version(ApiKey.AddPartitionsToTxn, ctx.api_version)
        steps = functools.partial(txn_service.add_partitions_to_txn_steps, ctx.broker, *args, None, transaction_version=version)
        await ctx.loop_executor.run(steps)
        codes = {tp: 0 for tp in asked}
    except TxlogError as exc:
        named: Iterable[tuple[str, int]] = exc.details.get("partitions", ())  # type: ignore[assignment]  # details hold plain values
        missing = set(named) if exc.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION else set()
        code = _code(exc, "AddPartitionsToTxn", ctx.api_version)
        if missing:
            not_attempted = ErrorCode.OPERATION_NOT_ATTEMPTED.kafka_code
            codes = {tp: code if tp in missing else not_attempted for tp in asked}
        else:
            codes = {tp: code for tp in asked}
    return _added(codes)


def _added(codes: dict[tuple[str, int], int]) -> dict:
    results: dict[str, list[dict]] = {}
    for (topic, partition), code in codes.items():
        results.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": code})
    return {
        "throttle_time_ms": 0,
        "results_by_topic_v3_and_below": [{"name": t, "results_by_partition": parts} for t, parts in results.items()],
    }


async def handle_add_offsets_to_txn(ctx: RequestContext, request: Any) -> dict:
    """The consumer group joins the transaction, so that TxnOffsetCommit may follow."""
    refused = access.refusal(ctx, Api.ADD_OFFSETS_TO_TXN, transactional_id=request.transactional_id, group=request.group_id)
    if refused is not None:
        return {"throttle_time_ms": 0, "error_code": refused.code.kafka_code}
    try:
        await ctx.call(
            txn_service.add_offsets_to_txn,
            ctx.broker,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
            request.group_id,
        )
    except TxlogError as exc:
        return {"throttle_time_ms": 0, "error_code": _code(exc, "AddOffsetsToTxn", ctx.api_version)}
    return {"throttle_time_ms": 0, "error_code": 0}


async def handle_txn_offset_commit(ctx: RequestContext, request: Any) -> dict:
    """The group's offsets, pending in the transaction until it commits. From v3 the request
    carries the consumer's generation and member id, and a zombie (an older generation of the
    group, KIP-447) is refused by the group coordinator before anything is written. Below v5 the
    group must have joined the transaction with AddOffsetsToTxn (else TRANSACTION_ABORTABLE from
    v4, INVALID_TXN_STATE below); from v5 (transactions V2) the commit adds it."""
    access.check(ctx, Api.TXN_OFFSET_COMMIT, transactional_id=request.transactional_id, group=request.group_id)
    refused = access.refused(ctx, Api.TXN_OFFSET_COMMIT, "topic", (t.name for t in request.topics))
    every = committed_offsets(request.topics, leader_epochs=ctx.api_version >= 2)
    offsets = [o for o in every if o.topic not in refused]
    code = 0
    attempted = bool(offsets) or not refused
    fence = None
    if ctx.api_version >= 3 and ctx.groups is not None and attempted:
        fenced, fence = await offset_commit_refusal(
            ctx,
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id,
            [(o.topic, o.partition) for o in offsets],
            transactional=True,
        )
        if fenced is not None:
            code = fenced.kafka_code
    if code == 0 and attempted:
        try:
            await ctx.call(
                txn_service.txn_offset_commit,
                ctx.broker,
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
                offsets,
                None,
                not transaction_protocol.adds_to_transaction(ApiKey.TxnOffsetCommit, ctx.api_version),
                fence,
            )
        except TxlogError as exc:
            code = _code(exc, "TxnOffsetCommit", ctx.api_version)
    topics: dict[str, list[dict]] = {}
    for o in every:
        error = refused[o.topic].code.kafka_code if o.topic in refused else code
        topics.setdefault(o.topic, []).append({"partition_index": o.partition, "error_code": error})
    return {"throttle_time_ms": 0, "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()]}


async def handle_end_txn(ctx: RequestContext, request: Any) -> dict:
    """Commit or abort: markers, offsets and the completed state in one database transaction. Below
    v5 the producer's epoch is kept (the first transaction protocol); from v5 (transactions V2) the
    transaction ends with a new epoch, or a new producer id once the epoch is exhausted, answered
    for the next transaction. A retry of the EndTxn that ended the producer's last transaction is
    answered as that one was, with the current producer id and epoch."""
    result: Result = "commit" if request.committed else "abort"
    version = transaction_protocol.transaction_version(ApiKey.EndTxn, ctx.api_version)
    refused = access.refusal(ctx, Api.END_TXN, transactional_id=request.transactional_id)
    if refused is not None:
        return _ended(refused.code.kafka_code)
    steps = functools.partial(
        txn_service.end_txn_steps,
        ctx.broker,
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        result,
        version,
    )
    try:
        outcome = await ctx.loop_executor.run(steps)
    except TxlogError as exc:
        return _ended(_code(exc, "EndTxn", ctx.api_version))
    return _ended(0, outcome.producer_id, outcome.producer_epoch)


def _ended(code: int, producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH) -> dict:
    """EndTxn's answer; the producer id and epoch are v5's (ignored by older versions)."""
    return {"throttle_time_ms": 0, "error_code": code, "producer_id": producer_id, "producer_epoch": producer_epoch}
