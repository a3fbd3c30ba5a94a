"""Topics and their configs: CreateTopics, CreatePartitions, DeleteTopics, DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs, each through ``app.services.topics`` as the HTTP API.

Configs are those of Kafka's table (``app.domain.topic_configs``) for TOPIC resources, and the
server's settings under Kafka's names, read-only, for BROKER resources (``broker_configs``).

ACLs, as Kafka, each topic or config resource answered with its own error: CreateTopics needs
Create on the cluster or the topic, and answers a created topic's configs only with DescribeConfigs
on it (else its topic_config_error_code is TOPIC_AUTHORIZATION_FAILED); CreatePartitions needs
Alter, DeleteTopics Delete (and Describe to name a topic asked for by id); DescribeConfigs needs
DescribeConfigs, AlterConfigs and IncrementalAlterConfigs AlterConfigs, on the topic for a TOPIC
resource, on the cluster for a BROKER one (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import uuid
from typing import Any

from api.kafka.handlers import Node, RequestContext, access, error_code
from api.kafka.handlers import share_admin as share_admin_handlers
from api.kafka.handlers.bootstrap import ZERO_TOPIC_ID
from app.domain import topic_configs
from app.domain.acls import Api
from app.errors import ErrorCode, TxlogError
from app.services import Broker, topics
from app.wire.kafka.messages import ApiKey

_TOPIC, _BROKER, _GROUP = 2, 4, 32  # config resource types (Kafka's ConfigResource.Type)


def _error(exc: TxlogError, api_key: int = ApiKey.CreateTopics) -> tuple[int, str]:
    return error_code(api_key, exc).kafka_code, exc.message


# -- CreateTopics --------------------------------------------------------------------------------


async def handle_create_topics(ctx: RequestContext, request: Any) -> dict:
    """Each topic is created (or, with validate_only, checked) on its own and answered with its
    own error. num_partitions -1 takes TXLOG_KAFKA_NUM_PARTITIONS; a manual assignment gives the
    partition count (its broker ids are not used); replication_factor -1 or any positive number
    is accepted (one copy is kept, in PostgreSQL); configs are checked against Kafka's table of
    topic configs (``app.domain.topic_configs``), as the HTTP API checks them. From v5 the answer
    lists every config with its value, as DescribeConfigs would."""
    names = [topic.name for topic in request.topics]
    duplicated = {name for name in names if names.count(name) > 1}
    refused = access.refused(ctx, Api.CREATE_TOPICS, "topic", names)
    results = []
    for topic in request.topics:
        if topic.name in duplicated:
            error = ErrorCode.INVALID_REQUEST.kafka_code, f"Topic {topic.name!r} appears more than once in the request"
            results.append(_created(topic.name, error=error))
            continue
        try:
            if topic.name in refused:
                raise refused[topic.name]
            partitions, config = _creatable(ctx, topic)
            described, topic_id = await ctx.call(_create_topic, ctx.broker, topic.name, partitions, config, request.validate_only)
        except TxlogError as exc:
            results.append(_created(topic.name, error=_error(exc)))
        else:
            if access.shows(ctx, Api.CREATE_TOPICS, topic.name):
                results.append(_created(topic.name, partitions, described, topic_id))
            else:
                results.append(
                    _created(topic.name, partitions, [], topic_id)
                    | {"topic_config_error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED.kafka_code}
                )
    return {"throttle_time_ms": 0, "topics": results}


def _creatable(ctx: RequestContext, topic: Any) -> tuple[int, dict[str, str]]:
    """The partition count and config a CreateTopics entry asks for."""
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "A manual assignment goes with num_partitions and replication_factor -1")
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            raise TxlogError(ErrorCode.INVALID_REQUEST, "A manual assignment numbers its partitions from 0 without gaps")
        partitions = len(indexes)
    else:
        partitions = ctx.broker.settings.kafka_num_partitions if topic.num_partitions == -1 else topic.num_partitions
        if topic.replication_factor == 0 or topic.replication_factor < -1:
            raise TxlogError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Replication factor must be -1 or at least 1, not {topic.replication_factor}",
            )
    config = {c.name: c.value for c in topic.configs if c.value is not None}
    return partitions, config


def _create_topic(
    broker: Broker, name: str, partitions: int, config: dict, validate_only: bool
) -> tuple[list[topic_configs.DescribedConfig], uuid.UUID]:
    """Create the topic, or check that it could be created: every config with its value, as
    DescribeConfigs would answer, and its topic id (the zero id when only checked, as Kafka answers
    validate_only)."""
    topics.create_topic(broker, name, partitions, config, validate_only)
    if validate_only:
        return topics.described_config(broker, topics.kept_config(config)), ZERO_TOPIC_ID
    (created,) = topics.topics_metadata(broker, [name])
    return topics.describe_topic_config(broker, name), created.topic_id


def _created(
    name: str,
    partitions: int = -1,
    described: list[topic_configs.DescribedConfig] | None = None,
    topic_id: uuid.UUID = ZERO_TOPIC_ID,
    error: tuple[int, str] | None = None,
) -> dict:
    code, message = error or (0, None)
    return {
        "name": name,
        "topic_id": topic_id,
        "error_code": code,
        "error_message": message,
        "num_partitions": partitions,
        "replication_factor": -1 if error else 1,
        "configs": [
            {"name": d.name, "value": d.value, "read_only": d.read_only, "config_source": d.source, "is_sensitive": False}
            for d in (described or ())
        ],
    }


# -- CreatePartitions -----------------------------------------------------------------------------


async def handle_create_partitions(ctx: RequestContext, request: Any) -> dict:
    """Each topic on its own, grown to ``count`` partitions (or checked, with validate_only): never
    shrunk (INVALID_PARTITIONS), named once per request (INVALID_REQUEST). Assignments, when given,
    are checked as Kafka checks them and not applied (one copy, in PostgreSQL): one per new
    partition, each of one replica (the topic's replication factor) on a live broker, else
    INVALID_REPLICA_ASSIGNMENT."""
    names = [topic.name for topic in request.topics]
    live = {node.node_id for node in ctx.cluster.list_nodes()}
    refused = access.refused(ctx, Api.CREATE_PARTITIONS, "topic", names)
    results = []
    for topic in request.topics:
        try:
            if names.count(topic.name) > 1:
                raise TxlogError(ErrorCode.INVALID_REQUEST, "Duplicate topic in request.")
            if topic.name in refused:
                raise refused[topic.name]
            if topic.assignments is not None:
                _check_assignments(topic.assignments, live)
            await ctx.call(
                topics.create_partitions,
                ctx.broker,
                topic.name,
                topic.count,
                request.validate_only,
                None if topic.assignments is None else len(topic.assignments),
            )
        except TxlogError as exc:
            code, message = _error(exc, ApiKey.CreatePartitions)
            results.append({"name": topic.name, "error_code": code, "error_message": message})
        else:
            results.append({"name": topic.name, "error_code": 0, "error_message": None})
    return {"throttle_time_ms": 0, "results": results}


def _check_assignments(assignments: Any, live: set[int]) -> None:
    unknown = sorted({b for a in assignments for b in a.broker_ids} - live)
    if unknown:
        raise TxlogError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))}."
        )
    other = [i for i, a in enumerate(assignments) if len(a.broker_ids) != 1]
    if other:
        raise TxlogError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"Inconsistent replication factor between partitions: the topic's is 1, assignments {other} are not.",
        )


# -- DeleteTopics ---------------------------------------------------------------------------------


async def handle_delete_topics(ctx: RequestContext, request: Any) -> dict:
    """Each topic on its own, by name (v0-5) or by name or topic id (v6): deleted with what refers
    to it, its open transactions aborted (``topics.delete_topic``); its records go within
    timeout_ms, or after it. UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID by id) for no such topic."""
    if ctx.api_version >= 6:
        asked = [(t.name, t.topic_id) for t in request.topics]
    else:
        asked = [(name, ZERO_TOPIC_ID) for name in request.topic_names]
    timeout_ms = max(0, request.timeout_ms)
    responses = []
    for name, topic_id in asked:
        try:
            if name is None:
                found = await ctx.call(topics.topics_metadata, ctx.broker, [], [topic_id])
                if not found:
                    raise TxlogError(ErrorCode.UNKNOWN_TOPIC_ID, f"No topic has the id {topic_id}")
                hidden = access.refused(ctx, Api.DESCRIBE_TOPIC, "topic", [found[0].name])
                if hidden:  # the id is not secret, the name is: not answered
                    raise hidden[found[0].name]
                name = found[0].name
            refused = access.refused(ctx, Api.DELETE_TOPICS, "topic", [name])
            if refused:
                raise refused[name]
            deleted = await ctx.call(topics.delete_topic, ctx.broker, name, timeout_ms)
        except TxlogError as exc:
            code, message = _error(exc, ApiKey.DeleteTopics)
            responses.append({"name": name, "topic_id": topic_id, "error_code": code, "error_message": message})
        else:
            responses.append({"name": name, "topic_id": deleted.topic_id, "error_code": 0, "error_message": None})
    return {"throttle_time_ms": 0, "responses": responses}


# -- DescribeConfigs, AlterConfigs, IncrementalAlterConfigs ---------------------------------------


_T = topic_configs.ConfigType
# Broker configs that are this server's settings: Kafka's name, the setting's field, Kafka's type.
_BROKER_SETTINGS = (
    ("auto.create.topics.enable", "kafka_auto_create_topics", _T.BOOLEAN),
    ("group.initial.rebalance.delay.ms", "kafka_group_initial_rebalance_delay_ms", _T.INT),
    ("group.max.session.timeout.ms", "kafka_group_max_session_timeout_ms", _T.INT),
    ("group.max.size", "kafka_group_max_size", _T.INT),
    ("group.min.session.timeout.ms", "kafka_group_min_session_timeout_ms", _T.INT),
    ("log.retention.bytes", "log_retention_bytes", _T.LONG),
    ("log.retention.ms", "log_retention_ms", _T.LONG),
    ("message.max.bytes", "max_request_bytes", _T.INT),
    ("num.partitions", "kafka_num_partitions", _T.INT),
    ("offset.metadata.max.bytes", "offset_metadata_max_bytes", _T.INT),
    ("producer.id.expiration.ms", "producer_id_expiration_ms", _T.INT),
    ("socket.request.max.bytes", "kafka_max_frame_bytes", _T.INT),
    ("transaction.abort.timed.out.transaction.cleanup.interval.ms", "transaction_abort_check_interval_ms", _T.INT),
    ("transaction.max.timeout.ms", "max_transaction_timeout_ms", _T.INT),
    ("transaction.state.log.num.partitions", "transaction_state_partitions", _T.INT),
    ("transactional.id.expiration.ms", "transactional_id_expiration_ms", _T.INT),
)
_STATIC, _DEFAULT = topic_configs.ConfigSource.STATIC_BROKER_CONFIG, topic_configs.ConfigSource.DEFAULT_CONFIG


def broker_configs(
    broker: Broker, node: Node, listeners: list[tuple[str, str, int]]
) -> list[tuple[str, str | None, topic_configs.ConfigType, topic_configs.ConfigSource]]:
    """A node's broker configs that have a meaning here, in name order: the server's settings under
    Kafka's names (STATIC_BROKER_CONFIG where the server was given one, else DEFAULT_CONFIG), and
    what is fixed by one copy in PostgreSQL and by the node (DEFAULT_CONFIG). Its listeners are
    those it advertises, every one (``NAME://host:port``, comma-separated)."""
    s = broker.settings
    listener = ",".join(f"{name}://{host}:{port}" for name, host, port in listeners) or f"PLAINTEXT://{node.host}:{node.port}"
    out: list[tuple[str, str | None, topic_configs.ConfigType, topic_configs.ConfigSource]] = [
        (name, _broker_value(getattr(s, field), kind), kind, _STATIC if field in s.model_fields_set else _DEFAULT)
        for name, field, kind in _BROKER_SETTINGS
    ]
    out += [
        ("advertised.listeners", listener, _T.STRING, _STATIC),
        ("broker.id", str(node.node_id), _T.INT, _STATIC),
        ("default.replication.factor", "1", _T.SHORT, _DEFAULT),
        ("listeners", listener, _T.STRING, _STATIC),
        ("min.insync.replicas", "1", _T.INT, _DEFAULT),
        ("node.id", str(node.node_id), _T.INT, _STATIC),
    ]
    return sorted(out)


def _broker_value(value: object, kind: topic_configs.ConfigType) -> str:
    """A setting as Kafka shows a broker config: booleans in lower case, no limit (None) an INT's
    largest value (group.max.size)."""
    if value is None and kind is _T.INT:
        return str(2**31 - 1)
    return str(value).lower() if isinstance(value, bool) else str(value)


async def handle_describe_configs(ctx: RequestContext, request: Any) -> dict:
    """TOPIC resources: every topic config (or those named) with its value and source, synonyms
    from v1 when asked, type and documentation from v3 when asked. BROKER resources: this node's
    (or any live node's) settings under Kafka's names, read-only (STATIC_BROKER_CONFIG)."""
    v = ctx.api_version
    results = []
    for resource in request.resources:
        wanted = None if resource.configuration_keys is None else set(resource.configuration_keys)
        entry = {"resource_type": resource.resource_type, "resource_name": resource.resource_name, "configs": []}
        try:
            _check_config_access(ctx, resource, Api.DESCRIBE_TOPIC_CONFIGS, Api.DESCRIBE_BROKER_CONFIGS)
            if resource.resource_type == _TOPIC:
                described = await ctx.call(topics.describe_topic_config, ctx.broker, resource.resource_name)
                configs = [_described(d, v, request) for d in described if wanted is None or d.name in wanted]
            elif resource.resource_type == _BROKER:
                configs = [
                    _broker_config(entry, v, request)
                    for entry in _broker_of(ctx, resource.resource_name)
                    if wanted is None or entry[0] in wanted
                ]
            elif resource.resource_type == _GROUP:  # a share group's share.* configs
                configs = await share_admin_handlers.describe_group_configs(ctx, resource.resource_name, wanted, v, request)
            else:
                raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type {resource.resource_type}")
        except TxlogError as exc:
            code, message = _error(exc, ApiKey.DescribeConfigs)
            results.append({**entry, "error_code": code, "error_message": message})
        else:
            results.append({**entry, "error_code": 0, "error_message": None, "configs": configs})
    return {"throttle_time_ms": 0, "results": results}


def _broker_of(
    ctx: RequestContext, name: str
) -> list[tuple[str, str | None, topic_configs.ConfigType, topic_configs.ConfigSource]]:
    """The broker configs of node ``name`` ("" is the node asked: Kafka's default broker resource)."""
    if name == "":
        return broker_configs(ctx.broker, ctx.node, ctx.cluster.listeners_of(ctx.node.node_id))
    node = next((n for n in ctx.cluster.list_nodes() if str(n.node_id) == name), None)
    if node is None:
        raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected a live node's id, but received {name}")
    return broker_configs(ctx.broker, node, ctx.cluster.listeners_of(node.node_id))


def _described(d: topic_configs.DescribedConfig, version: int, request: Any) -> dict:
    out: dict[str, Any] = {
        "name": d.name,
        "value": d.value,
        "read_only": d.read_only,
        "is_default": d.source is topic_configs.ConfigSource.DEFAULT_CONFIG,
        "config_source": d.source,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": d.type,
        "documentation": d.doc if version >= 3 and request.include_documentation else None,
    }
    if version >= 1 and request.include_synonyms:
        out["synonyms"] = [{"name": n, "value": value, "source": source} for n, value, source in d.synonyms]
    return out


def _broker_config(
    entry: tuple[str, str | None, topic_configs.ConfigType, topic_configs.ConfigSource], version: int, request: Any
) -> dict:
    name, value, kind, source = entry
    return {
        "name": name,
        "value": value,
        "read_only": True,
        "is_default": source is _DEFAULT,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [{"name": name, "value": value, "source": source}] if version >= 1 and request.include_synonyms else [],
        "config_type": kind,
        "documentation": None,
    }


async def handle_alter_configs(ctx: RequestContext, request: Any) -> dict:
    """The whole config of each TOPIC resource replaced by the one given (or checked, with
    validate_only): every key not given returns to its default. So too a GROUP resource's share.*
    configs (a share group's). BROKER configs are read-only."""
    responses = []
    for resource in request.resources:
        if resource.resource_type == _GROUP:
            try:
                given = [(c.name, c.value) for c in resource.configs]
                await share_admin_handlers.replace_group_configs(ctx, resource.resource_name, given, request.validate_only)
            except TxlogError as exc:
                responses.append(_alter_result(resource, *_error(exc, ApiKey.AlterConfigs)))
            else:
                responses.append(_alter_result(resource, 0, None))
            continue
        config = {c.name: c.value for c in resource.configs}
        responses.append(
            await _alter(ctx, ApiKey.AlterConfigs, resource, topics.replace_topic_config, config, request.validate_only)
        )
    return {"throttle_time_ms": 0, "responses": responses}


async def handle_incremental_alter_configs(ctx: RequestContext, request: Any) -> dict:
    """Each TOPIC resource's configs changed by SET, DELETE, APPEND and SUBTRACT (LIST configs
    only), or checked with validate_only. BROKER configs are read-only."""
    responses = []
    for resource in request.resources:
        if resource.resource_type == _GROUP:  # a share group's share.* configs
            try:
                ops = [(c.name, c.config_operation, c.value) for c in resource.configs]
                await share_admin_handlers.alter_group_configs(ctx, resource.resource_name, ops, request.validate_only)
            except TxlogError as exc:
                responses.append(_alter_result(resource, *_error(exc, ApiKey.IncrementalAlterConfigs)))
            else:
                responses.append(_alter_result(resource, 0, None))
            continue
        try:
            ops = [(c.name, topic_configs.Operation(c.config_operation), c.value) for c in resource.configs]
        except ValueError:
            responses.append(_alter_result(resource, ErrorCode.INVALID_REQUEST.kafka_code, "Unknown config operation"))
            continue
        responses.append(
            await _alter(
                ctx, ApiKey.IncrementalAlterConfigs, resource, topics.incremental_alter_topic_config, ops, request.validate_only
            )
        )
    return {"throttle_time_ms": 0, "responses": responses}


def _check_config_access(ctx: RequestContext, resource: Any, topic_api: Api, broker_api: Api) -> None:
    """Raise Kafka's refusal of a config resource: of the topic for a TOPIC one, of the cluster for
    a BROKER one (other types are refused as unsupported after)."""
    if resource.resource_type == _TOPIC:
        refused = access.refused(ctx, topic_api, "topic", [resource.resource_name])
        if refused:
            raise refused[resource.resource_name]
    elif resource.resource_type == _BROKER:
        access.check(ctx, broker_api)


async def _alter(ctx: RequestContext, api_key: int, resource: Any, alter: Any, change: Any, validate_only: bool) -> dict:
    try:
        _check_config_access(ctx, resource, Api.ALTER_TOPIC_CONFIGS, Api.ALTER_BROKER_CONFIGS)
        if resource.resource_type == _BROKER:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "Broker configs are read-only: they are the server's settings (TXLOG_*)")
        if resource.resource_type != _TOPIC:
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type {resource.resource_type}")
        await ctx.call(alter, ctx.broker, resource.resource_name, change, validate_only)
    except TxlogError as exc:
        return _alter_result(resource, *_error(exc, api_key))
    return _alter_result(resource, 0, None)


def _alter_result(resource: Any, code: int, message: str | None) -> dict:
    return {
        "error_code": code,
        "error_message": message,
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
    }
