"""JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups and DeleteGroups: wire
requests to the group coordinator (``ctx.groups``) and back. Only the versions' differences live
here; every rule is the coordinator's (``app.domain.groups.coordinator``).

Versions read from the schemas: JoinGroup 0–9, SyncGroup 0–5, Heartbeat 0–4, LeaveGroup 0–5,
DescribeGroups 0–6, ListGroups 0–5, DeleteGroups 0–2.

Classic groups live in the coordinator's memory, committed offsets in PostgreSQL: DescribeGroups
and ListGroups also show, as Empty, a group that only has committed offsets (a simple consumer's,
or one whose coordinator restarted since), as Kafka keeps such a group.

Consumer groups of the next-generation protocol (KIP-848, ``consumer_groups``) live in PostgreSQL:
ListGroups lists them with their type, DescribeGroups answers them as Kafka 4 does (not a classic
group: GROUP_ID_NOT_FOUND from v6, Dead before), DeleteGroups deletes an empty one, and a JoinGroup
for one with members is INCONSISTENT_GROUP_PROTOCOL (an empty one becomes classic).

ACLs, as Kafka: JoinGroup, SyncGroup, Heartbeat and LeaveGroup need Read on the group (else
GROUP_AUTHORIZATION_FAILED); DescribeGroups and DeleteGroups answer each group refused (Describe,
Delete) with its own GROUP_AUTHORIZATION_FAILED; ListGroups lists every group to a principal with
Describe on the cluster, else only the groups it may describe.
"""

from __future__ import annotations

from typing import Any, Iterable

from api.kafka.handlers import RequestContext, access, error_code
from api.kafka.handlers.share_groups import _classic_group_here
from app.domain.acl_bindings import ResourceType
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import consumer_groups, share_groups
from app.services import groups as groups_service
from app.wire.kafka.messages import ApiKey


def _code(error: ErrorCode | None) -> int:
    return 0 if error is None else error.kafka_code


async def handle_join_group(ctx: RequestContext, request: Any) -> dict:
    v = ctx.api_version
    access.check(ctx, Api.JOIN_GROUP, group=request.group_id)
    if (
        request.group_id
        and ctx.groups.check_offset_fetch(request.group_id) is None
        and not _classic_group_here(ctx, request.group_id)
        and not await ctx.call(consumer_groups.claim_for_classic, ctx.broker, request.group_id)
    ):
        # A consumer group of the next-generation protocol with members: a group is of one type at
        # a time, and txlog moves no members from one protocol to the other.
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL.kafka_code,
            "generation_id": -1,
            "protocol_type": None,
            "protocol_name": None if v >= 7 else "",
            "leader": "",
            "member_id": request.member_id,
            "members": [],
        }
    result = await ctx.groups.join_group(
        request.group_id,
        request.member_id,
        request.group_instance_id if v >= 5 else None,
        request.session_timeout_ms,
        # v0 has no rebalance timeout: the session timeout stands in for it, as in Kafka.
        request.rebalance_timeout_ms if v >= 1 else request.session_timeout_ms,
        request.protocol_type,
        [(p.name, bytes(p.metadata)) for p in request.protocols],
        client_id=ctx.client_id or "",
        client_host=ctx.client_host,
        require_known_member_id=v >= 4,
        supports_skip_assignment=v >= 9,
    )
    return {
        "throttle_time_ms": 0,
        "error_code": _code(result.error),
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        # Nullable from v7; before that "no protocol" is the empty string.
        "protocol_name": result.protocol_name if v >= 7 or result.protocol_name is not None else "",
        "leader": result.leader_id,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata} for m in result.members
        ],
    }


async def handle_sync_group(ctx: RequestContext, request: Any) -> dict:
    v = ctx.api_version
    access.check(ctx, Api.SYNC_GROUP, group=request.group_id)
    result = await ctx.groups.sync_group(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id if v >= 3 else None,
        request.protocol_type if v >= 5 else None,
        request.protocol_name if v >= 5 else None,
        [(a.member_id, bytes(a.assignment)) for a in request.assignments],
    )
    return {
        "throttle_time_ms": 0,
        "error_code": _code(result.error),
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


async def handle_heartbeat(ctx: RequestContext, request: Any) -> dict:
    access.check(ctx, Api.HEARTBEAT, group=request.group_id)
    error = ctx.groups.heartbeat(
        request.group_id, request.generation_id, request.member_id, request.group_instance_id if ctx.api_version >= 3 else None
    )
    return {"throttle_time_ms": 0, "error_code": _code(error)}


async def handle_leave_group(ctx: RequestContext, request: Any) -> dict:
    v = ctx.api_version
    access.check(ctx, Api.LEAVE_GROUP, group=request.group_id)
    if v >= 3:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    answer = ctx.groups.leave_group(request.group_id, leaving)
    if v >= 3:
        return {
            "throttle_time_ms": 0,
            "error_code": _code(answer.error),
            "members": [
                {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "error_code": _code(m.error)}
                for m in answer.members
            ],
        }
    # v0–2 have one error: the request's, else the member's.
    error = answer.error or next((m.error for m in answer.members if m.error is not None), None)
    return {"throttle_time_ms": 0, "error_code": _code(error)}


async def handle_describe_groups(ctx: RequestContext, request: Any) -> dict:
    v = ctx.api_version
    refused = access.refused(ctx, Api.DESCRIBE_GROUPS, "group", request.groups)
    allowed = [g for g in request.groups if g not in refused]
    with_offsets = set(await ctx.call(groups_service.list_groups, ctx.broker, allowed)) if allowed else set()
    consumer = await ctx.call(consumer_groups.consumer_group_ids, ctx.broker) if allowed else set()
    with_offsets -= consumer
    described = [
        {
            "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED.kafka_code,
            "error_message": refused[g].message,
            "group_id": g,
            "group_state": "",
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
        }
        for g in request.groups
        if g in refused
    ]
    with_operations = v >= 3 and request.include_authorized_operations
    for d in ctx.groups.describe_groups(allowed, with_offsets):
        error = d.error
        if error is ErrorCode.GROUP_ID_NOT_FOUND and v < 6:
            error = None  # before v6 an unknown group is described as Dead, without an error
        message = f"Group {d.group_id} not found." if error is ErrorCode.GROUP_ID_NOT_FOUND else None
        if d.error is ErrorCode.GROUP_ID_NOT_FOUND and d.group_id in consumer:
            # As Kafka 4 describes a consumer group of the next-generation protocol: no classic group
            message = f"Group {d.group_id} is not a classic group." if error is not None else None
        described.append(
            {
                "error_code": _code(error),
                "error_message": message,
                "group_id": d.group_id,
                "group_state": d.state,
                "protocol_type": d.protocol_type,
                "protocol_data": d.protocol_data,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "member_metadata": m.metadata,
                        "member_assignment": m.assignment,
                    }
                    for m in d.members
                ],
            }
        )
        if with_operations and error is None and ctx.authorizer is not None:  # else "not provided"
            described[-1]["authorized_operations"] = access.operations(ctx, ResourceType.GROUP, d.group_id)
    return {"throttle_time_ms": 0, "groups": described}


async def handle_delete_groups(ctx: RequestContext, request: Any) -> dict:
    """Each group on its own, at its coordinator (NOT_COORDINATOR elsewhere): one with members is
    NON_EMPTY_GROUP; an Empty one, or one known only by its offsets, is deleted with its committed
    offsets and those pending in transactions; one with neither is GROUP_ID_NOT_FOUND."""
    refused = access.refused(ctx, Api.DELETE_GROUPS, "group", request.groups_names)
    results = []
    for group_id in request.groups_names:
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED if group_id in refused else await _delete_group(ctx, group_id)
        results.append({"group_id": group_id, "error_code": _code(error)})
    return {"throttle_time_ms": 0, "results": results}


async def _delete_group(ctx: RequestContext, group_id: str) -> ErrorCode | None:
    if not group_id:
        return ErrorCode.INVALID_GROUP_ID
    try:  # a share group: its membership, share-partition state and configs (NON_EMPTY_GROUP with members)
        if await ctx.call(share_groups.is_share_group, ctx.broker, group_id):
            await ctx.call(share_groups.delete_group, ctx.broker, group_id)
            return None
    except TxlogError as exc:
        return error_code(ApiKey.DeleteGroups, exc)
    error = ctx.groups.delete_group(group_id)
    if error is ErrorCode.GROUP_ID_NOT_FOUND:
        try:  # a consumer group of the next-generation protocol: NON_EMPTY_GROUP with members
            if await ctx.call(consumer_groups.delete_group, ctx.broker, group_id):
                error = None
        except TxlogError as exc:
            return error_code(ApiKey.DeleteGroups, exc)
    if error is not None and error is not ErrorCode.GROUP_ID_NOT_FOUND:
        return error
    try:
        had_offsets = await ctx.call(groups_service.delete_offsets, ctx.broker, group_id)
    except TxlogError as exc:
        return error_code(ApiKey.DeleteGroups, exc)
    return None if error is None or had_offsets else error


async def handle_list_groups(ctx: RequestContext, request: Any) -> dict:
    v = ctx.api_version
    consumer = await ctx.call(consumer_groups.list_groups, ctx.broker)
    consumer_ids = {g for g, _ in consumer}
    listed = ctx.groups.list_groups(
        request.states_filter if v >= 4 else (),
        request.types_filter if v >= 5 else (),
        [g for g in await ctx.call(groups_service.list_groups, ctx.broker) if g not in consumer_ids],
    )
    groups = [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state, "group_type": g.group_type}
        for g in listed
        if access.shows(ctx, Api.LIST_GROUPS, g.group_id)
    ]
    states = {s.lower() for s in (request.states_filter if v >= 4 else ())}
    types = {t.lower() for t in (request.types_filter if v >= 5 else ())}
    # Consumer groups of the next-generation protocol, each listed by its coordinator as Kafka lists
    # them (protocol type and group type "consumer"), unless a classic group here holds the id.
    if not types or consumer_groups.GROUP_TYPE in types:
        _list_coordinated(ctx, groups, consumer, states, consumer_groups.GROUP_TYPE, consumer_groups.PROTOCOL_TYPE)
    # Share groups, each listed by the gateway FindCoordinator names for it (any gateway serves
    # them; clients ask every broker and add the answers up, so each is listed once).
    if not types or share_groups.GROUP_TYPE in types:
        shared = await ctx.call(share_groups.list_groups, ctx.broker)
        _list_coordinated(ctx, groups, shared, states, share_groups.GROUP_TYPE, share_groups.PROTOCOL_TYPE)
    return {"throttle_time_ms": 0, "error_code": 0, "groups": groups}


def _list_coordinated(
    ctx: RequestContext,
    groups: list[dict],
    found: Iterable[tuple[str, str]],
    states: set[str],
    group_type: str,
    protocol_type: str,
) -> None:
    """Adds to ListGroups' ``groups`` each group of ``found`` (its id and state) this gateway
    coordinates, in one of ``states`` (any when none), that the principal may see and that is not
    listed already."""
    listed_ids = {g["group_id"] for g in groups}
    for group_id, state in found:
        if group_id in listed_ids or (states and state.lower() not in states) or not access.shows(ctx, Api.LIST_GROUPS, group_id):
            continue
        if _coordinated_here(ctx, group_id):
            groups.append({"group_id": group_id, "protocol_type": protocol_type, "group_state": state, "group_type": group_type})


def _coordinated_here(ctx: RequestContext, group_id: str) -> bool:
    try:
        return bool(ctx.cluster.coordinator_of(group_id).node_id == ctx.node.node_id)
    except TxlogError:
        return False
