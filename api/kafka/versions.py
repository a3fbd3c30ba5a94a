"""The one table of the API keys and versions the gateway serves.

It feeds both the dispatch (``server``) and the ApiVersions answer, so what is advertised cannot
drift from what is served: a key is listed here only once its handler exists, with the versions
that handler serves. Handlers are named as ``"module:function"`` and resolved when the gateway
starts (``resolve``), so that this module imports no handler and a missing one stops the start.

Each range is what its handler serves faithfully, not everything the codec knows: clients pick the
highest version both sides have, and several decide which features to use from these ranges
(librdkafka writes record batches v2 only when Produce >= 3 and Fetch >= 4 are both advertised,
and compresses only when Produce v0 is).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from app.wire.kafka.messages import ApiKey

Handler = Callable[[Any, Any], Awaitable[dict | None]]


@dataclass(frozen=True)
class Api:
    api_key: int
    min_version: int
    max_version: int
    handler: str  # "package.module:function"

    @property
    def name(self) -> str:
        return ApiKey(self.api_key).name

    def serves(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


_BOOTSTRAP = "api.kafka.handlers.bootstrap"
_FETCH = "api.kafka.handlers.fetch"
_GROUPS = "api.kafka.handlers.groups"
_OFFSETS = "api.kafka.handlers.offsets"
_TOPICS = "api.kafka.handlers.topics"

APIS: tuple[Api, ...] = (
    Api(
        ApiKey.Produce, 0, 12, "api.kafka.handlers.produce:handle_produce"
    ),  # min 0: KAFKA-18659; v0-2 refused; v11 TRANSACTION_ABORTABLE; v12 transactions V2; v13+ topic ids
    Api(
        ApiKey.Fetch, 4, 12, f"{_FETCH}:handle_fetch"
    ),  # with Produce >= 3, or librdkafka writes magic 0 batches; v13+ needs topic ids
    Api(ApiKey.ListOffsets, 1, 7, f"{_FETCH}:handle_list_offsets"),  # v8+: tiered storage
    Api(ApiKey.Metadata, 0, 12, f"{_BOOTSTRAP}:handle_metadata"),  # v10+ topic ids: the zero UUID
    Api(
        ApiKey.OffsetCommit, 2, 9, f"{_OFFSETS}:handle_offset_commit"
    ),  # v9: generation or member epoch (KIP-848); v10+ topic ids
    Api(ApiKey.OffsetFetch, 1, 9, f"{_OFFSETS}:handle_offset_fetch"),  # v7 require_stable; v8 several groups; v10+ topic ids
    Api(ApiKey.FindCoordinator, 0, 4, f"{_BOOTSTRAP}:handle_find_coordinator"),  # v4: batched keys
    Api(ApiKey.JoinGroup, 0, 9, f"{_GROUPS}:handle_join_group"),  # v4 MEMBER_ID_REQUIRED; v5 static members; v9 skip_assignment
    Api(ApiKey.Heartbeat, 0, 4, f"{_GROUPS}:handle_heartbeat"),
    Api(ApiKey.LeaveGroup, 0, 5, f"{_GROUPS}:handle_leave_group"),  # v3+: a batch of members
    Api(ApiKey.SyncGroup, 0, 5, f"{_GROUPS}:handle_sync_group"),  # v5: protocol type and name checked
    Api(ApiKey.DescribeGroups, 0, 6, f"{_GROUPS}:handle_describe_groups"),  # v6: GROUP_ID_NOT_FOUND
    Api(ApiKey.ListGroups, 0, 5, f"{_GROUPS}:handle_list_groups"),  # v4 states filter; v5 types filter
    Api(ApiKey.DeleteGroups, 0, 2, f"{_GROUPS}:handle_delete_groups"),
    Api(ApiKey.OffsetDelete, 0, 0, f"{_OFFSETS}:handle_offset_delete"),
    Api(ApiKey.ApiVersions, 0, 4, f"{_BOOTSTRAP}:handle_api_versions"),  # v3+: flexible, client software
    Api(ApiKey.SaslHandshake, 0, 1, "api.kafka.handlers.sasl:handle_sasl_handshake"),  # v0 advertised: librdkafka needs it
    Api(ApiKey.SaslAuthenticate, 0, 2, "api.kafka.handlers.sasl:handle_sasl_authenticate"),  # v1: session lifetime
    Api(ApiKey.CreateTopics, 2, 7, f"{_TOPICS}:handle_create_topics"),
    Api(ApiKey.CreatePartitions, 0, 3, f"{_TOPICS}:handle_create_partitions"),
    Api(ApiKey.DeleteTopics, 0, 6, f"{_TOPICS}:handle_delete_topics"),  # v6: by name or topic id
    Api(ApiKey.DescribeConfigs, 0, 4, f"{_TOPICS}:handle_describe_configs"),  # v1 synonyms; v3 type and documentation
    Api(ApiKey.AlterConfigs, 0, 2, f"{_TOPICS}:handle_alter_configs"),
    Api(ApiKey.IncrementalAlterConfigs, 0, 1, f"{_TOPICS}:handle_incremental_alter_configs"),
    Api(ApiKey.DeleteRecords, 0, 2, "api.kafka.handlers.logs:handle_delete_records"),  # never past the last stable offset
    Api(
        ApiKey.DescribeLogDirs, 0, 4, "api.kafka.handlers.logs:handle_describe_log_dirs"
    ),  # v4 volume bytes: -1; v5 cordoned dirs
    Api(
        ApiKey.OffsetForLeaderEpoch, 0, 4, "api.kafka.handlers.logs:handle_offset_for_leader_epoch"
    ),  # librdkafka validates positions with v2
    Api(ApiKey.DescribeTopicPartitions, 0, 0, f"{_BOOTSTRAP}:handle_describe_topic_partitions"),  # KIP-966: paged Metadata
    Api(ApiKey.DescribeCluster, 0, 2, f"{_BOOTSTRAP}:handle_describe_cluster"),  # v1 endpoint types; v2 fenced brokers
    Api(ApiKey.InitProducerId, 0, 5, "api.kafka.handlers.transactions:handle_init_producer_id"),  # v3+: KIP-360; v6: KIP-939
    Api(ApiKey.AddPartitionsToTxn, 0, 3, "api.kafka.handlers.transactions:handle_add_partitions_to_txn"),  # v4+: brokers only
    Api(ApiKey.AddOffsetsToTxn, 0, 4, "api.kafka.handlers.transactions:handle_add_offsets_to_txn"),
    Api(ApiKey.EndTxn, 0, 5, "api.kafka.handlers.transactions:handle_end_txn"),  # v4: TRANSACTION_ABORTABLE; v5: V2
    Api(
        ApiKey.TxnOffsetCommit, 0, 5, "api.kafka.handlers.transactions:handle_txn_offset_commit"
    ),  # v3+: KIP-447 fence; v5: V2; v6: topic ids
    Api(
        ApiKey.ListTransactions, 0, 2, "api.kafka.handlers.admin_transactions:handle_list_transactions"
    ),  # v1 duration; v2 id pattern
    Api(ApiKey.DescribeTransactions, 0, 0, "api.kafka.handlers.admin_transactions:handle_describe_transactions"),
    Api(ApiKey.DescribeProducers, 0, 0, "api.kafka.handlers.admin_transactions:handle_describe_producers"),
    Api(
        ApiKey.WriteTxnMarkers, 1, 1, "api.kafka.handlers.admin_transactions:handle_write_txn_markers"
    ),  # an operator's abort only
    Api(ApiKey.DescribeUserScramCredentials, 0, 0, "api.kafka.handlers.scram:handle_describe_user_scram_credentials"),
    Api(ApiKey.AlterUserScramCredentials, 0, 0, "api.kafka.handlers.scram:handle_alter_user_scram_credentials"),
    Api(ApiKey.DescribeClientQuotas, 0, 1, "api.kafka.handlers.quotas:handle_describe_client_quotas"),
    Api(ApiKey.AlterClientQuotas, 0, 1, "api.kafka.handlers.quotas:handle_alter_client_quotas"),  # user and client-id entities
    Api(
        ApiKey.DescribeAcls, 0, 3, "api.kafka.handlers.acls:handle_describe_acls"
    ),  # v1+ pattern types; SECURITY_DISABLED without ACLs
    Api(ApiKey.CreateAcls, 0, 3, "api.kafka.handlers.acls:handle_create_acls"),
    Api(ApiKey.DeleteAcls, 0, 3, "api.kafka.handlers.acls:handle_delete_acls"),
    Api(
        ApiKey.ShareGroupHeartbeat, 1, 1, "api.kafka.handlers.share_groups:handle_share_group_heartbeat"
    ),  # v0 was Kafka 4.0's preview
    Api(ApiKey.ShareGroupDescribe, 1, 1, "api.kafka.handlers.share_groups:handle_share_group_describe"),
    Api(ApiKey.ShareFetch, 1, 1, "api.kafka.handlers.share:handle_share_fetch"),  # long-polled; share sessions per gateway
    Api(ApiKey.ShareAcknowledge, 1, 1, "api.kafka.handlers.share:handle_share_acknowledge"),
    Api(ApiKey.DescribeShareGroupOffsets, 0, 0, "api.kafka.handlers.share_admin:handle_describe_share_group_offsets"),
    Api(
        ApiKey.AlterShareGroupOffsets, 0, 0, "api.kafka.handlers.share_admin:handle_alter_share_group_offsets"
    ),  # NON_EMPTY_GROUP with members
    Api(ApiKey.DeleteShareGroupOffsets, 0, 0, "api.kafka.handlers.share_admin:handle_delete_share_group_offsets"),
    Api(
        ApiKey.ConsumerGroupHeartbeat, 0, 1, "api.kafka.handlers.consumer_groups:handle_consumer_group_heartbeat"
    ),  # KIP-848; v1: regex subscriptions, the client's member ids
    Api(ApiKey.ConsumerGroupDescribe, 0, 1, "api.kafka.handlers.consumer_groups:handle_consumer_group_describe"),
)

BY_KEY: dict[int, Api] = {api.api_key: api for api in APIS}
assert len(BY_KEY) == len(APIS), "an API key is listed twice"


def advertised() -> list[tuple[int, int, int]]:
    """``(api_key, min_version, max_version)`` of every served API, by key: the ApiVersions answer."""
    return sorted((api.api_key, api.min_version, api.max_version) for api in APIS)


def lookup(api_key: int, version: int) -> Api | None:
    """The table's entry when it serves ``version`` of ``api_key``, else None."""
    api = BY_KEY.get(api_key)
    return api if api is not None and api.serves(version) else None


def resolve_handler(dotted: str) -> Handler:
    module, _, function = dotted.partition(":")
    if not module or not function:
        raise ValueError(f"a handler is named 'package.module:function', not {dotted!r}")
    handler = getattr(importlib.import_module(module), function, None)
    if handler is None or not callable(handler):
        raise ValueError(f"{module} has no handler {function!r}")
    return handler


def resolve(apis: tuple[Api, ...] = APIS) -> dict[int, tuple[Api, Handler]]:
    """Every entry with its handler function, by key (raises if one is missing)."""
    return {api.api_key: (api, resolve_handler(api.handler)) for api in apis}
