"""The v1 HTTP API. Routes parse and shape; the services decide."""

from __future__ import annotations

import functools
import time
from typing import Any, Awaitable, Callable, Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from api.auth import authorize, principal_of, requires, visible
from api.metrics import DUPLICATES, RECORDS_APPENDED, TXN_ENDED
from api.v1 import codec, quotas
from api.v1 import schemas as s
from api.v1.responses import errors
from app.domain.acls import Api, init_producer_api, produce_api
from app.domain.groups.offsets import GroupOffset
from app.domain.partitioner import coordinator_partition
from app.domain.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from app.domain.records import Encoding, IsolationLevel, valid_text
from app.domain.transactions import TxnEvent, TxnMetadata
from app.services import Broker, committed_produce, groups, retention, topics, transaction_aborts, transactions
from app.services import fetch as fetch_service
from app.services import produce as produce_service
from app.services.notify import wait_for_records

router = APIRouter(prefix="/v1")

# Produce and fetch answers may be throttled by a client quota (``api.v1.quotas``).
THROTTLED: dict[int | str, dict[str, Any]] = {200: {"headers": quotas.THROTTLE_HEADER_DOC}}


def broker(request: Request) -> Broker:
    return request.app.state.broker


# --- topics ---------------------------------------------------------------------------------------


@router.post(
    "/topics",
    status_code=201,
    dependencies=[Depends(requires(Api.CREATE_TOPICS, names_in_body=True))],
    response_model=s.TopicInfo,
    responses=errors(400, 409, 413),
    tags=["topics"],
)
def create_topic(body: s.TopicCreate, request: Request, b: Broker = Depends(broker)) -> s.TopicInfo:
    authorize(request, Api.CREATE_TOPICS, {"topic": body.name})
    name, n = topics.create_topic(b, body.name, body.partitions, body.config)
    return s.TopicInfo(name=name, partitions=n)


@router.get(
    "/topics", dependencies=[Depends(requires(Api.LIST_TOPICS))], response_model=s.TopicList, responses=errors(), tags=["topics"]
)
def list_topics(request: Request, b: Broker = Depends(broker)) -> dict:
    found = visible(request, Api.LIST_TOPICS, topics.list_topics(b), lambda t: t[0])
    return {"topics": [{"name": n, "partitions": p} for n, p in found]}


@router.get(
    "/topics/{topic}",
    dependencies=[Depends(requires(Api.DESCRIBE_TOPIC))],
    response_model=s.TopicDescription,
    responses=errors(400, 404),
    tags=["topics"],
)
def describe_topic(topic: str, b: Broker = Depends(broker)) -> s.TopicDescription:
    parts = topics.describe_topic(b, topic)
    return s.TopicDescription(
        name=topic,
        config=topics.topic_config(b, topic),
        partitions=[
            s.PartitionInfo(
                partition=p.partition,
                log_start_offset=p.log_start_offset,
                high_watermark=p.high_watermark,
                last_stable_offset=p.last_stable_offset,
            )
            for p in parts
        ],
    )


@router.patch(
    "/topics/{topic}",
    dependencies=[Depends(requires(Api.ALTER_TOPIC_CONFIGS))],
    response_model=s.TopicConfigInfo,
    responses=errors(400, 404, 409, 413),
    tags=["topics"],
)
def alter_topic(topic: str, body: s.TopicAlter, b: Broker = Depends(broker)) -> s.TopicConfigInfo:
    """Change a topic's config (Kafka's IncrementalAlterConfigs): each key given is set, each key
    given as null removed. ``retention.ms`` and ``retention.bytes`` (-1: no limit) take effect at
    the sweeper's next round."""
    return s.TopicConfigInfo(name=topic, config=topics.alter_topic_config(b, topic, body.config))


@router.delete(
    "/topics/{topic}",
    dependencies=[Depends(requires(Api.DELETE_TOPICS))],
    response_model=s.TopicDeleted,
    responses=errors(400, 404, 409),
    tags=["topics"],
)
def delete_topic(topic: str, b: Broker = Depends(broker)) -> s.TopicDeleted:
    """Delete a topic (Kafka's DeleteTopics): it is gone at once for every way in, with its
    committed offsets and producer states; each open transaction that wrote to it is aborted on all
    its partitions, its producer fenced. Its records are deleted within 30 s, or by the sweeper
    after; until they are, creating the name again is 409 TOPIC_ALREADY_EXISTS. 409
    CONCURRENT_TRANSACTIONS (retriable): transactions kept joining the topic while it was deleted."""
    deleted = topics.delete_topic(b, topic)
    return s.TopicDeleted(
        name=deleted.name,
        topic_id=str(deleted.topic_id),
        aborted_transactions=list(deleted.aborted_transactions),
        records_pending=deleted.records_pending,
    )


@router.post(
    "/topics/{topic}/partitions",
    dependencies=[Depends(requires(Api.CREATE_PARTITIONS))],
    response_model=s.TopicPartitionCount,
    responses=errors(400, 404, 413),
    tags=["topics"],
)
def create_partitions(topic: str, body: s.PartitionsCreate, b: Broker = Depends(broker)) -> s.TopicPartitionCount:
    """Grow a topic to ``count`` partitions (Kafka's CreatePartitions; ``validate_only`` checks
    only): never shrunk, 400 INVALID_PARTITIONS for a count at or below the current one. The new
    partitions start empty; producers choosing a partition by key hash see a different mapping."""
    topics.create_partitions(b, topic, body.count, body.validate_only)
    return s.TopicPartitionCount(name=topic, partitions=body.count)


@router.post(
    "/topics/{topic}/partitions/{partition}/delete-records",
    dependencies=[Depends(requires(Api.DELETE_RECORDS))],
    response_model=s.DeleteRecordsResponse,
    responses=errors(400, 404, 409, 413, 416),
    tags=["topics"],
)
def delete_records(topic: str, partition: int, body: s.DeleteRecordsBody, b: Broker = Depends(broker)) -> s.DeleteRecordsResponse:
    """Kafka's DeleteRecords: the partition's log start moves to ``before_offset`` (-1: the last
    stable offset), never past the last stable offset. Readers below it get OFFSET_OUT_OF_RANGE;
    the space is freed by the sweeper."""
    r = retention.delete_records(b, topic, partition, body.before_offset)
    return s.DeleteRecordsResponse(topic=r.topic, partition=r.partition, log_start_offset=r.log_start_offset)


# --- produce --------------------------------------------------------------------------------------


def produced(topic: str, result: produce_service.ProduceResult, ended: transactions.EndTxnOutcome | None = None) -> Response:
    """A produce's answer; ``ended``: the transaction it committed."""
    if result.duplicate:
        DUPLICATES.labels(topic).inc()
    else:
        RECORDS_APPENDED.labels(topic).inc(result.last_offset - result.base_offset + 1)
    out: dict[str, object] = {
        "base_offset": result.base_offset,
        "last_offset": result.last_offset,
        "log_append_time_ms": result.log_append_time_ms,
        "log_start_offset": result.log_start_offset,
        "duplicate": result.duplicate,
    }
    if result.partition is not None:
        out["partition"] = result.partition
    if ended is not None:
        TXN_ENDED.labels("commit").inc()
        out["transaction"] = _end_answer(ended)
    return Response(orjson.dumps(out), media_type="application/json")


# Bodies of routes that decode them themselves (``codec``): declared in the OpenAPI document by
# reference, their schemas added to its components (``add_body_schemas``).
BODY_MODELS: list[type[s.Model]] = []


def _json_body(model: type[s.Model]) -> dict:
    """The request body's declaration for a route that decodes its body itself."""
    BODY_MODELS.append(model)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


@router.post(
    "/topics/{topic}/partitions/{partition}/records",
    dependencies=[Depends(requires(Api.PRODUCE, names_in_body=True))],
    response_model=s.ProduceResponse,
    response_model_exclude_none=True,
    responses={**errors(400, 404, 409, 413, 429), **THROTTLED},
    openapi_extra=_json_body(s.ProduceBody),
    tags=["produce"],
)
async def produce(topic: str, partition: int, request: Request) -> Response:
    return await produce_batch(request, topic, partition, await request.body())


async def produce_batch(request: Request, topic: str, partition: int, raw: bytes) -> Response:
    """The answer to a produce to a partition with body ``raw`` (also served by ``api.v1.hot``)."""
    started = time.perf_counter()
    req, commit = produce_request(request, topic, raw)
    broker, run = request.app.state.broker, request.app.state.loop_executor.run
    if commit:
        done = await run(functools.partial(committed_produce.produce_committed_steps, broker, topic, partition, req))
        answer = produced(topic, done.produced, done.ended)
    else:
        answer = produced(topic, await run(functools.partial(produce_service.produce_steps, broker, topic, partition, req)))
    return quotas.spend(request, answer, PRODUCER_BYTE_RATE, len(raw), time.perf_counter() - started)


def produce_request(request: Request, topic: str, raw: bytes) -> tuple[produce_service.ProduceRequest, bool]:
    """The batch a produce to a partition asks for, once its body is read and the principal may
    send it, and whether it commits its transaction."""
    fields, records = codec.produce_body(raw, s.ProduceBody)
    commit = fields.pop("commit")
    tid = fields["transactional_id"]
    authorize(request, produce_api(fields["producer_id"], tid), {"topic": topic, "transactional_id": tid})
    return produce_service.ProduceRequest(records=records, principal=principal_of(request), **fields), commit


@router.post(
    "/topics/{topic}/records",
    dependencies=[Depends(requires(Api.PRODUCE))],
    response_model=s.ProduceResponse,
    responses={**errors(400, 404, 409, 413), **THROTTLED},
    openapi_extra=_json_body(s.PlainProduceBody),
    tags=["produce"],
)
async def produce_to_topic(topic: str, request: Request) -> Response:
    return await run_in_threadpool(produce_plain, request, topic, await request.body())


def produce_plain(request: Request, topic: str, raw: bytes) -> Response:
    """The answer to a plain produce to a topic with body ``raw``, in a worker thread (also served
    by ``api.v1.hot``)."""
    started = time.perf_counter()
    _, records = codec.produce_body(raw, s.PlainProduceBody)
    answer = produced(topic, produce_service.produce_to_topic(request.app.state.broker, topic, records))
    return quotas.spend(request, answer, PRODUCER_BYTE_RATE, len(raw), time.perf_counter() - started)


def add_body_schemas(openapi: dict) -> dict:
    """The OpenAPI document with the schemas of ``BODY_MODELS`` (and the models they use)."""
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in BODY_MODELS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components.setdefault(model.__name__, schema)
    return openapi


# --- fetch ----------------------------------------------------------------------------------------


@router.get(
    "/topics/{topic}/partitions/{partition}/records",
    dependencies=[Depends(requires(Api.FETCH))],
    response_model=s.FetchResponse,
    responses={**errors(400, 404, 416), **THROTTLED},
    tags=["fetch"],
)
async def fetch(
    request: Request,
    topic: str,
    partition: int,
    offset: int = Query(0, ge=0, le=s.INT64),
    max_records: int = Query(500, ge=1, le=100_000),
    max_bytes: int = Query(1_048_576, ge=1, le=2**31 - 1),
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted",
    encoding: Literal["utf8", "base64"] = "utf8",
    wait_ms: int = Query(0, ge=0, le=60_000),
) -> Response:
    """Kafka's Fetch. ``wait_ms`` long-polls: shortened to ``TXLOG_MAX_FETCH_WAIT_MS``, and not
    waited at all while ``TXLOG_MAX_LONG_POLLS`` fetches already wait in this process."""
    return await fetch_page(
        request, topic, partition, offset, max_records, max_bytes, isolation_level, encoding, wait_ms, run_in_threadpool
    )


async def fetch_page(
    request: Request,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    max_bytes: int,
    isolation_level: IsolationLevel,
    encoding: Encoding,
    wait_ms: int,
    run: Callable[..., Awaitable],
) -> Response:
    """Fetch's answer; ``run(fn)`` runs ``fn`` in a worker thread (also served by ``api.v1.hot``)."""
    b: Broker = request.app.state.broker
    reading = [0.0]  # seconds spent reading, not waiting for records: the request's handler time

    def once() -> tuple[fetch_service.FetchResult, bytes]:
        # The answer is built here, off the event loop, as bytes, without checking each record
        # against FetchResponse (the declared shape): a model per record costs more than the read.
        began = time.perf_counter()
        result = fetch_service.fetch(b, topic, partition, offset, max_records, max_bytes, isolation_level)
        page = result, codec.fetch_page(result, encoding)
        reading[0] += time.perf_counter() - began
        return page

    _, body = await wait_for_records(
        request.app.state.notifier,
        [(topic, partition)],
        wait_ms,
        b.settings.max_fetch_wait_ms,
        b.settings.max_long_polls,
        lambda: run(once),
        lambda page: bool(page[0].records) or page[0].next_offset != offset,
    )
    return quotas.spend(request, Response(body, media_type="application/json"), CONSUMER_BYTE_RATE, len(body), reading[0])


# --- consumer group offsets -----------------------------------------------------------------------


def _offsets(items: list[s.OffsetIn]) -> list[GroupOffset]:
    return [GroupOffset(o.topic, o.partition, o.offset, valid_text(o.metadata or "", "metadata")) for o in items]


def _offsets_out(offsets: list[GroupOffset]) -> list[dict]:
    return [{"topic": o.topic, "partition": o.partition, "offset": o.offset, "metadata": o.metadata} for o in offsets]


@router.post(
    "/groups/{group}/offsets",
    dependencies=[Depends(requires(Api.OFFSET_COMMIT, names_in_body=True))],
    response_model=s.GroupOffsets,
    responses=errors(400, 404, 409, 413),
    tags=["groups"],
)
def offset_commit(group: str, body: s.GroupOffsetsBody, request: Request, b: Broker = Depends(broker)) -> dict:
    """Kafka's OffsetCommit. A partition given more than once keeps its last offset; the answer
    shows the offsets as stored."""
    authorize(request, Api.OFFSET_COMMIT, {"group": group, "topics": sorted({o.topic for o in body.offsets})})
    return {"offsets": _offsets_out(groups.offset_commit(b, group, _offsets(body.offsets)))}


@router.get(
    "/groups/{group}/offsets",
    dependencies=[Depends(requires(Api.OFFSET_FETCH))],
    response_model=s.GroupOffsets,
    responses=errors(400, 409),
    tags=["groups"],
)
def offset_fetch(request: Request, group: str, require_stable: bool = False, b: Broker = Depends(broker)) -> dict:
    found = visible(request, Api.OFFSET_FETCH, groups.offset_fetch(b, group, require_stable), lambda o: o.topic)
    return {"offsets": _offsets_out(found)}


# --- producers and transactions -------------------------------------------------------------------


@router.post(
    "/producers",
    dependencies=[Depends(requires(Api.INIT_PRODUCER_ID, names_in_body=True))],
    response_model=s.ProducerIdAndEpoch,
    responses=errors(400, 409, 413),
    tags=["transactions"],
)
def init_producer_id(body: s.InitProducerBody, request: Request, b: Broker = Depends(broker)) -> s.ProducerIdAndEpoch:
    authorize(request, init_producer_api(body.transactional_id), {"transactional_id": body.transactional_id})
    r = transactions.init_producer_id(b, body.transactional_id, body.transaction_timeout_ms)
    return s.ProducerIdAndEpoch(producer_id=r.producer_id, producer_epoch=r.producer_epoch)


def txn_json(meta: TxnMetadata, b: Broker) -> dict:
    return {
        "transactional_id": meta.transactional_id,
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "state": meta.state.value,
        "timeout_ms": meta.timeout_ms,
        "started_at_ms": meta.started_at_ms,
        "updated_at_ms": meta.updated_at_ms,
        "partitions": [{"topic": t, "partition": p} for t, p in meta.partitions],
        "groups": list(meta.groups),
        "coordinator": coordinator_partition(meta.transactional_id, b.settings.transaction_state_partitions),
        "last_producer_id": meta.last_producer_id,
        "last_producer_epoch": meta.last_producer_epoch,
        "last_result": meta.last_result,
        "fence_reason": meta.fence_reason,
    }


def event_json(e: TxnEvent) -> dict:
    return {
        "version": e.version,
        "from_state": e.from_state.value if e.from_state else None,
        "to_state": e.to_state.value,
        "producer_id": e.producer_id,
        "producer_epoch": e.producer_epoch,
        "timeout_ms": e.timeout_ms,
        "at_ms": e.at_ms,
        "partitions_added": [{"topic": t, "partition": p} for t, p in e.partitions_added],
        "groups_added": list(e.groups_added),
        "result": e.result,
        "reason": e.reason,
    }


@router.post(
    "/transactions/{tid}/partitions",
    dependencies=[Depends(requires(Api.ADD_PARTITIONS_TO_TXN, names_in_body=True))],
    response_model=s.TxnDescription,
    responses=errors(400, 404, 409, 413, 429),
    tags=["transactions"],
)
def add_partitions_to_txn(tid: str, body: s.AddPartitionsBody, request: Request, b: Broker = Depends(broker)) -> dict:
    authorize(request, Api.ADD_PARTITIONS_TO_TXN, {"transactional_id": tid, "topics": sorted({p.topic for p in body.partitions})})
    meta = transactions.add_partitions_to_txn(
        b,
        tid,
        body.producer_id,
        body.producer_epoch,
        [(p.topic, p.partition) for p in body.partitions],
        principal=principal_of(request),
    )
    return txn_json(meta, b)


@router.post(
    "/transactions/{tid}/offsets",
    dependencies=[Depends(requires(Api.TXN_OFFSET_COMMIT, names_in_body=True))],
    response_model=s.TxnDescription,
    responses=errors(400, 404, 409, 413, 429),
    tags=["transactions"],
)
def txn_offset_commit(tid: str, body: s.TxnOffsetsBody, request: Request, b: Broker = Depends(broker)) -> dict:
    authorize(
        request,
        Api.TXN_OFFSET_COMMIT,
        {"transactional_id": tid, "group": body.group_id, "topics": sorted({o.topic for o in body.offsets})},
    )
    meta = transactions.txn_offset_commit(
        b, tid, body.producer_id, body.producer_epoch, body.group_id, _offsets(body.offsets), principal=principal_of(request)
    )
    return txn_json(meta, b)


@router.post(
    "/transactions/{tid}/end",
    dependencies=[Depends(requires(Api.END_TXN))],
    response_model=s.EndTxnResponse,
    responses=errors(400, 409, 413),
    tags=["transactions"],
)
async def end_txn(tid: str, body: s.EndTxnBody, request: Request) -> Response:
    return await end_transaction(request, tid, body)


async def end_transaction(request: Request, tid: str, body: s.EndTxnBody) -> Response:
    """EndTxn's answer (also served by ``api.v1.hot``)."""
    steps = functools.partial(
        transactions.end_txn_steps, request.app.state.broker, tid, body.producer_id, body.producer_epoch, body.result, 2
    )
    return ended(body.result, await request.app.state.loop_executor.run(steps))


def ended(result: str, outcome: transactions.EndTxnOutcome) -> Response:
    """The answer to an EndTxn that ended its transaction so."""
    TXN_ENDED.labels(result).inc()
    return Response(orjson.dumps(_end_answer(outcome)), media_type="application/json")


def _end_answer(outcome: transactions.EndTxnOutcome) -> dict[str, object]:
    """``EndTxnResponse``."""
    return {"state": outcome.state.value, "producer_id": outcome.producer_id, "producer_epoch": outcome.producer_epoch}


@router.post(
    "/transactions/{tid}/abort",
    dependencies=[Depends(requires(Api.ABORT_TRANSACTION))],
    response_model=s.TxnDescription,
    responses=errors(400, 404, 409, 413),
    tags=["transactions"],
)
def abort_transaction(tid: str, b: Broker = Depends(broker)) -> dict:
    return txn_json(transaction_aborts.abort_by_operator(b, tid), b)


@router.get(
    "/transactions",
    dependencies=[Depends(requires(Api.LIST_TRANSACTIONS))],
    response_model=s.TxnList,
    responses=errors(400),
    tags=["transactions"],
)
def list_transactions(
    request: Request,
    state: str | None = None,
    older_than_ms: int | None = Query(None, ge=0, le=s.INT64),
    b: Broker = Depends(broker),
) -> dict:
    found = visible(
        request, Api.LIST_TRANSACTIONS, transactions.list_transactions(b, state, older_than_ms), lambda m: m.transactional_id
    )
    return {"transactions": [txn_json(m, b) for m in found]}


@router.get(
    "/transactions/{tid}",
    dependencies=[Depends(requires(Api.DESCRIBE_TRANSACTIONS))],
    response_model=s.TxnDescription,
    responses=errors(400, 404),
    tags=["transactions"],
)
def describe_transaction(tid: str, request: Request, b: Broker = Depends(broker)) -> dict:
    """The transaction's partitions of topics the principal may not Describe are left out, as Kafka's
    DescribeTransactions leaves them out."""
    described = txn_json(transactions.describe(b, tid), b)
    described["partitions"] = visible(request, Api.DESCRIBE_TRANSACTIONS, described["partitions"], lambda p: p["topic"])
    return described


@router.get(
    "/transactions/{tid}/events",
    dependencies=[Depends(requires(Api.DESCRIBE_TRANSACTIONS))],
    response_model=s.TxnEvents,
    responses=errors(400, 404),
    tags=["transactions"],
)
def transaction_events(
    tid: str,
    limit: int = Query(transactions.MAX_EVENTS_PAGE, ge=1, le=transactions.MAX_EVENTS_PAGE),
    before_version: int | None = Query(None, ge=1, le=s.INT32),
    b: Broker = Depends(broker),
) -> dict:
    """The transactional id's history, oldest first, a page at a time: the ``limit`` most recent
    events before ``before_version``. ``next_before_version`` asks for the page before this one
    (null when this page reaches the first event)."""
    evs = transactions.events(b, tid, limit, before_version)
    older = evs[0].version if evs and evs[0].version > 1 else None
    return {"transactional_id": tid, "events": [event_json(e) for e in evs], "next_before_version": older}
