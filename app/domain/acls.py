"""ONE table of the operation each API needs on which resource (Kafka's ``KafkaApis``,
``AuthHelper``, ``AclApis``), and the checks that read it for a principal's decisions. The ACLs
themselves and the matching rules that decide are ``app.domain.acl_bindings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

from app.domain.acl_bindings import CLUSTER_NAME, WILDCARD, AclBinding, AclSet, Decisions, Operation, ResourceType


class Api(Enum):
    """The requests of txlog's two doors, named as Kafka's where Kafka has one. The HTTP routes name
    theirs in ``api.v1``; the Kafka gateway's API keys are mapped to theirs in ``KAFKA_APIS``."""

    CREATE_TOPICS = "CreateTopics"  # and Metadata's auto-creation
    LIST_TOPICS = "ListTopics"  # Metadata without topics
    DESCRIBE_TOPIC = "DescribeTopic"  # Metadata, ListOffsets, DescribeTopicPartitions
    ALTER_TOPIC_CONFIGS = "IncrementalAlterConfigs"  # and AlterConfigs, of a TOPIC resource
    ALTER_BROKER_CONFIGS = "AlterBrokerConfigs"  # AlterConfigs, IncrementalAlterConfigs of a BROKER resource
    DESCRIBE_TOPIC_CONFIGS = "DescribeConfigs"  # of a TOPIC resource; the configs CreateTopics answers
    DESCRIBE_BROKER_CONFIGS = "DescribeBrokerConfigs"  # DescribeConfigs of a BROKER resource
    CREATE_PARTITIONS = "CreatePartitions"
    DELETE_TOPICS = "DeleteTopics"
    DELETE_RECORDS = "DeleteRecords"
    PRODUCE = "Produce"  # plain; on the wire idempotent too (Kafka 3+, KIP-679)
    PRODUCE_IDEMPOTENT = "ProduceIdempotent"  # HTTP: producer id, no transactional id
    PRODUCE_TRANSACTIONAL = "ProduceTransactional"
    FETCH = "Fetch"
    OFFSET_FOR_LEADER_EPOCH = "OffsetForLeaderEpoch"
    INIT_PRODUCER_ID = "InitProducerId"  # HTTP, without a transactional id
    INIT_IDEMPOTENT_PRODUCER_ID = "InitProducerIdIdempotent"  # the wire, without a transactional id (KIP-679)
    INIT_TRANSACTIONAL_PRODUCER_ID = "InitProducerIdTransactional"
    ADD_PARTITIONS_TO_TXN = "AddPartitionsToTxn"
    ADD_OFFSETS_TO_TXN = "AddOffsetsToTxn"
    TXN_OFFSET_COMMIT = "TxnOffsetCommit"  # HTTP: with AddOffsetsToTxn, one request
    END_TXN = "EndTxn"
    WRITE_TXN_MARKERS = "WriteTxnMarkers"
    FIND_GROUP_COORDINATOR = "FindCoordinatorGroup"
    FIND_TRANSACTION_COORDINATOR = "FindCoordinatorTransaction"
    DESCRIBE_TRANSACTIONS = "DescribeTransactions"
    LIST_TRANSACTIONS = "ListTransactions"
    ABORT_TRANSACTION = "AbortTransaction"  # kafka-transactions.sh abort (by transactional id or partition)
    DESCRIBE_PRODUCERS = "DescribeProducersAll"  # HTTP: open transactions, find-hanging, a partition's producers
    DESCRIBE_TOPIC_PRODUCERS = "DescribeProducers"  # the wire: a topic's partitions' producers
    JOIN_GROUP = "JoinGroup"
    SYNC_GROUP = "SyncGroup"
    HEARTBEAT = "Heartbeat"
    LEAVE_GROUP = "LeaveGroup"
    OFFSET_COMMIT = "OffsetCommit"
    OFFSET_FETCH = "OffsetFetch"
    OFFSET_DELETE = "OffsetDelete"
    LIST_GROUPS = "ListGroups"
    DESCRIBE_GROUPS = "DescribeGroups"
    DELETE_GROUPS = "DeleteGroups"
    REGISTER_PRODUCER_GROUP = "RegisterProducerGroup"  # half messages' check-back endpoint
    DESCRIBE_PRODUCER_GROUP = "DescribeProducerGroup"
    SEND_HALF_MESSAGE = "SendHalfMessage"
    END_HALF_MESSAGE = "EndHalfMessage"  # commit or rollback
    DESCRIBE_HALF_MESSAGES = "DescribeHalfMessages"
    LIST_HALF_MESSAGES = "ListHalfMessages"
    DESCRIBE_ACLS = "DescribeAcls"  # and the principals
    ALTER_ACLS = "AlterAcls"  # CreateAcls, DeleteAcls, principals created and revoked
    DESCRIBE_CLUSTER = "DescribeCluster"  # HTTP: metrics, the admin pages (the wire checks nothing: KAFKA_APIS)
    DESCRIBE_LOG_DIRS = "DescribeLogDirs"
    DESCRIBE_USER_SCRAM_CREDENTIALS = "DescribeUserScramCredentials"
    ALTER_USER_SCRAM_CREDENTIALS = "AlterUserScramCredentials"
    DESCRIBE_CLIENT_QUOTAS = "DescribeClientQuotas"
    ALTER_CLIENT_QUOTAS = "AlterClientQuotas"
    SHARE_GROUP_HEARTBEAT = "ShareGroupHeartbeat"
    SHARE_FETCH = "ShareFetch"  # HTTP: acquire a share group's records
    DESCRIBE_SHARE_GROUP_OFFSETS = "DescribeShareGroupOffsets"
    ALTER_SHARE_GROUP_OFFSETS = "AlterShareGroupOffsets"
    DELETE_SHARE_GROUP_OFFSETS = "DeleteShareGroupOffsets"
    SHARE_ACKNOWLEDGE = "ShareAcknowledge"
    DESCRIBE_SHARE_GROUP = "ShareGroupDescribe"  # and its share partitions' in-flight records
    CONSUMER_GROUP_HEARTBEAT = "ConsumerGroupHeartbeat"
    DESCRIBE_CONSUMER_GROUP = "ConsumerGroupDescribe"
    ALTER_GROUP_CONFIGS = "AlterGroupConfigs"  # (Incremental)AlterConfigs of a GROUP resource (share.* configs)
    DESCRIBE_GROUP_CONFIGS = "DescribeGroupConfigs"  # DescribeConfigs of a GROUP resource
    UNCHECKED = "Unchecked"  # ApiVersions, SaslHandshake, SaslAuthenticate, the wire's DescribeCluster


# ``Check.name_from`` for "some resource of the type": Kafka's ``authorizeByResourceType``.
SOME = "*some*"


@dataclass(frozen=True)
class Check:
    """``operation`` on the resource of ``resource_type`` named by the request's ``name_from``
    (``topic``, ``topics``: each of several, ``group``, ``transactional_id``; None: the cluster;
    ``SOME``: any one resource of the type)."""

    resource_type: ResourceType
    operation: Operation
    name_from: str | None = None


def _on(rt: ResourceType, op: Operation, name_from: str | None) -> tuple[Check, ...]:
    return (Check(rt, op, name_from),)


T, G, X, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER
O = Operation

# Each API: a tuple of rules, each rule a tuple of checks of which one suffices. Every rule must pass;
# a rule refused is answered the error of its last check's resource type, as Kafka answers it.
# The rules are Kafka's (``KafkaApis``, ``AuthHelper``, ``AclApis``): the gateway checks a request's
# single names (its transactional id, its group) for the whole request, and each topic, and each
# group or transactional id of a request naming several, item by item (``request_denied``,
# ``item_denied``), answering Kafka's error in the item's place. The HTTP API, one resource per
# request, refuses the request (``check_api``).
REQUIRED: Mapping[Api, tuple[tuple[Check, ...], ...]] = {
    Api.CREATE_TOPICS: ((Check(C, O.CREATE), Check(T, O.CREATE, "topic")),),
    Api.LIST_TOPICS: (),
    Api.DESCRIBE_TOPIC: (_on(T, O.DESCRIBE, "topic"),),
    Api.ALTER_TOPIC_CONFIGS: (_on(T, O.ALTER_CONFIGS, "topic"),),
    Api.ALTER_BROKER_CONFIGS: (_on(C, O.ALTER_CONFIGS, None),),
    Api.DESCRIBE_TOPIC_CONFIGS: (_on(T, O.DESCRIBE_CONFIGS, "topic"),),
    Api.DESCRIBE_BROKER_CONFIGS: (_on(C, O.DESCRIBE_CONFIGS, None),),
    Api.CREATE_PARTITIONS: (_on(T, O.ALTER, "topic"),),
    Api.DELETE_TOPICS: (_on(T, O.DELETE, "topic"),),
    Api.DELETE_RECORDS: (_on(T, O.DELETE, "topic"),),
    Api.PRODUCE: (_on(T, O.WRITE, "topic"),),
    Api.PRODUCE_IDEMPOTENT: (_on(C, O.IDEMPOTENT_WRITE, None), _on(T, O.WRITE, "topic")),
    Api.PRODUCE_TRANSACTIONAL: (_on(X, O.WRITE, "transactional_id"), _on(T, O.WRITE, "topic")),
    Api.FETCH: (_on(T, O.READ, "topic"),),  # a follower's fetch (ClusterAction) is not served
    Api.OFFSET_FOR_LEADER_EPOCH: ((Check(C, O.CLUSTER_ACTION), Check(T, O.DESCRIBE, "topic")),),
    Api.INIT_PRODUCER_ID: (_on(C, O.IDEMPOTENT_WRITE, None),),
    Api.INIT_IDEMPOTENT_PRODUCER_ID: ((Check(T, O.WRITE, SOME), Check(C, O.IDEMPOTENT_WRITE)),),
    Api.INIT_TRANSACTIONAL_PRODUCER_ID: (_on(X, O.WRITE, "transactional_id"),),
    Api.ADD_PARTITIONS_TO_TXN: (_on(X, O.WRITE, "transactional_id"), _on(T, O.WRITE, "topics")),
    Api.ADD_OFFSETS_TO_TXN: (_on(X, O.WRITE, "transactional_id"), _on(G, O.READ, "group")),
    Api.TXN_OFFSET_COMMIT: (_on(X, O.WRITE, "transactional_id"), _on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    Api.END_TXN: (_on(X, O.WRITE, "transactional_id"),),
    Api.WRITE_TXN_MARKERS: (_on(C, O.CLUSTER_ACTION, None),),
    Api.FIND_GROUP_COORDINATOR: (_on(G, O.DESCRIBE, "group"),),
    Api.FIND_TRANSACTION_COORDINATOR: (_on(X, O.DESCRIBE, "transactional_id"),),
    Api.DESCRIBE_TRANSACTIONS: (_on(X, O.DESCRIBE, "transactional_id"),),
    Api.LIST_TRANSACTIONS: (),
    Api.ABORT_TRANSACTION: (_on(C, O.ALTER, None),),
    Api.DESCRIBE_PRODUCERS: (_on(C, O.DESCRIBE, None),),
    Api.DESCRIBE_TOPIC_PRODUCERS: (_on(T, O.READ, "topic"),),
    Api.JOIN_GROUP: (_on(G, O.READ, "group"),),
    Api.SYNC_GROUP: (_on(G, O.READ, "group"),),
    Api.HEARTBEAT: (_on(G, O.READ, "group"),),
    Api.LEAVE_GROUP: (_on(G, O.READ, "group"),),
    Api.OFFSET_COMMIT: (_on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    Api.OFFSET_FETCH: (_on(G, O.DESCRIBE, "group"),),
    Api.OFFSET_DELETE: (_on(G, O.DELETE, "group"), _on(T, O.READ, "topics")),
    Api.LIST_GROUPS: (),
    Api.DESCRIBE_GROUPS: (_on(G, O.DESCRIBE, "group"),),
    Api.DELETE_GROUPS: (_on(G, O.DELETE, "group"),),
    Api.REGISTER_PRODUCER_GROUP: (_on(G, O.ALTER, "group"),),
    Api.DESCRIBE_PRODUCER_GROUP: (_on(G, O.DESCRIBE, "group"),),
    Api.SEND_HALF_MESSAGE: (_on(T, O.WRITE, "topic"),),
    Api.END_HALF_MESSAGE: (_on(T, O.WRITE, "topic"),),
    Api.DESCRIBE_HALF_MESSAGES: (_on(T, O.READ, "topic"),),
    Api.LIST_HALF_MESSAGES: (),
    Api.DESCRIBE_ACLS: (_on(C, O.DESCRIBE, None),),
    Api.ALTER_ACLS: (_on(C, O.ALTER, None),),
    Api.DESCRIBE_CLUSTER: (_on(C, O.DESCRIBE, None),),
    Api.DESCRIBE_LOG_DIRS: (_on(C, O.DESCRIBE, None),),
    Api.DESCRIBE_USER_SCRAM_CREDENTIALS: (_on(C, O.DESCRIBE, None),),
    Api.ALTER_USER_SCRAM_CREDENTIALS: (_on(C, O.ALTER, None),),
    Api.DESCRIBE_CLIENT_QUOTAS: (_on(C, O.DESCRIBE_CONFIGS, None),),
    Api.ALTER_CLIENT_QUOTAS: (_on(C, O.ALTER_CONFIGS, None),),
    # Kafka's ShareGroupHeartbeat: Read on the group, Describe on each subscribed topic.
    Api.SHARE_GROUP_HEARTBEAT: (_on(G, O.READ, "group"), _on(T, O.DESCRIBE, "topics")),
    Api.SHARE_FETCH: (_on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    # Kafka's share-group offsets: Describe the group and each topic to describe; Read the group
    # and each topic to alter; Delete the group and Read each topic to delete.
    Api.DESCRIBE_SHARE_GROUP_OFFSETS: (_on(G, O.DESCRIBE, "group"), _on(T, O.DESCRIBE, "topics")),
    Api.ALTER_SHARE_GROUP_OFFSETS: (_on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    Api.DELETE_SHARE_GROUP_OFFSETS: (_on(G, O.DELETE, "group"), _on(T, O.READ, "topics")),
    Api.SHARE_ACKNOWLEDGE: (_on(G, O.READ, "group"), _on(T, O.READ, "topics")),
    Api.DESCRIBE_SHARE_GROUP: (_on(G, O.DESCRIBE, "group"),),
    # Kafka's ConsumerGroupHeartbeat: Read on the group, Describe on each subscribed topic name.
    Api.CONSUMER_GROUP_HEARTBEAT: (_on(G, O.READ, "group"), _on(T, O.DESCRIBE, "topics")),
    Api.DESCRIBE_CONSUMER_GROUP: (_on(G, O.DESCRIBE, "group"),),
    Api.ALTER_GROUP_CONFIGS: (_on(G, O.ALTER_CONFIGS, "group"),),
    Api.DESCRIBE_GROUP_CONFIGS: (_on(G, O.DESCRIBE_CONFIGS, "group"),),
    Api.UNCHECKED: (),
}


@dataclass(frozen=True)
class Shown:
    """What an item of an answer needs to be shown: ``operation`` on its resource of
    ``resource_type``, unless ``all_with`` passes (then every item is shown)."""

    resource_type: ResourceType
    operation: Operation
    all_with: Check | None = None


# Answers that show only the items the principal may see: each item needs this on its resource.
FILTERED: Mapping[Api, Shown] = {
    Api.LIST_TOPICS: Shown(T, O.DESCRIBE),  # Metadata of every topic, DescribeTopicPartitions of every topic
    Api.LIST_TRANSACTIONS: Shown(X, O.DESCRIBE),
    Api.LIST_GROUPS: Shown(G, O.DESCRIBE, all_with=Check(C, O.DESCRIBE)),
    Api.LIST_HALF_MESSAGES: Shown(T, O.READ),
    Api.OFFSET_FETCH: Shown(T, O.DESCRIBE),  # a group's offsets of the topics the principal may describe
    Api.DESCRIBE_TRANSACTIONS: Shown(T, O.DESCRIBE),  # a transaction's partitions
    Api.CREATE_TOPICS: Shown(T, O.DESCRIBE_CONFIGS),  # the configs of a created topic (else TOPIC_AUTHORIZATION_FAILED)
}

# Kafka's API keys by Kafka's name, each with the APIs of the table whose rules it reads (an API
# key served without an entry here is refused by a test: every served key reads this table).
KAFKA_APIS: Mapping[str, tuple[Api, ...]] = {
    "Produce": (Api.PRODUCE, Api.PRODUCE_TRANSACTIONAL),
    "Fetch": (Api.FETCH,),
    "ListOffsets": (Api.DESCRIBE_TOPIC,),
    "Metadata": (Api.DESCRIBE_TOPIC, Api.LIST_TOPICS, Api.CREATE_TOPICS),
    "OffsetCommit": (Api.OFFSET_COMMIT,),
    "OffsetFetch": (Api.OFFSET_FETCH,),
    "FindCoordinator": (Api.FIND_GROUP_COORDINATOR, Api.FIND_TRANSACTION_COORDINATOR),
    "JoinGroup": (Api.JOIN_GROUP,),
    "Heartbeat": (Api.HEARTBEAT,),
    "LeaveGroup": (Api.LEAVE_GROUP,),
    "SyncGroup": (Api.SYNC_GROUP,),
    "DescribeGroups": (Api.DESCRIBE_GROUPS,),
    "ListGroups": (Api.LIST_GROUPS,),
    "SaslHandshake": (Api.UNCHECKED,),
    "ApiVersions": (Api.UNCHECKED,),
    "CreateTopics": (Api.CREATE_TOPICS,),
    "DeleteTopics": (Api.DELETE_TOPICS,),
    "DeleteRecords": (Api.DELETE_RECORDS,),
    "InitProducerId": (Api.INIT_IDEMPOTENT_PRODUCER_ID, Api.INIT_TRANSACTIONAL_PRODUCER_ID),
    "OffsetForLeaderEpoch": (Api.OFFSET_FOR_LEADER_EPOCH,),
    "AddPartitionsToTxn": (Api.ADD_PARTITIONS_TO_TXN,),
    "AddOffsetsToTxn": (Api.ADD_OFFSETS_TO_TXN,),
    "EndTxn": (Api.END_TXN,),
    "WriteTxnMarkers": (Api.WRITE_TXN_MARKERS,),
    "TxnOffsetCommit": (Api.TXN_OFFSET_COMMIT,),
    "DescribeAcls": (Api.DESCRIBE_ACLS,),
    "CreateAcls": (Api.ALTER_ACLS,),
    "DeleteAcls": (Api.ALTER_ACLS,),
    "DescribeConfigs": (Api.DESCRIBE_TOPIC_CONFIGS, Api.DESCRIBE_BROKER_CONFIGS, Api.DESCRIBE_GROUP_CONFIGS),
    "AlterConfigs": (Api.ALTER_TOPIC_CONFIGS, Api.ALTER_BROKER_CONFIGS, Api.ALTER_GROUP_CONFIGS),
    "DescribeLogDirs": (Api.DESCRIBE_LOG_DIRS,),
    "SaslAuthenticate": (Api.UNCHECKED,),
    "CreatePartitions": (Api.CREATE_PARTITIONS,),
    "DeleteGroups": (Api.DELETE_GROUPS,),
    "IncrementalAlterConfigs": (Api.ALTER_TOPIC_CONFIGS, Api.ALTER_BROKER_CONFIGS, Api.ALTER_GROUP_CONFIGS),
    "OffsetDelete": (Api.OFFSET_DELETE,),
    "DescribeClientQuotas": (Api.DESCRIBE_CLIENT_QUOTAS,),
    "AlterClientQuotas": (Api.ALTER_CLIENT_QUOTAS,),
    "DescribeUserScramCredentials": (Api.DESCRIBE_USER_SCRAM_CREDENTIALS,),
    "AlterUserScramCredentials": (Api.ALTER_USER_SCRAM_CREDENTIALS,),
    # Kafka checks nothing for DescribeCluster: its brokers are Metadata's; only its cluster
    # authorized operations need Describe on the cluster (else 0).
    "DescribeCluster": (Api.UNCHECKED,),
    "DescribeProducers": (Api.DESCRIBE_TOPIC_PRODUCERS,),
    "ShareGroupHeartbeat": (Api.SHARE_GROUP_HEARTBEAT,),
    "ShareGroupDescribe": (Api.DESCRIBE_SHARE_GROUP,),
    "ShareFetch": (Api.SHARE_FETCH,),
    "ShareAcknowledge": (Api.SHARE_ACKNOWLEDGE,),
    "DescribeShareGroupOffsets": (Api.DESCRIBE_SHARE_GROUP_OFFSETS,),
    "AlterShareGroupOffsets": (Api.ALTER_SHARE_GROUP_OFFSETS,),
    "DeleteShareGroupOffsets": (Api.DELETE_SHARE_GROUP_OFFSETS,),
    "ConsumerGroupHeartbeat": (Api.CONSUMER_GROUP_HEARTBEAT,),
    "ConsumerGroupDescribe": (Api.DESCRIBE_CONSUMER_GROUP,),
    "DescribeTransactions": (Api.DESCRIBE_TRANSACTIONS,),
    "ListTransactions": (Api.LIST_TRANSACTIONS,),
    "DescribeTopicPartitions": (Api.DESCRIBE_TOPIC, Api.LIST_TOPICS),
}


def produce_api(producer_id: int | None, transactional_id: str | None) -> Api:
    """Which produce a batch is over HTTP: transactional, idempotent or plain."""
    if transactional_id is not None:
        return Api.PRODUCE_TRANSACTIONAL
    return Api.PRODUCE if producer_id is None else Api.PRODUCE_IDEMPOTENT


def init_producer_api(transactional_id: str | None) -> Api:
    return Api.INIT_PRODUCER_ID if transactional_id is None else Api.INIT_TRANSACTIONAL_PRODUCER_ID


def names_needed(api: Api) -> frozenset[str]:
    """The request names (``topic``, ``group``, …) ``api``'s checks read."""
    return frozenset(c.name_from for rule in REQUIRED[api] for c in rule if c.name_from not in (None, SOME))


@dataclass(frozen=True)
class Denied:
    """Why a request is refused: the check that failed, on the resource named."""

    check: Check
    name: str


def _names(check: Check, names: Mapping[str, str | Sequence[str] | None]) -> Sequence[str]:
    if check.name_from is None:
        return (CLUSTER_NAME,)
    value = names.get(check.name_from)
    if value is None:
        raise KeyError(f"the request names no {check.name_from}")
    return (value,) if isinstance(value, str) else value


def _rule_denied(decide: Decisions, rule: tuple[Check, ...], names: Mapping[str, str | Sequence[str] | None]) -> Denied | None:
    """None when one of the rule's checks passes for every name it reads, else the last refusal."""
    failed: Denied | None = None
    for check in rule:
        if check.name_from == SOME:
            if decide.allowed_some(check.operation, check.resource_type):
                return None
            failed = Denied(check, WILDCARD)
            continue
        refused = next((n for n in _names(check, names) if not decide.allowed(check.operation, check.resource_type, n)), None)
        if refused is None:
            return None
        failed = Denied(check, refused)
    return failed


def _reads(rule: tuple[Check, ...]) -> frozenset[str]:
    return frozenset(c.name_from for c in rule if c.name_from not in (None, SOME))


def denied(decide: Decisions, api: Api, names: Mapping[str, str | Sequence[str] | None]) -> Denied | None:
    """The first of ``api``'s rules ``decide`` refuses, every rule checked (each name it reads must be given)."""
    for rule in REQUIRED[api]:
        failed = _rule_denied(decide, rule, names)
        if failed is not None:
            return failed
    return None


def request_denied(decide: Decisions, api: Api, names: Mapping[str, str | None]) -> Denied | None:
    """The gateway's check of a whole request: the rules of ``api`` that read only the names given
    (and the cluster); the others are checked item by item (``item_denied``)."""
    given = {k for k, v in names.items() if v is not None}
    for rule in REQUIRED[api]:
        if _reads(rule) <= given:
            failed = _rule_denied(decide, rule, names)
            if failed is not None:
                return failed
    return None


def item_denied(decide: Decisions, api: Api, key: str, name: str) -> Denied | None:
    """The gateway's check of one item of a request (a topic, or one of several groups or
    transactional ids): the rules of ``api`` that read ``key`` (``topic`` and ``topics`` alike)."""
    keys = (key, key + "s")
    for rule in REQUIRED[api]:
        reads = _reads(rule)
        if reads and reads <= set(keys):
            failed = _rule_denied(decide, rule, {k: name for k in keys})
            if failed is not None:
                return failed
    return None


def check_api(acls: Sequence[AclBinding], api: Api, names: Mapping[str, str | Sequence[str] | None]) -> Denied | None:
    """None if ``acls`` (one principal's, ``*``'s included) allow the request, else what was refused."""
    return denied(AclSet(acls), api, names)


def shown(decide: Decisions, api: Api, name: str) -> bool:
    """May the principal see the item ``name`` of ``api``'s answer (``FILTERED``)?"""
    rule = FILTERED[api]
    if rule.all_with is not None and _rule_denied(decide, (rule.all_with,), {}) is None:
        return True
    return decide.allowed(rule.operation, rule.resource_type, name)
