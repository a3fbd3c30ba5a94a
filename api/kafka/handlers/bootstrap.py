"""What a client asks first: ApiVersions, Metadata, FindCoordinator and DescribeCluster.

Topics come from ``app.services.topics``; the brokers, partition leaders and coordinators from the
cluster view (``ctx.cluster``). txlog keeps one copy of every record, in PostgreSQL: each partition
has one replica, its leader, at leader epoch 0, and a replication factor asked for at creation is
accepted and not applied (the database's own replication is what keeps the data).

ACLs, as Kafka: a topic asked for needs Describe, else it is TOPIC_AUTHORIZATION_FAILED whether it
exists or not; a listing of every topic leaves out those the principal may not describe; an
auto-created topic needs Create on the cluster or on the topic. FindCoordinator needs Describe on
the group or transactional id. ApiVersions and DescribeCluster need nothing.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Mapping

from api.kafka import transaction_protocol, versions
from api.kafka.handlers import Node, RequestContext, access
from app.domain.acl_bindings import ResourceType
from app.domain.acls import Api
from app.domain.log import LEADER_EPOCH
from app.domain.records import validate_topic_name
from app.errors import ErrorCode, TxlogError
from app.services import Broker, topics

# A topic that could not be answered has the zero UUID (Kafka's Uuid.ZERO_UUID). Fetch is served up
# to v12, which names topics, so clients need no topic id to read.
ZERO_TOPIC_ID = uuid.UUID(int=0)
# Kafka's check of ApiVersions v3+'s client software name and version.
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
_COORDINATOR_GROUP, _COORDINATOR_TRANSACTION = 0, 1
_BROKER_ENDPOINTS, _CONTROLLER_ENDPOINTS = 1, 2  # DescribeCluster's endpoint types
# ApiVersions' FinalizedFeaturesEpoch: the gateway's start, in milliseconds (``handle_api_versions``).
_FEATURES_EPOCH = time.time_ns() // 1_000_000


# -- ApiVersions ---------------------------------------------------------------------------------


async def handle_api_versions(ctx: RequestContext, request: Any) -> dict:
    """The served keys and versions, from the one table, and from v3 the ``transaction.version``
    feature: supported from 0 to 2, finalized at TXLOG_KAFKA_TRANSACTION_VERSION (2 unless an
    operator keeps the cluster at 1). Java clients from 4.0 speak transactions V2 when it is
    finalized at 2; every other client speaks the first protocol whatever it is
    (``api.kafka.transaction_protocol``). The level changes only with a restart, so its epoch is
    when this gateway started: a client that hears two levels (gateways set differently) keeps the
    later-started gateway's, as a Kafka client keeps the features of the highest epoch. An error is
    answered as a v0 body."""
    api_keys = [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in versions.advertised()]
    answer: dict[str, Any] = {"error_code": 0, "api_keys": api_keys, "throttle_time_ms": 0}
    if ctx.api_version >= 3:
        name, version = request.client_software_name, request.client_software_version
        if not (name and version and _SOFTWARE.fullmatch(name) and _SOFTWARE.fullmatch(version)):
            return {"error_code": ErrorCode.INVALID_REQUEST.kafka_code, "api_keys": api_keys}
        level = ctx.broker.settings.kafka_transaction_version
        answer["supported_features"] = transaction_protocol.supported_features()
        answer["finalized_features_epoch"] = _FEATURES_EPOCH
        answer["finalized_features"] = transaction_protocol.finalized_features(level)
    return answer


# -- Metadata ------------------------------------------------------------------------------------


async def handle_metadata(ctx: RequestContext, request: Any) -> dict:
    """Brokers (every live gateway, ``api.kafka.cluster``), and the topics asked for, each
    partition led by the node the cluster's rule names: all of them when the list is null (or
    empty in v0), none when it is empty. An unknown topic is UNKNOWN_TOPIC_OR_PARTITION, unless auto-creation is on
    (TXLOG_KAFKA_AUTO_CREATE_TOPICS, and the request allows it from v4) and creates it with
    TXLOG_KAFKA_NUM_PARTITIONS partitions; an illegal name is INVALID_TOPIC_EXCEPTION.

    The brokers and the controller are always answered, from memory: a Kafka broker never answers
    Metadata without them, and a client that is told of no broker forgets those it knew. When the
    topics cannot be read (the database is away or too slow: a retriable error), each topic this
    gateway has read before (``KnownTopics``) is answered with its partitions and their leaders,
    each partition LEADER_NOT_AVAILABLE, and any other topic asked for LEADER_NOT_AVAILABLE.
    Clients keep their brokers, partitions and leaders, and retry the KAFKA_STORAGE_ERROR that
    Produce and Fetch answer meanwhile (``handlers.partition_code``) until the database is back.
    The leader stays named, where Kafka would answer leader -1 for a partition without a live
    replica: aiokafka fails an idempotent producer's batches for a partition without a leader
    after its request timeout and then cannot deliver again (OUT_OF_ORDER_SEQUENCE_NUMBER), while
    every client retries a Produce answered KAFKA_STORAGE_ERROR, librdkafka and aiokafka for as
    long as an idempotent producer's delivery timeout allows."""
    requested = request.topics
    if ctx.api_version == 0 and not requested:
        requested = None
    # A topic asked for by name that may not be described is answered so, unread.
    refused = access.refused(ctx, Api.DESCRIBE_TOPIC, "topic", (e.name for e in requested or () if e.name is not None))
    try:
        if requested is None:
            found = await ctx.call(topics.topics_metadata, ctx.broker)
        else:  # only the topics asked for are read, by name or (v10+) by topic id
            names = [e.name for e in requested if e.name is not None and e.name not in refused]
            found = await ctx.call(topics.topics_metadata, ctx.broker, names, [e.topic_id for e in requested if e.name is None])
    except TxlogError as exc:
        if not exc.code.retriable:
            raise
        return _metadata(ctx, request, _unavailable(ctx, requested, refused))
    ctx.known_topics.remember(
        found, None if requested is None else [e.name for e in requested if e.name is not None and e.name not in refused]
    )
    existing = {t.name: t for t in found}
    answers: list[dict]
    if requested is None:
        answers = [_topic(ctx, existing[name]) for name in sorted(existing) if access.shows(ctx, Api.LIST_TOPICS, name)]
    else:
        settings = ctx.broker.settings
        auto_create = settings.kafka_auto_create_topics and (ctx.api_version < 4 or request.allow_auto_topic_creation)
        answers = []
        seen: set[str] = set()
        for entry in requested:
            name = entry.name
            if name is None:  # v10+ may ask by topic id
                by_id = next((t for t in existing.values() if t.topic_id == entry.topic_id), None)
                if by_id is None:
                    answers.append(
                        {"error_code": ErrorCode.UNKNOWN_TOPIC_ID.kafka_code, "name": None, "topic_id": entry.topic_id}
                    )
                elif access.refused(ctx, Api.DESCRIBE_TOPIC, "topic", [by_id.name]):
                    # A topic id is not secret; the name is (Kafka answers the id without it).
                    answers.append(_refused(None, by_id.topic_id))
                else:
                    answers.append(_topic(ctx, by_id))
                continue
            if name in seen:
                continue
            seen.add(name)
            if name in refused:
                answers.append(_refused(name))
                continue
            if name in existing:
                answers.append(_topic(ctx, existing[name]))
                continue
            try:
                validate_topic_name(name)
                if not auto_create:
                    raise TxlogError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name!r} does not exist")
                create_refused = access.refused(ctx, Api.CREATE_TOPICS, "topic", [name])
                if create_refused:
                    raise create_refused[name]
                created = await ctx.call(_create_if_absent, ctx.broker, name, settings.kafka_num_partitions)
            except TxlogError as exc:
                answers.append({"error_code": exc.code.kafka_code, "name": name, "topic_id": ZERO_TOPIC_ID})
            else:
                answers.append(_topic(ctx, created))
    if ctx.api_version >= 8 and request.include_topic_authorized_operations:
        for answer in answers:
            if answer.get("error_code") == 0:
                answer.update(_operations(ctx, answer["name"]))
    return _metadata(ctx, request, answers)


def _operations(ctx: RequestContext, topic: str) -> dict:
    """A topic's authorized operations for its answer; none (the schema's "not provided") without ACLs."""
    bits = access.operations(ctx, ResourceType.TOPIC, topic)
    return {} if bits is None else {"topic_authorized_operations": bits}


def _refused(name: str | None, topic_id: uuid.UUID = ZERO_TOPIC_ID) -> dict:
    """A topic the principal may not describe, as Kafka answers it: no partitions, and no topic id
    when asked by name."""
    return {"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED.kafka_code, "name": name, "topic_id": topic_id, "partitions": []}


def _metadata(ctx: RequestContext, request: Any, answers: list[dict]) -> dict:
    nodes = ctx.cluster.list_nodes()
    body = {
        "throttle_time_ms": 0,
        "brokers": [_broker(node) for node in nodes],
        "cluster_id": ctx.cluster.cluster_id,
        "controller_id": _controller_id(nodes),
        "topics": answers,
    }
    if 8 <= ctx.api_version <= 10 and request.include_cluster_authorized_operations and ctx.authorizer is not None:
        body["cluster_authorized_operations"] = access.cluster_operations(ctx)
    return body


def _controller_id(nodes: list[Node]) -> int:
    """Any gateway creates topics: the lowest node id, so that every gateway names the same one."""
    return min(node.node_id for node in nodes)


# -- DescribeTopicPartitions ---------------------------------------------------------------------

_PARTITION_LIMIT = 2000  # Kafka's max.request.partition.size.limit


async def handle_describe_topic_partitions(ctx: RequestContext, request: Any) -> dict:
    """KIP-966's paged Metadata of topics (kafka-python's describe_topic_partitions): the topics
    asked for (none: every topic), in name order, from the cursor's topic and partition, at most
    ``response_partition_limit`` partitions (and Kafka's 2000); ``next_cursor`` where the next page
    starts. Each partition as Metadata answers it; an unknown topic UNKNOWN_TOPIC_OR_PARTITION.
    While the topics cannot be read, as Metadata: the topics this gateway read before, each
    partition LEADER_NOT_AVAILABLE, any other LEADER_NOT_AVAILABLE. ACLs as Metadata's: a topic
    asked for that may not be described is TOPIC_AUTHORIZATION_FAILED, unread; the listing of
    every topic leaves such topics out. Each topic answered has its authorized operations."""
    asked = sorted({t.name for t in request.topics})
    refused = access.refused(ctx, Api.DESCRIBE_TOPIC, "topic", asked)
    names = [n for n in asked if n not in refused]
    if asked and not names:
        return {"throttle_time_ms": 0, "topics": [_refused(n) | {"is_internal": False} for n in asked], "next_cursor": None}
    unavailable = False
    try:
        found = await ctx.call(topics.topics_metadata, ctx.broker, names or None)
    except TxlogError as exc:
        if not exc.code.retriable:
            raise
        found, unavailable = ctx.known_topics.all(), True
    existing = {t.name: t for t in found if (t.name in names if names else access.shows(ctx, Api.LIST_TOPICS, t.name))}
    missing = ErrorCode.LEADER_NOT_AVAILABLE if unavailable else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    wanted = names or sorted(existing)
    cursor = request.cursor
    if cursor is not None:
        wanted = [n for n in wanted if n >= cursor.topic_name]
    budget = max(1, min(request.response_partition_limit, _PARTITION_LIMIT))
    answers: list[dict] = []
    next_cursor = None
    for name in wanted:
        if name not in existing:
            answers.append(
                {
                    "error_code": missing.kafka_code,
                    "name": name,
                    "topic_id": ZERO_TOPIC_ID,
                    "is_internal": False,
                    "partitions": [],
                }
            )
            continue
        if budget == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        answer = _topic(ctx, existing[name], unavailable)
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        partitions = answer["partitions"][first : first + budget]
        budget -= len(partitions)
        if first + len(partitions) < existing[name].partitions:
            next_cursor = {"topic_name": name, "partition_index": first + len(partitions)}
        answers.append({**answer, "partitions": partitions, **_operations(ctx, name)})
        if next_cursor is not None:
            break
    answers += [_refused(n) | {"is_internal": False} for n in asked if n in refused]
    return {"throttle_time_ms": 0, "topics": answers, "next_cursor": next_cursor}


# -- DescribeCluster -------------------------------------------------------------------------------


async def handle_describe_cluster(ctx: RequestContext, request: Any) -> dict:
    """The cluster as Metadata names it: its id, the controller and every live gateway as a broker
    (none fenced), from memory (while the database is away too), to any principal, as Kafka answers
    it. The cluster's authorized operations, when asked for, are the principal's (0 without
    Describe on the cluster; "not provided", Kafka's INT32_MIN, without ACLs). From v1 the endpoints asked for must be brokers' (1): the controllers' (2) is
    MISMATCHED_ENDPOINT_TYPE, as a broker answers it, any other UNSUPPORTED_ENDPOINT_TYPE."""
    endpoint_type = request.endpoint_type if ctx.api_version >= 1 else _BROKER_ENDPOINTS
    if endpoint_type != _BROKER_ENDPOINTS:
        code = (
            ErrorCode.MISMATCHED_ENDPOINT_TYPE if endpoint_type == _CONTROLLER_ENDPOINTS else ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        )
        return {
            "throttle_time_ms": 0,
            "error_code": code.kafka_code,
            "error_message": code.value.default_message,
            "endpoint_type": endpoint_type,
            "cluster_id": ctx.cluster.cluster_id,
            "controller_id": -1,
            "brokers": [],
        }
    nodes = ctx.cluster.list_nodes()
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "error_message": None,
        "endpoint_type": _BROKER_ENDPOINTS,
        "cluster_id": ctx.cluster.cluster_id,
        "controller_id": _controller_id(nodes),
        "brokers": [{"broker_id": n.node_id, "host": n.host, "port": n.port, "rack": n.rack, "is_fenced": False} for n in nodes],
        # None: the codec's "not provided", INT32_MIN on the wire
        "authorized_operations": access.cluster_operations(ctx) if request.include_cluster_authorized_operations else None,
    }


class KnownTopics:
    """The topics this gateway last read for Metadata, by name: what it answers while it cannot
    read them. Only ever an answer of LEADER_NOT_AVAILABLE comes from here, never a leader."""

    def __init__(self) -> None:
        self._by_name: dict[str, topics.TopicMetadata] = {}

    def remember(self, found: list[topics.TopicMetadata], asked: list[str] | None) -> None:
        """``found``: the topics read for names ``asked`` (None: every topic, so the others are gone)."""
        if asked is None:
            self._by_name = {t.name: t for t in found}
            return
        for name in asked:
            self._by_name.pop(name, None)
        self._by_name.update((t.name, t) for t in found)

    def get(self, name: str | None, topic_id: uuid.UUID | None = None) -> topics.TopicMetadata | None:
        if name is not None:
            return self._by_name.get(name)
        return next((t for t in self._by_name.values() if t.topic_id == topic_id), None)

    def all(self) -> list[topics.TopicMetadata]:
        return [self._by_name[name] for name in sorted(self._by_name)]


def _unavailable(ctx: RequestContext, requested: list[Any] | None, refused: Mapping[str, Any]) -> list[dict]:
    """Metadata's topics while they cannot be read (see ``handle_metadata``), those the principal
    may not describe left out of a listing and refused when asked for."""
    known = ctx.known_topics
    if requested is None:
        return [_topic(ctx, t, unavailable=True) for t in known.all() if access.shows(ctx, Api.LIST_TOPICS, t.name)]
    answers = []
    for entry in requested:
        by_id = entry.name is None  # v10+ may ask by topic id
        topic = known.get(None, entry.topic_id) if by_id else known.get(entry.name)
        if entry.name in refused or (topic is not None and access.refused(ctx, Api.DESCRIBE_TOPIC, "topic", [topic.name])):
            answers.append(_refused(entry.name, entry.topic_id if by_id else ZERO_TOPIC_ID))
        elif topic is not None:
            answers.append(_topic(ctx, topic, unavailable=True))
        else:
            answers.append(
                {
                    "error_code": ErrorCode.LEADER_NOT_AVAILABLE.kafka_code,
                    "name": entry.name,
                    "topic_id": entry.topic_id if by_id else ZERO_TOPIC_ID,
                }
            )
    return answers


def _create_if_absent(broker: Broker, name: str, partitions: int) -> topics.TopicMetadata:
    """Create a topic for Metadata's auto-creation (or find the one another request created
    meanwhile): its metadata."""
    try:
        topics.create_topic(broker, name, partitions)
    except TxlogError as exc:
        if exc.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
            raise
    return topics.topics_metadata(broker, [name])[0]


def _broker(node: Node) -> dict:
    return {"node_id": node.node_id, "host": node.host, "port": node.port, "rack": node.rack}


def _topic(ctx: RequestContext, topic: topics.TopicMetadata, unavailable: bool = False) -> dict:
    """A topic's metadata; ``unavailable``: each partition LEADER_NOT_AVAILABLE (see ``handle_metadata``)."""
    name = topic.name
    answer = []
    # The read replicas follow every partition, in sync as far as their standby has replayed: each
    # partition's replicas and in-sync replicas, after its leader (KIP-392).
    followers = ctx.cluster.read_replicas()
    for partition in range(topic.partitions):
        leader = ctx.cluster.leader_of(name, partition).node_id
        replicas = [leader, *(node for node in followers if node != leader)]
        answer.append(
            {
                "error_code": ErrorCode.LEADER_NOT_AVAILABLE.kafka_code if unavailable else 0,
                "partition_index": partition,
                "leader_id": leader,
                "leader_epoch": LEADER_EPOCH,
                "replica_nodes": replicas,
                "isr_nodes": replicas,
                "offline_replicas": [],
            }
        )
    return {"error_code": 0, "name": name, "topic_id": topic.topic_id, "is_internal": False, "partitions": answer}


# -- FindCoordinator -----------------------------------------------------------------------------


async def handle_find_coordinator(ctx: RequestContext, request: Any) -> dict:
    """A group's coordinator is the node the cluster view assigns to the group; any node
    coordinates transactions, whose state lives in PostgreSQL under row locks: this one. v4 asks
    for several keys at once."""
    if ctx.api_version >= 4:
        return {
            "throttle_time_ms": 0,
            "coordinators": [_coordinator(ctx, request.key_type, key) for key in request.coordinator_keys],
        }
    answer = _coordinator(ctx, request.key_type, request.key)
    del answer["key"]
    return {"throttle_time_ms": 0, **answer}


def _coordinator(ctx: RequestContext, key_type: int, key: str) -> dict:
    api = {_COORDINATOR_GROUP: Api.FIND_GROUP_COORDINATOR, _COORDINATOR_TRANSACTION: Api.FIND_TRANSACTION_COORDINATOR}.get(
        key_type
    )
    refused = access.refused(ctx, api, "transactional_id" if key_type else "group", [key]) if api is not None else {}
    if refused:
        error = refused[key]
        return {
            "key": key,
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": error.code.kafka_code,
            "error_message": error.message,
        }
    if key_type == _COORDINATOR_GROUP:
        node = ctx.cluster.coordinator_of(key)
    elif key_type == _COORDINATOR_TRANSACTION:
        # A read replica coordinates no transaction: the gateway of the primary the rule names.
        node = ctx.cluster.coordinator_of(key) if ctx.replica is not None else ctx.node
    else:
        return {
            "key": key,
            "node_id": -1,
            "host": "",
            "port": -1,
            "error_code": ErrorCode.INVALID_REQUEST.kafka_code,
            "error_message": f"Coordinator type {key_type} is not served",
        }
    return {"key": key, "node_id": node.node_id, "host": node.host, "port": node.port, "error_code": 0, "error_message": None}
