"""Share groups' administration on the wire: KIP-932's admin APIs (DescribeShareGroupOffsets,
AlterShareGroupOffsets and DeleteShareGroupOffsets, v0) and a share group's configs as a GROUP
config resource (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, through
``api.kafka.handlers.topics``), to ``app.services.share_admin`` and ``share_configs``. Every rule is
theirs; here are the wire's shapes and the ACLs.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, Iterable

from api.kafka.handlers import RequestContext, access
from api.kafka.handlers.share import _code, _topic_refusals
from app.domain.acls import Api
from app.domain.share_configs import BOUNDS, DEFAULTS, validated
from app.domain.topic_configs import ConfigSource, ConfigType
from app.errors import ErrorCode, TxlogError
from app.services import share_admin, share_configs, share_groups, topics

# --- the share groups' offsets (KIP-932's admin APIs, v0) -----------------------------------------


def _group_error(exc: TxlogError) -> dict:
    return {"error_code": _code(exc), "error_message": exc.message}


async def _topics_by_name(ctx: RequestContext, names: Iterable[str]) -> dict[str, Any]:
    wanted = sorted(set(names))
    if not wanted:
        return {}
    return {t.name: t for t in await ctx.call(topics.topics_metadata, ctx.broker, wanted)}


_NO_TOPIC = TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.value.default_message)
_ZERO_ID = uuid.UUID(int=0)


async def handle_describe_share_group_offsets(ctx: RequestContext, request: Any) -> dict:
    """Each group's share-partition start offsets (SPSO): of the partitions asked, or (topics null)
    of every partition the group has state on; -1 for a partition it never read. Describe on the
    group (else the group's GROUP_AUTHORIZATION_FAILED) and on each topic (else the partitions')."""
    out = []
    for entry in request.groups:
        group_id = entry.group_id
        refused = access.refused(ctx, Api.DESCRIBE_SHARE_GROUP_OFFSETS, "group", [group_id])
        if refused:
            out.append({"group_id": group_id, "topics": [], **_group_error(refused[group_id])})
            continue
        described = await ctx.call(share_admin.describe, ctx.broker, group_id)
        starts = {(p.topic, p.partition): p.start_offset for p in described.partitions}
        asked: dict[str, list[int]] = {}
        if entry.topics is None:
            for topic, partition in sorted(starts):
                asked.setdefault(topic, []).append(partition)
        else:
            for t in entry.topics:
                asked.setdefault(t.topic_name, []).extend(t.partitions)
        known = await _topics_by_name(ctx, asked)
        denied = _topic_refusals(ctx, Api.DESCRIBE_SHARE_GROUP_OFFSETS, asked)
        topics_out = []
        for name, partitions in asked.items():
            meta = known.get(name)
            parts = []
            for p in partitions:
                error = denied.get(name) or (_NO_TOPIC if meta is None or not 0 <= p < meta.partitions else None)
                parts.append(
                    {
                        "partition_index": p,
                        "start_offset": -1 if error else starts.get((name, p), -1),
                        "leader_epoch": 0 if not error else -1,
                        "error_code": _code(error),
                        "error_message": None if error is None else error.message,
                    }
                )
            topics_out.append({"topic_name": name, "topic_id": meta.topic_id if meta else _ZERO_ID, "partitions": parts})
        out.append({"group_id": group_id, "topics": topics_out, "error_code": 0, "error_message": None})
    return {"throttle_time_ms": 0, "groups": out}


async def handle_alter_share_group_offsets(ctx: RequestContext, request: Any) -> dict:
    """Each partition's share-partition state starts over at the given offset, as Kafka: only while
    the group has no member (NON_EMPTY_GROUP for the whole request). Read on the group and on each
    topic."""
    group_id = request.group_id
    access.check(ctx, Api.ALTER_SHARE_GROUP_OFFSETS, group=group_id)
    names = [t.topic_name for t in request.topics]
    known = await _topics_by_name(ctx, names)
    denied = _topic_refusals(ctx, Api.ALTER_SHARE_GROUP_OFFSETS, names)
    wanted = [
        (t.topic_name, p.partition_index, p.start_offset)
        for t in request.topics
        for p in t.partitions
        if t.topic_name in known and t.topic_name not in denied
    ]
    altered = await ctx.call(
        share_groups.while_empty,
        ctx.broker,
        group_id,
        functools.partial(share_admin.alter_offsets_on, group_id=group_id, offsets=wanted),
    )
    results = {(r.topic, r.partition): r.error for r in altered}
    responses = []
    for t in request.topics:
        meta = known.get(t.topic_name)
        parts = []
        for p in t.partitions:
            error = denied.get(t.topic_name) or (_NO_TOPIC if meta is None else results.get((t.topic_name, p.partition_index)))
            parts.append(
                {
                    "partition_index": p.partition_index,
                    "error_code": _code(error),
                    "error_message": None if error is None else error.message,
                }
            )
        responses.append({"topic_name": t.topic_name, "topic_id": meta.topic_id if meta else _ZERO_ID, "partitions": parts})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "responses": responses}


async def handle_delete_share_group_offsets(ctx: RequestContext, request: Any) -> dict:
    """The group's state of each topic's partitions goes (read again, a partition starts per
    share.auto.offset.reset), only while the group has no member (NON_EMPTY_GROUP). Delete on the
    group, Read on each topic."""
    group_id = request.group_id
    access.check(ctx, Api.DELETE_SHARE_GROUP_OFFSETS, group=group_id)
    names = [t.topic_name for t in request.topics]
    known = await _topics_by_name(ctx, names)
    denied = _topic_refusals(ctx, Api.DELETE_SHARE_GROUP_OFFSETS, names)
    partitions = [(n, p) for n in names if n in known and n not in denied for p in range(known[n].partitions)]
    await ctx.call(
        share_groups.while_empty,
        ctx.broker,
        group_id,
        functools.partial(share_admin.delete_offsets_on, group_id=group_id, partitions=partitions),
    )
    responses = []
    for name in names:
        meta = known.get(name)
        error = denied.get(name) or (_NO_TOPIC if meta is None else None)
        responses.append(
            {
                "topic_name": name,
                "topic_id": meta.topic_id if meta else _ZERO_ID,
                "error_code": _code(error),
                "error_message": None if error is None else error.message,
            }
        )
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "responses": responses}


# --- a share group's configs (GROUP config resources, DescribeConfigs and IncrementalAlterConfigs) --


async def describe_group_configs(
    ctx: RequestContext, group_id: str, wanted: set[str] | None, version: int, request: Any
) -> list[dict]:
    """The share.* configs of the group: its own (DYNAMIC_GROUP_CONFIG) and the defaults. Describe
    configs on the group, else GROUP_AUTHORIZATION_FAILED."""
    access.check(ctx, Api.DESCRIBE_GROUP_CONFIGS, group=group_id)
    own = await ctx.call(share_configs.group_configs_set, ctx.broker, group_id)
    out = []
    for name in sorted(DEFAULTS):
        if wanted is not None and name not in wanted:
            continue
        value = own.get(name, DEFAULTS[name])
        source = ConfigSource.DYNAMIC_GROUP_CONFIG if name in own else ConfigSource.DEFAULT_CONFIG
        out.append(
            {
                "name": name,
                "value": value,
                "read_only": False,
                "is_default": name not in own,
                "config_source": source,
                "is_sensitive": False,
                "config_type": ConfigType.INT if name in BOUNDS else ConfigType.STRING,
                "documentation": None,
                "synonyms": [{"name": name, "value": value, "source": source}]
                if version >= 1 and request.include_synonyms
                else [],
            }
        )
    return out


async def alter_group_configs(
    ctx: RequestContext, group_id: str, ops: list[tuple[str, int, str | None]], validate_only: bool
) -> None:
    """IncrementalAlterConfigs of a GROUP resource: SET and DELETE of its share.* configs (APPEND
    and SUBTRACT are for LIST configs: INVALID_CONFIG), each value checked as Kafka checks it.
    AlterConfigs on the group, else GROUP_AUTHORIZATION_FAILED."""
    access.check(ctx, Api.ALTER_GROUP_CONFIGS, group=group_id)
    changes: dict[str, str | None] = {}
    for name, operation, value in ops:
        if operation not in (0, 1):
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"Config {name} is not a list: only SET and DELETE apply to it")
        if operation == 0 and value is None:
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"Null value not supported for : {name}")
        changes[name] = value if operation == 0 else None
    if validate_only:
        for name, value in changes.items():
            if value is not None or name not in DEFAULTS:
                validated(name, value or "", min_record_lock_duration_ms=ctx.broker.settings.share_min_record_lock_duration_ms)
        return
    await ctx.call(share_configs.alter_group_configs, ctx.broker, group_id, changes)


async def replace_group_configs(
    ctx: RequestContext, group_id: str, configs: list[tuple[str, str | None]], validate_only: bool
) -> None:
    """AlterConfigs of a GROUP resource, as Kafka 4.x serves it (its controller takes GROUP in the
    whole-set call too): the share.* configs given replace the group's, every other one back to its
    default. AlterConfigs on the group, else GROUP_AUTHORIZATION_FAILED."""
    access.check(ctx, Api.ALTER_GROUP_CONFIGS, group=group_id)
    wanted: dict[str, str] = {}
    for name, value in configs:
        if value is None:
            raise TxlogError(ErrorCode.INVALID_CONFIG, f"Null value not supported for : {name}")
        wanted[name] = value
    await ctx.call(share_configs.replace_group_configs, ctx.broker, group_id, wanted, validate_only)
