"""Every served API's answer while PostgreSQL is down, against what a Kafka broker answers when it
cannot reach its storage; and the same connection served again once PostgreSQL is back.

- Metadata keeps the brokers and the controller, the topics it knew with their partitions and
  leaders (each partition LEADER_NOT_AVAILABLE), any other topic LEADER_NOT_AVAILABLE;
- Produce, Fetch, ListOffsets, DeleteRecords and OffsetForLeaderEpoch: KAFKA_STORAGE_ERROR per
  partition (a log directory offline); DescribeLogDirs its one log directory KAFKA_STORAGE_ERROR;
- CreateTopics, CreatePartitions, DeleteTopics, the config APIs and the SCRAM credential APIs:
  REQUEST_TIMED_OUT per topic, resource or user (a controller that did not answer in time);
- reads of a group coordinator's state (OffsetFetch, DescribeGroups, ListGroups) and of the
  transaction coordinator's (ListTransactions, DescribeTransactions): COORDINATOR_LOAD_IN_PROGRESS,
  OffsetFetch v2-3's on every partition asked for too;
- DescribeProducers and WriteTxnMarkers: KAFKA_STORAGE_ERROR per partition (a partition's log);
- writes to the group and transaction coordinators: COORDINATOR_NOT_AVAILABLE;
- ApiVersions, DescribeCluster, FindCoordinator and the classic group membership, held in memory,
  go on answering; DescribeTopicPartitions answers as Metadata.

Each is retriable for every client; none is UNKNOWN_SERVER_ERROR, none closes the connection. The
table below covers every API key the gateway serves: a new one fails the test until its outage
answer is written here."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from api.kafka import versions
from app.errors import ErrorCode as E
from app.storage.embedded import EmbeddedPostgres
from app.wire.kafka.messages import ApiKey
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_fetch import fetch_body, list_offsets_body
from tests.kafka.test_groups import _commit_body, _join
from tests.kafka.test_transactions import batch, produce
from tests.support import wait_until

TOPIC, GROUP, TID, NODE = "outage", "outage-group", "outage-tx", 3
STORAGE, TIMED_OUT, COORDINATOR, LOADING, LEADER = (
    E.KAFKA_STORAGE_ERROR.kafka_code,
    E.REQUEST_TIMED_OUT.kafka_code,
    E.COORDINATOR_NOT_AVAILABLE.kafka_code,
    E.COORDINATOR_LOAD_IN_PROGRESS.kafka_code,
    E.LEADER_NOT_AVAILABLE.kafka_code,
)


@pytest.fixture
def stopped(
    own_postgres: EmbeddedPostgres, tmp_path: Path
) -> Iterator[tuple[EmbeddedPostgres, GatewayProcess, RawConnection, dict[str, Any]]]:
    """A gateway that has served a topic, a transactional producer and a group member, on a
    PostgreSQL now stopped in immediate mode."""
    pg = own_postgres
    gateway = GatewayProcess(pg.url, log_path=tmp_path / "gateway.log", node_id=NODE).start()
    try:
        with gateway.connect(timeout=30) as raw:
            created = raw.request(
                ApiKey.CreateTopics, 7, {"topics": [{"name": TOPIC, "num_partitions": 2, "replication_factor": 1}]}
            )
            assert created.topics[0].error_code == 0
            assert [
                p.error_code for p in raw.request(ApiKey.Metadata, 12, {"topics": [{"name": TOPIC}]}).topics[0].partitions
            ] == [0, 0]
            init = raw.request(
                ApiKey.InitProducerId,
                3,
                {"transactional_id": TID, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1},
            )
            assert init.error_code == 0
            joined = _join(raw, GROUP)
            state = {
                "pid": init.producer_id,
                "epoch": init.producer_epoch,
                "generation": joined.generation_id,
                "member": joined.member_id,
            }
            pg.kill()
            yield pg, gateway, raw, state
    finally:
        gateway.stop()


def _partitions(answer: Any, topics: str = "topics", partitions: str = "partitions", code: str = "error_code") -> list[int]:
    return [getattr(p, code) for t in getattr(answer, topics) for p in getattr(t, partitions)]


def _metadata(raw: RawConnection, s: dict) -> None:
    answer = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": TOPIC}, {"name": "never-seen"}]})
    assert [(b.node_id, b.port) for b in answer.brokers] == [(NODE, s["port"])]
    assert answer.controller_id == NODE
    known, unknown = answer.topics
    assert (known.name, known.error_code) == (TOPIC, 0)
    assert [(p.partition_index, p.error_code, p.leader_id) for p in known.partitions] == [(0, LEADER, NODE), (1, LEADER, NODE)]
    assert (unknown.name, unknown.error_code, unknown.partitions) == ("never-seen", LEADER, [])
    every = raw.request(ApiKey.Metadata, 1, {"topics": None})  # all topics: those it knew
    assert [(t.name, len(t.partitions)) for t in every.topics] == [(TOPIC, 2)] and every.controller_id == NODE


def _txn(s: dict) -> dict:
    return {"transactional_id": TID, "producer_id": s["pid"], "producer_epoch": s["epoch"]}


# API key -> a check of its answer while the database is down
OUTAGE: dict[int, Callable[[RawConnection, dict], None]] = {
    ApiKey.ApiVersions: lambda raw, s: assert_code(
        raw.request(ApiKey.ApiVersions, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code, 0
    ),
    ApiKey.Metadata: _metadata,
    # This gateway signs no one in (TXLOG_AUTH=none): answered from memory, as a listener without SASL.
    ApiKey.SaslHandshake: lambda raw, s: assert_code(
        raw.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code, E.ILLEGAL_SASL_STATE.kafka_code
    ),
    ApiKey.SaslAuthenticate: lambda raw, s: assert_code(
        raw.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": b"\x00a\x00b"}).error_code, E.ILLEGAL_SASL_STATE.kafka_code
    ),
    ApiKey.Produce: lambda raw, s: assert_code(produce(raw, TOPIC, 0, batch(-1, -1, -1, [b"v"]))[0], STORAGE),
    ApiKey.Fetch: lambda raw, s: assert_codes(
        _partitions(raw.request(ApiKey.Fetch, 12, fetch_body([(TOPIC, 0, 0), (TOPIC, 1, 0)])), "responses"), STORAGE
    ),
    ApiKey.ListOffsets: lambda raw, s: assert_codes(
        _partitions(raw.request(ApiKey.ListOffsets, 7, list_offsets_body([(TOPIC, 0, -1), (TOPIC, 1, -2)]))), STORAGE
    ),
    ApiKey.DeleteRecords: lambda raw, s: assert_codes(
        _partitions(
            raw.request(
                ApiKey.DeleteRecords,
                2,
                {"topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": -1}]}], "timeout_ms": 5000},
            )
        ),
        STORAGE,
    ),
    ApiKey.DescribeLogDirs: lambda raw, s: assert_codes(  # the log directory offline, no topics
        [(r.error_code, r.log_dir, r.topics) for r in raw.request(ApiKey.DescribeLogDirs, 4, {"topics": None}).results],
        (STORAGE, "/txlog", []),
    ),
    ApiKey.OffsetForLeaderEpoch: lambda raw, s: assert_codes(
        [
            (p.error_code, p.leader_epoch, p.end_offset)
            for t in raw.request(
                ApiKey.OffsetForLeaderEpoch,
                4,
                {
                    "replica_id": -1,
                    "topics": [
                        {
                            "topic": TOPIC,
                            "partitions": [
                                {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0},
                                {"partition": 1, "current_leader_epoch": -1, "leader_epoch": 0},
                            ],
                        }
                    ],
                },
            ).topics
            for p in t.partitions
        ],
        (STORAGE, -1, -1),
    ),
    ApiKey.CreateTopics: lambda raw, s: assert_codes(
        [
            t.error_code
            for t in raw.request(
                ApiKey.CreateTopics, 7, {"topics": [{"name": "created-while-away", "num_partitions": 1, "replication_factor": 1}]}
            ).topics
        ],
        TIMED_OUT,
    ),
    ApiKey.CreatePartitions: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.CreatePartitions,
                3,
                {"topics": [{"name": TOPIC, "count": 3, "assignments": None}], "timeout_ms": 5000, "validate_only": False},
            ).results
        ],
        TIMED_OUT,
    ),
    ApiKey.DeleteTopics: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.DeleteTopics, 6, {"topics": [{"name": TOPIC, "topic_id": uuid.UUID(int=0)}], "timeout_ms": 5000}
            ).responses
        ],
        TIMED_OUT,
    ),
    ApiKey.DescribeConfigs: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.DescribeConfigs,
                4,
                {
                    "resources": [{"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None}],
                    "include_synonyms": False,
                    "include_documentation": False,
                },
            ).results
        ],
        TIMED_OUT,
    ),
    ApiKey.AlterConfigs: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.AlterConfigs,
                2,
                {
                    "resources": [
                        {"resource_type": 2, "resource_name": TOPIC, "configs": [{"name": "retention.ms", "value": "1000"}]}
                    ],
                    "validate_only": False,
                },
            ).responses
        ],
        TIMED_OUT,
    ),
    ApiKey.IncrementalAlterConfigs: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.IncrementalAlterConfigs,
                1,
                {
                    "resources": [
                        {
                            "resource_type": 2,
                            "resource_name": TOPIC,
                            "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1000"}],
                        }
                    ],
                    "validate_only": False,
                },
            ).responses
        ],
        TIMED_OUT,
    ),
    ApiKey.DescribeClientQuotas: lambda raw, s: assert_code(
        raw.request(ApiKey.DescribeClientQuotas, 1, {"components": [], "strict": False}).error_code, TIMED_OUT
    ),
    ApiKey.AlterClientQuotas: lambda raw, s: assert_codes(
        [
            e.error_code
            for e in raw.request(
                ApiKey.AlterClientQuotas,
                1,
                {
                    "entries": [
                        {
                            "entity": [{"entity_type": "client-id", "entity_name": "app"}],
                            "ops": [{"key": "producer_byte_rate", "value": 1024.0, "remove": False}],
                        }
                    ],
                    "validate_only": False,
                },
            ).entries
        ],
        TIMED_OUT,
    ),
    ApiKey.OffsetCommit: lambda raw, s: assert_codes(
        _partitions(raw.request(ApiKey.OffsetCommit, 8, _commit_body(GROUP, [(TOPIC, 0, 1, "")], s["generation"], s["member"]))),
        COORDINATOR,
    ),
    ApiKey.OffsetFetch: lambda raw, s: (
        assert_codes(  # v8: the group's error, as Kafka answers it (librdkafka would take partitions' as final)
            [
                (g.error_code, g.topics)
                for g in raw.request(
                    ApiKey.OffsetFetch,
                    8,
                    {
                        "groups": [{"group_id": GROUP, "topics": [{"name": TOPIC, "partition_indexes": [0, 1]}]}],
                        "require_stable": True,
                    },
                ).groups
            ],
            (LOADING, []),
        ),
        assert_codes(  # v3, aiokafka's newest: on every partition asked for too
            [
                p.error_code
                for t in raw.request(
                    ApiKey.OffsetFetch, 3, {"group_id": GROUP, "topics": [{"name": TOPIC, "partition_indexes": [0, 1]}]}
                ).topics
                for p in t.partitions
            ],
            LOADING,
        ),
    ),
    ApiKey.FindCoordinator: lambda raw, s: assert_codes(
        [
            (c.error_code, c.node_id)
            for key_type, key in ((0, GROUP), (1, TID))  # a group's coordinator, a transactional id's
            for c in raw.request(ApiKey.FindCoordinator, 4, {"key_type": key_type, "coordinator_keys": [key]}).coordinators
        ],
        (0, NODE),
    ),
    ApiKey.JoinGroup: lambda raw, s: assert_code(
        raw.request(
            ApiKey.JoinGroup,
            5,
            {
                "group_id": GROUP,
                "session_timeout_ms": 10_000,
                "rebalance_timeout_ms": 10_000,
                "member_id": s["member"],
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        ).error_code,
        0,
    ),
    ApiKey.SyncGroup: lambda raw, s: assert_code(
        raw.request(
            ApiKey.SyncGroup,
            3,
            {
                "group_id": GROUP,
                "generation_id": s["generation"],
                "member_id": s["member"],
                "group_instance_id": None,
                "assignments": [{"member_id": s["member"], "assignment": b""}],
            },
        ).error_code,
        0,
    ),
    ApiKey.Heartbeat: lambda raw, s: assert_code(
        raw.request(
            ApiKey.Heartbeat,
            4,
            {"group_id": GROUP, "generation_id": s["generation"], "member_id": s["member"], "group_instance_id": None},
        ).error_code,
        0,
    ),
    ApiKey.DescribeGroups: lambda raw, s: assert_codes(
        [
            g.error_code
            for g in raw.request(ApiKey.DescribeGroups, 5, {"groups": [GROUP], "include_authorized_operations": False}).groups
        ],
        LOADING,
    ),
    ApiKey.ListGroups: lambda raw, s: assert_code(raw.request(ApiKey.ListGroups, 4, {"states_filter": []}).error_code, LOADING),
    ApiKey.DescribeTopicPartitions: lambda raw, s: assert_codes(  # as Metadata: known topics, their partitions unavailable
        [
            [
                (t.name, t.error_code, [p.error_code for p in t.partitions])
                for t in raw.request(
                    ApiKey.DescribeTopicPartitions,
                    0,
                    {"topics": [{"name": TOPIC}, {"name": "never-read"}], "response_partition_limit": 100, "cursor": None},
                ).topics
            ]
        ],
        [("never-read", LEADER, []), (TOPIC, 0, [LEADER, LEADER])],
    ),
    ApiKey.DescribeCluster: lambda raw, s: assert_codes(
        [
            (a.error_code, a.controller_id, [b.broker_id for b in a.brokers])
            for a in [raw.request(ApiKey.DescribeCluster, 0, {"include_cluster_authorized_operations": False})]
        ],
        (0, NODE, [NODE]),
    ),
    ApiKey.DeleteGroups: lambda raw, s: assert_codes(  # an Empty group's offsets cannot be deleted now
        [(r.group_id, r.error_code) for r in raw.request(ApiKey.DeleteGroups, 2, {"groups_names": ["offsets-only"]}).results],
        ("offsets-only", COORDINATOR),
    ),
    ApiKey.OffsetDelete: lambda raw, s: assert_code(
        raw.request(
            ApiKey.OffsetDelete, 0, {"group_id": GROUP, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}]}
        ).error_code,
        COORDINATOR,
    ),
    ApiKey.LeaveGroup: lambda raw, s: assert_codes(
        [
            m.error_code
            for m in raw.request(
                ApiKey.LeaveGroup, 3, {"group_id": GROUP, "members": [{"member_id": s["member"], "group_instance_id": None}]}
            ).members
        ],
        0,
    ),
    ApiKey.InitProducerId: lambda raw, s: assert_code(
        raw.request(
            ApiKey.InitProducerId,
            3,
            {"transactional_id": TID, "transaction_timeout_ms": 60_000, "producer_id": s["pid"], "producer_epoch": s["epoch"]},
        ).error_code,
        COORDINATOR,
    ),
    ApiKey.AddPartitionsToTxn: lambda raw, s: assert_codes(
        [
            r.partition_error_code
            for t in raw.request(
                ApiKey.AddPartitionsToTxn,
                3,
                {
                    "v3_and_below_transactional_id": TID,
                    "v3_and_below_producer_id": s["pid"],
                    "v3_and_below_producer_epoch": s["epoch"],
                    "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}],
                },
            ).results_by_topic_v3_and_below
            for r in t.results_by_partition
        ],
        COORDINATOR,
    ),
    ApiKey.AddOffsetsToTxn: lambda raw, s: assert_code(
        raw.request(ApiKey.AddOffsetsToTxn, 3, {**_txn(s), "group_id": GROUP}).error_code, COORDINATOR
    ),
    ApiKey.TxnOffsetCommit: lambda raw, s: assert_codes(
        _partitions(
            raw.request(
                ApiKey.TxnOffsetCommit,
                3,
                {
                    **_txn(s),
                    "group_id": GROUP,
                    "generation_id": -1,
                    "member_id": "",
                    "group_instance_id": None,
                    "topics": [
                        {
                            "name": TOPIC,
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "committed_offset": 1,
                                    "committed_leader_epoch": -1,
                                    "committed_metadata": "",
                                }
                            ],
                        }
                    ],
                },
            )
        ),
        COORDINATOR,
    ),
    ApiKey.EndTxn: lambda raw, s: assert_code(
        raw.request(ApiKey.EndTxn, 3, {**_txn(s), "committed": True}).error_code, COORDINATOR
    ),
    ApiKey.ListTransactions: lambda raw, s: assert_code(
        raw.request(
            ApiKey.ListTransactions,
            2,
            {"state_filters": [], "producer_id_filters": [], "duration_filter": -1, "transactional_id_pattern": None},
        ).error_code,
        LOADING,
    ),
    ApiKey.DescribeTransactions: lambda raw, s: assert_codes(
        [
            (t.transactional_id, t.error_code)
            for t in raw.request(ApiKey.DescribeTransactions, 0, {"transactional_ids": [TID]}).transaction_states
        ],
        (TID, LOADING),
    ),
    ApiKey.DescribeProducers: lambda raw, s: assert_codes(
        _partitions(raw.request(ApiKey.DescribeProducers, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0, 1]}]})), STORAGE
    ),
    ApiKey.WriteTxnMarkers: lambda raw, s: assert_codes(
        [
            p.error_code
            for m in raw.request(
                ApiKey.WriteTxnMarkers,
                1,
                {
                    "markers": [
                        {
                            "producer_id": s["pid"],
                            "producer_epoch": s["epoch"],
                            "transaction_result": False,
                            "coordinator_epoch": -1,
                            "topics": [{"name": TOPIC, "partition_indexes": [0]}],
                        }
                    ]
                },
            ).markers
            for t in m.topics
            for p in t.partitions
        ],
        STORAGE,
    ),
    ApiKey.DescribeUserScramCredentials: lambda raw, s: assert_code(
        raw.request(ApiKey.DescribeUserScramCredentials, 0, {"users": None}).error_code, TIMED_OUT
    ),
    ApiKey.AlterUserScramCredentials: lambda raw, s: _alter_outage(raw),  # per user
    # Without ACLs (this gateway's TXLOG_AUTH=none) the ACL APIs answer SECURITY_DISABLED from
    # memory; with them, REQUEST_TIMED_OUT while the database is away (tests/kafka/test_acls.py).
    ApiKey.DescribeAcls: lambda raw, s: assert_code(
        raw.request(
            ApiKey.DescribeAcls,
            3,
            {
                "resource_type_filter": 1,
                "resource_name_filter": None,
                "pattern_type_filter": 1,
                "principal_filter": None,
                "host_filter": None,
                "operation": 1,
                "permission_type": 1,
            },
        ).error_code,
        E.SECURITY_DISABLED.kafka_code,
    ),
    ApiKey.CreateAcls: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.CreateAcls,
                3,
                {
                    "creations": [
                        {
                            "resource_type": 2,
                            "resource_name": TOPIC,
                            "resource_pattern_type": 3,
                            "principal": "User:alice",
                            "host": "*",
                            "operation": 3,
                            "permission_type": 3,
                        }
                    ]
                },
            ).results
        ],
        E.SECURITY_DISABLED.kafka_code,
    ),
    ApiKey.DeleteAcls: lambda raw, s: assert_codes(
        [
            r.error_code
            for r in raw.request(
                ApiKey.DeleteAcls,
                3,
                {
                    "filters": [
                        {
                            "resource_type_filter": 1,
                            "resource_name_filter": None,
                            "pattern_type_filter": 1,
                            "principal_filter": None,
                            "host_filter": None,
                            "operation": 1,
                            "permission_type": 1,
                        }
                    ]
                },
            ).filter_results
        ],
        E.SECURITY_DISABLED.kafka_code,
    ),
    ApiKey.ShareGroupHeartbeat: lambda raw, s: assert_code(
        raw.request(
            ApiKey.ShareGroupHeartbeat,
            1,
            {
                "group_id": "outage-share",
                "member_id": "m" * 22,
                "member_epoch": 0,
                "rack_id": None,
                "subscribed_topic_names": [TOPIC],
            },
        ).error_code,
        COORDINATOR,
    ),
    ApiKey.ConsumerGroupHeartbeat: lambda raw, s: assert_code(
        raw.request(
            ApiKey.ConsumerGroupHeartbeat,
            1,
            {
                "group_id": "outage-consumer",
                "member_id": "m" * 22,
                "member_epoch": 0,
                "rebalance_timeout_ms": 5000,
                "subscribed_topic_names": [TOPIC],
                "topic_partitions": [],
            },
        ).error_code,
        COORDINATOR,
    ),
    ApiKey.ConsumerGroupDescribe: lambda raw, s: assert_codes(
        [
            g.error_code
            for g in raw.request(
                ApiKey.ConsumerGroupDescribe, 1, {"group_ids": ["outage-consumer"], "include_authorized_operations": False}
            ).groups
        ],
        LOADING,
    ),
    ApiKey.ShareGroupDescribe: lambda raw, s: assert_codes(
        [
            g.error_code
            for g in raw.request(
                ApiKey.ShareGroupDescribe, 1, {"group_ids": ["outage-share"], "include_authorized_operations": False}
            ).groups
        ],
        LOADING,
    ),
    ApiKey.ShareFetch: lambda raw, s: assert_code(
        raw.request(
            ApiKey.ShareFetch,
            1,
            {
                "group_id": "outage-share",
                "member_id": "m" * 22,
                "share_session_epoch": 0,
                "max_wait_ms": 0,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "max_records": 10,
                "batch_size": 10,
                "topics": [{"topic_id": uuid.uuid4(), "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}],
                "forgotten_topics_data": [],
            },
        ).error_code,
        STORAGE,
    ),
    ApiKey.ShareAcknowledge: lambda raw, s: assert_code(
        raw.request(
            ApiKey.ShareAcknowledge,
            1,
            {
                "group_id": "outage-share",
                "member_id": "m" * 22,
                "share_session_epoch": 1,  # the session ShareFetch opened
                "topics": [
                    {
                        "topic_id": uuid.uuid4(),
                        "partitions": [
                            {
                                "partition_index": 0,
                                "acknowledgement_batches": [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}],
                            }
                        ],
                    }
                ],
            },
        ).error_code,
        STORAGE,
    ),
    ApiKey.DescribeShareGroupOffsets: lambda raw, s: assert_code(
        raw.request(ApiKey.DescribeShareGroupOffsets, 0, {"groups": [{"group_id": "outage-share", "topics": None}]})
        .groups[0]
        .error_code,
        LOADING,
    ),
    ApiKey.AlterShareGroupOffsets: lambda raw, s: assert_code(
        raw.request(
            ApiKey.AlterShareGroupOffsets,
            0,
            {
                "group_id": "outage-share",
                "topics": [{"topic_name": TOPIC, "partitions": [{"partition_index": 0, "start_offset": 0}]}],
            },
        ).error_code,
        COORDINATOR,
    ),
    ApiKey.DeleteShareGroupOffsets: lambda raw, s: assert_code(
        raw.request(
            ApiKey.DeleteShareGroupOffsets, 0, {"group_id": "outage-share", "topics": [{"topic_name": TOPIC}]}
        ).error_code,
        COORDINATOR,
    ),
}


def assert_code(got: int, expected: int) -> None:
    assert got == expected, f"answered {E_NAMES.get(got, got)}, not {E_NAMES.get(expected, expected)}"


def _alter_outage(raw: RawConnection) -> None:
    results = raw.request(
        ApiKey.AlterUserScramCredentials,
        0,
        {
            "deletions": [{"name": "gone", "mechanism": 1}],
            "upsertions": [
                {"name": "outage-user", "mechanism": 2, "iterations": 4096, "salt": b"s", "salted_password": b"p" * 64}
            ],
        },
    ).results
    assert sorted((r.user, r.error_code) for r in results) == [("gone", TIMED_OUT), ("outage-user", TIMED_OUT)], results


def assert_codes(got: list, expected: Any) -> None:
    assert got and all(g == expected for g in got), f"answered {got}, not {expected} each"


E_NAMES = {code.kafka_code: code.name for code in E}


def test_the_outage_table_covers_every_served_api() -> None:
    assert set(OUTAGE) == set(versions.BY_KEY)


def test_every_api_answers_as_a_broker_whose_storage_is_away_and_serves_again_after(stopped) -> None:  # type: ignore[no-untyped-def]
    pg, gateway, raw, state = stopped
    state["port"] = gateway.port
    failed = []
    # the member joins again (a new generation) after its heartbeat and sync, and leaves last
    for api_key in sorted(OUTAGE, key=lambda k: (k in (ApiKey.JoinGroup, ApiKey.LeaveGroup), k == ApiKey.LeaveGroup, k)):
        try:
            OUTAGE[api_key](raw, state)
        except AssertionError as exc:
            failed.append(f"{ApiKey(api_key).name}: {exc}")
    assert not failed, "\n".join(failed)
    pg.start()
    assert produce(raw, TOPIC, 0, batch(-1, -1, -1, [b"after"])) == (0, 0)
    assert [p.error_code for p in raw.request(ApiKey.Metadata, 12, {"topics": [{"name": TOPIC}]}).topics[0].partitions] == [0, 0]
    assert (
        raw.request(
            ApiKey.InitProducerId,
            3,
            {
                "transactional_id": TID,
                "transaction_timeout_ms": 60_000,
                "producer_id": state["pid"],
                "producer_epoch": state["epoch"],
            },
        ).error_code
        == 0
    )


def test_a_gateway_started_while_its_database_is_away_waits_for_it(own_postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    """A gateway (or server) started during an outage or a failover waits for a writable database
    (TXLOG_STARTUP_DATABASE_WAIT_MS) rather than exiting, as a running one rides it out."""
    pg = own_postgres
    pg.kill()
    gateway = GatewayProcess(pg.url, log_path=tmp_path / "gateway.log")

    def database_back() -> None:
        wait_until(lambda: "waiting for the database" in gateway.log(), 60, 0.1, "the gateway to wait for the database")
        pg.start()

    back = threading.Thread(target=database_back)
    back.start()
    try:
        gateway.start(timeout=120)
        back.join()
        with gateway.connect() as conn:
            brokers = conn.request(ApiKey.Metadata, 12, {"topics": None}).brokers
        assert [b.node_id for b in brokers] == [0]
    finally:
        back.join()
        gateway.stop()
