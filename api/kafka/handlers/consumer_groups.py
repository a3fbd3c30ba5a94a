"""Consumer groups of the next-generation protocol on the wire (KIP-848): ConsumerGroupHeartbeat
v0–1 and ConsumerGroupDescribe v0–1, to ``app.services.consumer_groups``. Every rule is theirs;
here are the wire's shapes, the ACLs, and the one check that needs this gateway's memory: a group
id that has a classic group here (with members) is not a consumer group (GROUP_ID_NOT_FOUND), as
a group is of one type at a time.

Heartbeats go to the gateway FindCoordinator names (NOT_COORDINATOR elsewhere, as Kafka answers),
but the group's state is in PostgreSQL: when that gateway goes, the next one carries on with the
members' epochs and assignments.

ACLs, as Kafka: ConsumerGroupHeartbeat Read on the group and Describe on each subscribed topic name
(TOPIC_AUTHORIZATION_FAILED); ConsumerGroupDescribe Describe on each group, answered per group.
"""

from __future__ import annotations

from typing import Any

from api.kafka.handlers import RequestContext, access
from api.kafka.handlers.share_groups import _classic_group_here, describe_groups
from app.domain.acls import Api
from app.domain.groups import consumer_group as cg
from app.domain.groups import consumer_group_describe
from app.errors import ErrorCode, TxlogError
from app.services import consumer_groups
from app.wire.kafka.error_responses import error_body


async def handle_consumer_group_heartbeat(ctx: RequestContext, request: Any) -> dict:
    access.check(ctx, Api.CONSUMER_GROUP_HEARTBEAT, group=request.group_id)
    not_here = ctx.groups.check_offset_fetch(request.group_id) if ctx.groups is not None else None
    if not_here is not None:
        raise TxlogError(not_here)
    if _classic_group_here(ctx, request.group_id):
        raise TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {request.group_id} is not a consumer group.")
    subscribed = None if request.subscribed_topic_names is None else list(request.subscribed_topic_names)
    if access.refused(ctx, Api.CONSUMER_GROUP_HEARTBEAT, "topics", subscribed or []):
        # As Kafka's broker answers it: the code alone, naming no topic.
        return error_body(ctx.api_key, ctx.api_version, ErrorCode.TOPIC_AUTHORIZATION_FAILED.kafka_code)
    owned = (
        None
        if request.topic_partitions is None
        else {t.topic_id: frozenset(t.partitions) for t in request.topic_partitions if t.partitions}
    )
    answer = await ctx.call(
        consumer_groups.heartbeat,
        ctx.broker,
        cg.HeartbeatRequest(
            request.group_id,
            request.member_id,
            request.member_epoch,
            request.instance_id,
            request.rack_id,
            request.rebalance_timeout_ms,
            subscribed,
            request.subscribed_topic_regex if ctx.api_version >= 1 else None,
            request.server_assignor,
            owned,
            ctx.client_id or "",
            ctx.client_host,
        ),
    )
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, **answer.body()}


async def handle_consumer_group_describe(ctx: RequestContext, request: Any) -> dict:
    def not_here(group_id: str) -> TxlogError | None:
        code = ctx.groups.check_offset_fetch(group_id) if ctx.groups is not None else None
        return None if code is None else TxlogError(code)

    def missing(group_id: str) -> TxlogError:
        classic = _classic_group_here(ctx, group_id)
        return TxlogError(
            ErrorCode.GROUP_ID_NOT_FOUND,
            f"Group {group_id} is not a consumer group." if classic else f"Group {group_id} not found.",
        )

    return await describe_groups(
        ctx,
        request,
        Api.DESCRIBE_CONSUMER_GROUP,
        consumer_groups.describe,
        consumer_group_describe.described_topics,
        lambda group: consumer_group_describe.describe(group, ctx.api_version),
        missing,
        not_here,
    )
