"""Share groups over HTTP (KIP-932's queues on the log, for users who run no Kafka client): acquire
a batch of records for a share group, acknowledge them, list and describe share groups, set their
configs. Routes parse and shape; ``app.services.share`` (with ``share_admin`` and ``share_configs``)
decides."""

from __future__ import annotations

import random
import uuid
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from api.auth import authorize, requires, visible
from api.v1 import codec
from api.v1 import share_schemas as s
from api.v1.responses import errors
from app.domain.acls import Api
from app.domain.share_configs import DEFAULTS
from app.domain.share_partition import AcknowledgementBatch, AcknowledgeType, record_count
from app.errors import ErrorCode, TxlogError
from app.services import Broker, share, share_admin, share_configs, topics

router = APIRouter(prefix="/v1", tags=["share groups"])

_ACK_TYPES = {
    "accept": AcknowledgeType.ACCEPT,
    "release": AcknowledgeType.RELEASE,
    "reject": AcknowledgeType.REJECT,
    "renew": AcknowledgeType.RENEW,
    "gap": AcknowledgeType.GAP,
}


def broker(request: Request) -> Broker:
    return request.app.state.broker


def _partitions(b: Broker, body: s.AcquireBody) -> list[tuple[str, int]]:
    """The partitions an acquisition reads, in order: those given, or the topic's from a random
    one on (consumers of one topic start on different partitions, and each reaches them all)."""
    if body.partitions is not None:
        return list(dict.fromkeys((p.topic, p.partition) for p in body.partitions))
    assert body.topic is not None
    # The topic's row alone (its partitions are numbered from 0): no partition's status is read.
    count = topics.partition_count(b, body.topic)
    first = random.randrange(count)
    return [(body.topic, n) for n in [*range(first, count), *range(first)]]


def _error(err: TxlogError | None) -> dict | None:
    return None if err is None else err.to_dict()


def _fetched(got: list[share.ShareFetchPartition], encoding: Any) -> tuple[list[dict], list[dict]]:
    records: list[dict] = []
    parts: list[dict] = []
    for p in got:
        for record, count in zip(codec.fetched_records(list(p.records), encoding), p.delivery_counts):
            records.append({"topic": p.topic, "partition": p.partition, **record, "delivery_count": count})
        parts.append(
            {
                "topic": p.topic,
                "partition": p.partition,
                "start_offset": p.start_offset,
                "error": _error(p.error),
                "acquired": [
                    {"first_offset": a.first_offset, "last_offset": a.last_offset, "delivery_count": a.delivery_count}
                    for a in p.acquired
                ],
            }
        )
    return records, parts


@router.post(
    "/share-groups/{group}/acquire",
    dependencies=[Depends(requires(Api.SHARE_FETCH, names_in_body=True))],
    response_model=s.AcquireResponse,
    responses=errors(400, 404, 409, 413),
)
async def acquire(group: str, body: s.AcquireBody, request: Request) -> Response:
    """Kafka's ShareFetch: acquire up to ``max_records`` records for the member, each locked to it
    for the group's share.record.lock.duration.ms (30 s by default) — no other member gets them
    until it acknowledges them or the lock expires. Each record says its delivery count (more than
    1: delivered before, released or its lock expired). ``wait_ms`` long-polls: an idle consumer
    waits for records (appended, released or expired) instead of asking again (shortened to
    TXLOG_MAX_FETCH_WAIT_MS, not waited while TXLOG_MAX_LONG_POLLS fetches wait in this process).
    Errors are per partition in ``partitions``; when every partition failed, the request fails
    with the first error (404 UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist)."""
    return await acquire_records(request, group, body, run_in_threadpool)


async def acquire_records(request: Request, group: str, body: s.AcquireBody, run: Any) -> Response:
    """The acquire route's answer, blocking work run by ``run`` (the route's thread pool, or the
    hot routes' executor: ``api.v1.hot``)."""
    b: Broker = request.app.state.broker
    named = [body.topic] if body.topic is not None else sorted({p.topic for p in body.partitions or ()})
    acks = _batches(body.acknowledgements) if body.acknowledgements else None
    authorize(request, Api.SHARE_FETCH, {"group": group, "topics": sorted({*named, *(t for t, _ in acks or ())})})
    member_id = body.member_id or str(uuid.uuid4())
    acknowledged = None
    if acks is not None and body.member_id is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "Acknowledgements need the member_id that acquired the records")

    def first() -> tuple[list[tuple[str, int]], list[share.ShareAcknowledged], list[share.ShareFetchPartition]]:
        # The partitions read and the first acquisition in one hand-off to a thread. The
        # acknowledgements are applied before acquiring, as a ShareFetch's are — they and the first
        # partition read in one database transaction; their errors are per partition in the
        # answer and do not fail the acquisition.
        wanted = _partitions(b, body)
        return (wanted, *share.fetch(b, group, member_id, wanted, acks, body.max_records, body.max_bytes))

    wanted, answers, got = await run(first)
    if body.wait_ms > 0 and not any(p.acquired for p in got):
        # Nothing to take now: the long poll (``acquire_waiting`` reads once more, then waits).
        got = await share.acquire_waiting(
            b, request.app.state.notifier, run, group, member_id, wanted, body.wait_ms, body.max_records, body.max_bytes
        )
    if acks is not None:
        acknowledged = _acknowledged(answers)
    failed = [p.error for p in got if p.error is not None]
    if failed and len(failed) == len(got):
        raise failed[0]
    # Built as bytes without a model per record, as the fetch route's answer (the shape declared is
    # ``AcquireResponse``).
    records, parts = _fetched(got, body.encoding)
    answer: dict[str, Any] = {"group_id": group, "member_id": member_id, "records": records, "partitions": parts}
    if acknowledged is not None:
        answer["acknowledgements"] = acknowledged
    return Response(orjson.dumps(answer), media_type="application/json")


def _batches(items: list[s.AcknowledgementIn]) -> dict[tuple[str, int], list[AcknowledgementBatch]]:
    """The acknowledgements as each partition's batches, in offset order (overlaps are the
    service's INVALID_REQUEST)."""
    out: dict[tuple[str, int], list[AcknowledgementBatch]] = {}
    for a in items:
        first = a.offset if a.offset is not None else a.first_offset
        last = a.offset if a.offset is not None else a.last_offset
        assert first is not None and last is not None
        out.setdefault((a.topic, a.partition), []).append(AcknowledgementBatch(first, last, (int(_ACK_TYPES[a.type]),)))
    return {k: sorted(v, key=lambda batch: batch.first_offset) for k, v in out.items()}


@router.post(
    "/share-groups/{group}/acknowledge",
    dependencies=[Depends(requires(Api.SHARE_ACKNOWLEDGE, names_in_body=True))],
    response_model=s.AcknowledgeResponse,
    responses=errors(400, 404, 409, 413),
)
def acknowledge(group: str, body: s.AcknowledgeBody, request: Request, b: Broker = Depends(broker)) -> dict:
    """Kafka's ShareAcknowledge: per record or range, accept (done), release (delivered again),
    reject (archived: never delivered again), renew (the lock runs again from now) or gap. Each
    partition's acknowledgements take effect whole or not at all: 409 INVALID_RECORD_STATE (in its
    ``error``) when one of its records is not held by this member — its lock expired and it went
    back, or another member holds it. When every partition failed the request fails with the first
    error."""
    acks = _batches(body.acknowledgements)
    authorize(request, Api.SHARE_ACKNOWLEDGE, {"group": group, "topics": sorted({t for t, _ in acks})})
    answers = share.acknowledge(b, group, body.member_id, acks)
    failed = [a.error for a in answers if a.error is not None]
    if failed and len(failed) == len(answers):
        raise failed[0]
    return {"group_id": group, "member_id": body.member_id, "partitions": _acknowledged(answers)}


def _acknowledged(answers: list[share.ShareAcknowledged]) -> list[dict]:
    """Each partition's acknowledgements: records per outcome, or the partition's error."""
    parts = []
    for a in answers:
        o = a.outcome
        parts.append(
            {
                "topic": a.topic,
                "partition": a.partition,
                "error": _error(a.error),
                "accepted": record_count(o.accepted) if o else 0,
                "released": record_count(o.released) if o else 0,
                "archived": record_count(o.archived) if o else 0,
                "renewed": record_count(o.renewed) if o else 0,
            }
        )
    return parts


@router.get(
    "/share-groups", dependencies=[Depends(requires(Api.LIST_GROUPS))], response_model=s.ShareGroupList, responses=errors()
)
def list_share_groups(request: Request, b: Broker = Depends(broker)) -> dict:
    """The share groups with state (a share partition read) or configs, those the principal may
    describe."""
    return {"groups": visible(request, Api.LIST_GROUPS, share_admin.list_share_groups(b), lambda g: g)}


@router.get(
    "/share-groups/{group}",
    dependencies=[Depends(requires(Api.DESCRIBE_SHARE_GROUP))],
    response_model=s.ShareGroupOut,
    responses=errors(404),
)
def describe_share_group(group: str, b: Broker = Depends(broker)) -> dict:
    """A share group's partitions: start offset (SPSO), end offset, the in-flight records by state,
    and each in-flight run with its lock holder, lock deadline and delivery count. 404
    GROUP_ID_NOT_FOUND for a group with neither state nor configs."""
    d = share_admin.describe(b, group)
    if not d.partitions and not d.configs:
        raise TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Share group {group} does not exist")
    return {
        "group_id": group,
        "configs": {**DEFAULTS, **d.configs},
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "state_epoch": p.state_epoch,
                "records": {k.capitalize(): v for k, v in p.counts.items()},
                "in_flight": [
                    {
                        "first_offset": r.first_offset,
                        "last_offset": r.last_offset,
                        "state": r.state.name.capitalize(),
                        "member_id": r.member_id,
                        "lock_deadline_ms": r.lock_deadline_ms,
                        "delivery_count": r.delivery_count,
                    }
                    for r in p.in_flight
                ],
            }
            for p in d.partitions
        ],
    }


@router.patch(
    "/share-groups/{group}/configs",
    dependencies=[Depends(requires(Api.ALTER_GROUP_CONFIGS))],
    response_model=s.ShareGroupConfigsOut,
    responses=errors(400, 413),
)
def alter_share_group_configs(group: str, body: s.ShareGroupConfigsBody, b: Broker = Depends(broker)) -> dict:
    """Kafka's IncrementalAlterConfigs of a GROUP resource: share.auto.offset.reset,
    share.isolation.level, share.record.lock.duration.ms, share.delivery.count.limit,
    share.session.timeout.ms, share.heartbeat.interval.ms; null sets a key back to its default. 400 INVALID_CONFIG for an
    unknown key or a value out of Kafka's bounds. Answers every key's value."""
    share_configs.alter_group_configs(b, group, body.configs)
    return {"group_id": group, "configs": {**DEFAULTS, **share_configs.group_configs_set(b, group)}}
