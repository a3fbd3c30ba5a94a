"""Share groups' membership on the wire (KIP-932): ShareGroupHeartbeat v1 and ShareGroupDescribe v1,
to ``app.services.share_groups``. Every rule is theirs; here are the wire's shapes and the ACLs.

ACLs, as Kafka: ShareGroupHeartbeat Read on the group and Describe on each subscribed topic
(TOPIC_AUTHORIZATION_FAILED); ShareGroupDescribe Describe on each group, answered per group.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from api.kafka.handlers import RequestContext, access
from api.kafka.handlers.share import _code
from app.domain import share_groups as sg
from app.domain.acl_bindings import Operation, ResourceType
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import share_groups
from app.wire.kafka.error_responses import error_body

# --- ShareGroupHeartbeat ------------------------------------------------------------------------


async def handle_share_group_heartbeat(ctx: RequestContext, request: Any) -> dict:
    access.check(ctx, Api.SHARE_GROUP_HEARTBEAT, group=request.group_id)
    if _classic_group_here(ctx, request.group_id):
        raise TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {request.group_id} is not a share group.")
    subscribed = None if request.subscribed_topic_names is None else list(request.subscribed_topic_names)
    if access.refused(ctx, Api.SHARE_GROUP_HEARTBEAT, "topics", subscribed or []):
        # As Kafka's broker answers it: the code alone, naming no topic (a client may not learn
        # which topics exist that it may not describe).
        return error_body(ctx.api_key, ctx.api_version, ErrorCode.TOPIC_AUTHORIZATION_FAILED.kafka_code)
    answer = await ctx.call(
        share_groups.heartbeat,
        ctx.broker,
        sg.HeartbeatRequest(
            request.group_id,
            request.member_id,
            request.member_epoch,
            request.rack_id,
            subscribed,
            ctx.client_id or "",
            ctx.client_host,
        ),
    )
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, **answer.body()}


def _classic_group_here(ctx: RequestContext, group_id: str) -> bool:
    """Whether this gateway coordinates a classic group of that id (with members or a state other
    than Empty or Dead): a group id is of one type, as Kafka keeps it."""
    if ctx.groups is None:
        return False
    [described] = ctx.groups.describe_groups([group_id])
    return described.error is None and described.state not in ("Empty", "Dead", "")


# --- ShareGroupDescribe -------------------------------------------------------------------------


async def handle_share_group_describe(ctx: RequestContext, request: Any) -> dict:
    return await describe_groups(
        ctx,
        request,
        Api.DESCRIBE_SHARE_GROUP,
        share_groups.describe,
        sg.described_topics,
        sg.describe,
        lambda group_id: TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."),
    )


async def describe_groups(
    ctx: RequestContext,
    request: Any,
    api: Api,
    describe: Callable[..., Sequence[Any]],
    described_topics: Callable[[Any], Iterable[str]],
    entry: Callable[[Any], dict],
    missing: Callable[[str], TxlogError],
    refusal: Callable[[str], TxlogError | None] = lambda group_id: None,
) -> dict:
    """ShareGroupDescribe's and ConsumerGroupDescribe's answer: each group as ``entry`` describes
    it (``describe`` finds them), or its error: the ACLs' refusal, ``refusal``'s, ``missing``'s for
    a group that is not one, or TOPIC_AUTHORIZATION_FAILED when the principal may not Describe a
    topic the description names (``described_topics``, Kafka 4.1+)."""
    group_ids = list(request.group_ids)
    refused = access.refused(ctx, api, "group", group_ids)
    allowed = [g for g in group_ids if g not in refused]
    found = {d.group_id: d.group for d in await ctx.call(describe, ctx.broker, allowed)} if allowed else {}
    groups = []
    for group_id in group_ids:
        group = found.get(group_id)
        error = refused[group_id] if group_id in refused else refusal(group_id)
        if error is None and group is None:
            error = missing(group_id)
        if error is None and not all(
            access.allows(ctx, Operation.DESCRIBE, ResourceType.TOPIC, t) for t in described_topics(group)
        ):
            error = TxlogError(
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "The group has described topic(s) that the client is not authorized to describe.",
            )
        if error is not None:
            groups.append({"group_id": group_id, "error_code": _code(error), "error_message": error.message})
            continue
        described = entry(group)
        if request.include_authorized_operations:
            described["authorized_operations"] = access.operations(ctx, ResourceType.GROUP, group_id)
        groups.append({"error_code": 0, "error_message": None, **described})
    return {"throttle_time_ms": 0, "groups": groups}
