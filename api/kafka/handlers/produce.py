"""Produce: each partition's record batch decoded, checked and appended by the produce service.

A partition's answer follows its own database commit (acks=1 and acks=-1 are the same thing here:
an acknowledged batch is committed in PostgreSQL, which is as durable as the database is). The
partitions of one request are appended concurrently, each in its own database transaction, as a
Kafka broker appends each partition to its own log; each gets its own error code. A duplicate (a
producer's retry of a batch already appended) is answered with the offsets it was given the first
time.

A transactional batch below v12 (Kafka's first transaction protocol) goes only to a partition added
with AddPartitionsToTxn; refused otherwise, TRANSACTION_ABORTABLE from v11 and INVALID_TXN_STATE
below, as Kafka's transaction verification answers it. From v12 (transactions V2) the batch adds
its partition to the transaction itself (``api.kafka.transaction_protocol``).

Any gateway appends to any partition, its leader in Metadata or not (no NOT_LEADER_OR_FOLLOWER):
the log is one, in PostgreSQL, under the partition's row lock (``api.kafka.cluster``).

ACLs, as Kafka 3+: a request naming a transactional id needs Write on it (else the whole request
is TRANSACTIONAL_ID_AUTHORIZATION_FAILED); each topic needs Write (else its partitions are
TOPIC_AUTHORIZATION_FAILED, whether it exists or not). An idempotent batch needs nothing more:
InitProducerId checked the producer (KIP-679).
"""

from __future__ import annotations

import asyncio
import functools
import operator
import time
from typing import Any

from api.kafka import transaction_protocol
from api.kafka.handlers import RequestContext, access, error_code
from api.kafka.handlers.quotas import produce_throttle
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import produce as produce_service
from app.services.produce import ProduceRequest
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.records import decode
from app.wire.kafka.records.batch import NO_PRODUCER_ID, RecordBatch
from app.wire.kafka.records.decode import new_records

# Produce v0-2 carry message sets of magic 0 and 1, which txlog does not store (Kafka 4 refuses them
# the same way); they are advertised only because librdkafka before 2.11.1 turns compression off
# when Produce v0 is not (KAFKA-18659).
FIRST_SERVED_VERSION = 3
_ACKS = (-1, 0, 1)
_OFFSET_DELTA = operator.itemgetter(0)


async def handle_produce(ctx: RequestContext, request: Any) -> dict | None:
    started = time.perf_counter()
    acks = request.acks
    code = None
    if ctx.api_version < FIRST_SERVED_VERSION:
        code = TxlogError(ErrorCode.UNSUPPORTED_VERSION, "Produce below v3 (message format v0/v1) is not supported")
    elif acks not in _ACKS:
        code = TxlogError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks must be -1, 0 or 1, not {acks}")
    transactional_id = request.transactional_id if ctx.api_version >= 3 else None
    api = Api.PRODUCE if transactional_id is None else Api.PRODUCE_TRANSACTIONAL
    access.check(ctx, api, transactional_id=transactional_id)
    refused = access.refused(ctx, api, "topic", (t.name for t in request.topic_data))
    jobs = []
    for topic in request.topic_data:
        for part in topic.partition_data:
            if code is not None or topic.name in refused:
                jobs.append(_failed(topic.name, part.index, code or refused[topic.name], ctx.api_version))
            else:
                jobs.append(_append(ctx, topic.name, part.index, part.records, transactional_id))
    # One partition, as a producer's request mostly is: awaited as it is, without a task around it.
    answers = [await jobs[0]] if len(jobs) == 1 else await asyncio.gather(*jobs)
    if ctx.quotas is not None and ctx.quotas.enabled:
        size = sum(len(part.records or b"") for topic in request.topic_data for part in topic.partition_data)
        ctx.throttle_ms = produce_throttle(ctx, size, time.perf_counter() - started)
    if acks == 0:
        return None
    by_topic: dict[str, list[dict]] = {}
    for name, answer in answers:
        by_topic.setdefault(name, []).append(answer)
    return {
        "responses": [{"name": name, "partition_responses": parts} for name, parts in by_topic.items()],
        "throttle_time_ms": ctx.throttle_ms,
    }


async def _failed(topic: str, partition: int, exc: TxlogError, version: int) -> tuple[str, dict]:
    return topic, _error(partition, exc, version)


def _error(partition: int, exc: TxlogError, version: int) -> dict:
    # A batch of a fenced producer epoch is INVALID_PRODUCER_EPOCH on Produce, as from Kafka 2.7
    # (KIP-588): PRODUCER_FENCED is the coordinator's word, and clients that do not know it
    # (aiokafka) would read an unknown error instead of the fencing.
    if exc.code is ErrorCode.PRODUCER_FENCED:
        code = ErrorCode.INVALID_PRODUCER_EPOCH
    elif exc.details.get("not_added"):
        code = transaction_protocol.not_in_transaction_code(ApiKey.Produce, version, exc)
    else:
        code = error_code(ApiKey.Produce, exc)
    return {
        "index": partition,
        "error_code": code.kafka_code,
        "base_offset": -1,
        "log_append_time_ms": -1,
        "log_start_offset": -1,
        "error_message": exc.message,
    }


async def _append(
    ctx: RequestContext, topic: str, partition: int, data: bytes | None, transactional_id: str | None
) -> tuple[str, dict]:
    try:
        if data is None or decode.compressed(data):
            req = await ctx.call(_request, ctx, data, transactional_id)  # decompressed in a thread, not on the loop
        else:
            req = _request(ctx, data, transactional_id)
        steps = functools.partial(produce_service.produce_steps, ctx.broker, topic, partition, req)
        result = await ctx.loop_executor.run(steps)
    except TxlogError as exc:
        return topic, _error(partition, exc, ctx.api_version)
    return topic, {
        "index": partition,
        "error_code": 0,
        "base_offset": result.base_offset,
        "log_append_time_ms": -1,  # CreateTime: the producer's timestamps are kept
        "log_start_offset": result.log_start_offset,
    }


def _request(ctx: RequestContext, data: bytes | None, transactional_id: str | None) -> produce_service.ProduceRequest:
    settings = ctx.broker.settings
    batches = decode.decode_batches(
        data, max_records=settings.kafka_max_batch_records, max_decompressed_bytes=settings.kafka_max_decompressed_bytes
    )
    if len(batches) != 1:
        # As Kafka from Produce v3: one batch per partition, so one batch is one append, answered
        # with one base offset.
        raise TxlogError(
            ErrorCode.INVALID_RECORD, f"A produce request carries exactly one record batch per partition, not {len(batches)}"
        )
    require_added = not transaction_protocol.adds_to_transaction(ApiKey.Produce, ctx.api_version)
    return produce_request(batches[0], transactional_id, require_added=require_added, batch_bytes=len(data or b""))


def produce_request(
    batch: RecordBatch,
    transactional_id: str | None = None,
    principal: str | None = None,
    require_added: bool = False,
    batch_bytes: int | None = None,
) -> ProduceRequest:
    """What ``app.services.produce.produce`` takes for one partition's batch, once the batch is one
    a client may send (as Kafka's ``LogValidator`` checks it): INVALID_RECORD for a control batch,
    an empty batch, offset deltas other than 0, 1, …, count - 1, a transactional batch without a
    producer id or an idempotent one without a base sequence; INVALID_REQUEST for a transactional
    batch without the request's ``transactional_id``. A non-transactional batch is produced
    without the transactional id even when the request names one. ``require_added``: Produce
    below v12 (the first transaction protocol), whose transactional batches go only to partitions
    added with AddPartitionsToTxn; from v12 (transactions V2) the batch adds its partition. ``batch_bytes``: the batch's size as framed, which Kafka's message.max.bytes
    bounds (``ProduceRequest.batch_bytes``)."""
    if batch.is_control:
        raise TxlogError(ErrorCode.INVALID_RECORD, "Clients are not allowed to write control records")
    count = len(batch.records)
    if count == 0:
        raise TxlogError(ErrorCode.INVALID_RECORD, "A batch must contain at least one record")
    if batch.last_offset_delta != count - 1 or list(map(_OFFSET_DELTA, batch.records)) != list(range(count)):
        raise TxlogError(
            ErrorCode.INVALID_RECORD,
            f"The batch's offset deltas must run 0 .. {count - 1} (last offset delta {batch.last_offset_delta})",
        )
    pid = batch.producer_id
    if pid == NO_PRODUCER_ID:
        if batch.is_transactional:
            raise TxlogError(ErrorCode.INVALID_RECORD, "A transactional batch needs a producer id")
        return ProduceRequest(new_records(batch), principal=principal, batch_bytes=batch_bytes)
    if pid < 0:
        raise TxlogError(ErrorCode.INVALID_RECORD, f"Invalid producer id {pid}")
    if batch.base_sequence < 0:
        raise TxlogError(ErrorCode.INVALID_RECORD, f"Invalid sequence number {batch.base_sequence} in a batch of producer {pid}")
    if batch.is_transactional and transactional_id is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A transactional batch needs the produce request's transactional_id")
    return ProduceRequest(
        new_records(batch),
        producer_id=pid,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        transactional_id=transactional_id if batch.is_transactional else None,
        principal=principal,
        require_added=require_added and batch.is_transactional,
        batch_bytes=batch_bytes,
    )
