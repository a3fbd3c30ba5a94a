"""The half-message API (RocketMQ's transactional messages): producer groups with their check-back
endpoint, half messages, their commit and rollback. Routes parse and shape; the service decides."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from api.auth import active, authorize, requires, visible
from api.v1 import half_message_schemas as s
from api.v1.responses import errors
from app.domain.acls import Api
from app.domain.half_messages import HalfMessage, ProducerGroup
from app.domain.records import (
    NewRecord,
    decode_bytes,
    encode_bytes,
    headers_from_object,
    headers_object,
    valid_text,
    validate_headers,
)
from app.services import Broker, half_messages

router = APIRouter(prefix="/v1", tags=["half messages"])


def broker(request: Request) -> Broker:
    return request.app.state.broker


def group_json(g: ProducerGroup) -> dict:
    return {
        "producer_group": g.producer_group,
        "check_url": g.check_url,
        "check_interval_ms": g.check_interval_ms,
        "check_immunity_ms": g.check_immunity_ms,
        "max_checks": g.max_checks,
        "registered": g.updated_at_ms is not None,
        "updated_at_ms": g.updated_at_ms,
    }


def half_json(m: HalfMessage) -> dict:
    return {
        "transaction_id": m.transaction_id,
        "producer_group": m.producer_group,
        "topic": m.topic,
        "partition": m.partition,
        "state": m.state.value,
        "check_count": m.check_count,
        "created_at_ms": m.created_at_ms,
        "next_check_at_ms": m.next_check_at_ms,
        "decided_at_ms": m.decided_at_ms,
        "decided_by": m.decided_by.value if m.decided_by else None,
        "reason": m.reason,
        "offset": m.offset,
    }


@router.put(
    "/producer-groups/{group}",
    dependencies=[Depends(requires(Api.REGISTER_PRODUCER_GROUP))],
    response_model=s.ProducerGroupOut,
    responses=errors(400, 413),
)
def register_producer_group(group: str, body: s.ProducerGroupBody, b: Broker = Depends(broker)) -> dict:
    """Register a producer group's check-back endpoint and RocketMQ's knobs (defaults: check every
    60000 ms, leave a fresh half message alone for 6000 ms, roll back after 15 checks without a
    decision). The URL's host must be in TXLOG_HALF_CHECK_ALLOWED_HOSTS (loopback by default), else
    INVALID_CONFIG."""
    g = half_messages.register_producer_group(
        b, group, body.check_url, body.check_interval_ms, body.check_immunity_ms, body.max_checks
    )
    return group_json(g)


@router.get(
    "/producer-groups/{group}",
    dependencies=[Depends(requires(Api.DESCRIBE_PRODUCER_GROUP))],
    response_model=s.ProducerGroupOut,
    responses=errors(400),
)
def describe_producer_group(group: str, b: Broker = Depends(broker)) -> dict:
    """A producer group's settings (a group never registered: the defaults, no endpoint)."""
    return group_json(half_messages.producer_group(b, group))


def _record(body: s.HalfMessageBody) -> NewRecord:
    enc = body.encoding
    key = decode_bytes(body.key, enc, "key")
    value = decode_bytes(body.value, enc, "value")
    if body.headers is None:
        headers: tuple = ()
    elif isinstance(body.headers, dict):
        headers = headers_from_object(
            {k: None if v is None else valid_text(v, "a header value") for k, v in body.headers.items()}
        )
    else:
        headers = tuple((h.key, decode_bytes(h.value, enc, f"headers[{i}].value")) for i, h in enumerate(body.headers))
    validate_headers(headers, "headers")
    return NewRecord(key, value, headers)


@router.post(
    "/half-messages",
    dependencies=[Depends(requires(Api.SEND_HALF_MESSAGE, names_in_body=True))],
    response_model=s.HalfMessageOut,
    responses=errors(400, 404, 409, 413),
)
def send_half_message(body: s.HalfMessageBody, request: Request, b: Broker = Depends(broker)) -> dict:
    """Store a half message: invisible to every reader, outside its partition (it holds back no last
    stable offset), until its producer commits or rolls it back — or the producer group's
    check-back decides. Answers its transaction id."""
    authorize(request, Api.SEND_HALF_MESSAGE, {"topic": body.topic})
    msg = half_messages.send_half_message(
        b, body.producer_group, body.topic, body.partition, _record(body), body.encoding, body.transaction_id
    )
    return half_json(msg)


def _authorize_end(request: Request, b: Broker, transaction_id: str) -> None:
    """Commit and rollback need Write on the half message's topic (read only with auth on)."""
    if active(request):
        authorize(request, Api.END_HALF_MESSAGE, {"topic": half_messages.describe(b, transaction_id).stored.msg.topic})


@router.post(
    "/half-messages/{transaction_id}/commit",
    dependencies=[Depends(requires(Api.END_HALF_MESSAGE, names_in_body=True))],
    response_model=s.HalfMessageOut,
    responses=errors(400, 404, 409, 413),
)
def commit_half_message(transaction_id: str, request: Request, b: Broker = Depends(broker)) -> dict:
    """Append the half message to its topic and partition, exactly once. Safe to lose, repeat or
    race: a repeated commit answers the committed half message (with its offset); after a rollback
    it is INVALID_TXN_STATE."""
    _authorize_end(request, b, transaction_id)
    return half_json(half_messages.commit(b, transaction_id))


@router.post(
    "/half-messages/{transaction_id}/rollback",
    dependencies=[Depends(requires(Api.END_HALF_MESSAGE, names_in_body=True))],
    response_model=s.HalfMessageOut,
    responses=errors(400, 404, 409, 413),
)
def rollback_half_message(transaction_id: str, request: Request, b: Broker = Depends(broker)) -> dict:
    """Drop the half message. A repeated rollback answers the rolled-back half message; after a
    commit it is INVALID_TXN_STATE."""
    _authorize_end(request, b, transaction_id)
    return half_json(half_messages.rollback(b, transaction_id))


@router.get(
    "/half-messages/{transaction_id}",
    dependencies=[Depends(requires(Api.DESCRIBE_HALF_MESSAGES, names_in_body=True))],
    response_model=s.HalfMessageDetail,
    responses=errors(400, 404),
)
def describe_half_message(transaction_id: str, request: Request, b: Broker = Depends(broker)) -> dict:
    """A half message, its message and its check-back history."""
    d = half_messages.describe(b, transaction_id)
    authorize(request, Api.DESCRIBE_HALF_MESSAGES, {"topic": d.stored.msg.topic})
    r, enc = d.stored.record, d.stored.encoding
    return {
        **half_json(d.stored.msg),
        "encoding": enc,
        "key": encode_bytes(r.key, enc),
        "value": encode_bytes(r.value, enc),
        "headers": headers_object(r.headers),
        "header_list": [{"key": k, "value": encode_bytes(v, enc)} for k, v in r.headers],
        "checks": [vars(c) for c in d.checks],
    }


@router.get(
    "/half-messages",
    dependencies=[Depends(requires(Api.LIST_HALF_MESSAGES))],
    response_model=s.HalfMessageList,
    responses=errors(400),
)
def list_half_messages(
    request: Request,
    state: str | None = None,
    producer_group: str | None = Query(None, max_length=249),
    after: str | None = Query(None, max_length=128),
    limit: int = Query(100, ge=1, le=1000),
    b: Broker = Depends(broker),
) -> dict:
    """Half messages by transaction id, optionally of one state (Prepared, Committed, RolledBack)
    and producer group; ``next_after`` asks for the next page."""
    page = half_messages.list_half_messages(b, state, producer_group, after, limit)
    return {
        "half_messages": [half_json(x.msg) for x in visible(request, Api.LIST_HALF_MESSAGES, page, lambda x: x.msg.topic)],
        "next_after": page[-1].msg.transaction_id if len(page) == limit else None,
    }
