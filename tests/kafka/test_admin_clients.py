"""The admin calls each client library makes, against a real ``txlog kafka`` and ``txlog serve`` on
one database: aiokafka's admin client (partitions, configs, cluster, groups and their offsets),
kafka-python's group calls (list with state filters, describe, list offsets, delete offsets while
subscribed or not, delete groups) and its incremental config change, and confluent-kafka's
whole-set config change; the HTTP API sees each result.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from tests.kafka import test_agree
from tests.kafka.conftest import GatewayProcess
from tests.support import wait_until

# The HTTP server and the gateway on one database, as test_agree.py has them.
agree_db, server, wire, http, ok = test_agree.agree_db, test_agree.server, test_agree.wire, test_agree.http, test_agree.ok


def _name(what: str) -> str:
    return f"clients-{what}-{uuid.uuid4().hex[:8]}"


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for a group with no members (a consumer that only assigns)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def test_aiokafka_admin_calls(http: httpx.Client, wire: GatewayProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    topic, group = _name("aio"), _name("aio-group")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 2}))
    _commit(wire.bootstrap, group, topic, {0: 3, 1: 4})

    async def run() -> dict[str, Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=wire.bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({topic: NewPartitions(3)})
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.ms": "3600000"})])
            return {
                "cluster": await admin.describe_cluster(),
                "groups": await admin.list_consumer_groups(),
                "described": await admin.describe_consumer_groups([group]),
                "offsets": await admin.list_consumer_group_offsets(group),
                "topics": await admin.list_topics(),
            }
        finally:
            await admin.close()

    got = asyncio.run(run())
    described = ok(http.get(f"/v1/topics/{topic}"))
    assert len(described["partitions"]) == 3 and described["config"] == {"retention.ms": 3_600_000}
    assert [b["node_id"] for b in got["cluster"]["brokers"]] == [wire.node_id]
    assert (group, "") in [tuple(g) for g in got["groups"]]
    assert topic in got["topics"]
    assert {(tp.partition, om.offset) for tp, om in got["offsets"].items()} == {(0, 3), (1, 4)}
    (response,) = got["described"]
    assert group in repr(response) and "Empty" in repr(response)


def test_kafka_python_group_and_config_calls(http: httpx.Client, wire: GatewayProcess) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentPartition
    from kafka.admin import AlterConfigOp, ConfigResource, KafkaAdminClient
    from kafka.errors import GroupSubscribedToTopicError, NoError

    from kafka import TopicPartition

    topic, members, offsets_only = _name("kp"), _name("kp-members"), _name("kp-offsets")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 2}))
    _commit(wire.bootstrap, offsets_only, topic, {0: 5, 1: 6})
    consumer = Consumer(
        {
            "bootstrap.servers": wire.bootstrap,
            "group.id": members,
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:

        def stable() -> bool:
            consumer.poll(0.2)
            return any(g["group_id"] == members for g in kp.list_groups(states_filter=["Stable"]))

        wait_until(stable, timeout=60)
        empty = {g["group_id"] for g in kp.list_groups(states_filter=["Empty"])}
        assert offsets_only in empty and members not in empty
        described = kp.describe_groups([members])[members]
        assert described["group_state"] == "Stable" and len(described["members"]) == 1
        listed = kp.list_group_offsets({offsets_only: None})
        assert {(tp.partition, om.offset) for tp, om in listed[offsets_only].items()} == {(0, 5), (1, 6)}
        # OffsetDelete: refused while the group's members subscribe the topic, done for one that does not
        consumer.commit(offsets=[ConfluentPartition(topic, 0, 1)], asynchronous=False)
        try:
            refused = kp.delete_group_offsets(members, [TopicPartition(topic, 0)])
        except GroupSubscribedToTopicError:
            refused = {TopicPartition(topic, 0): GroupSubscribedToTopicError}
        assert refused == {TopicPartition(topic, 0): GroupSubscribedToTopicError}
        assert kp.delete_group_offsets(offsets_only, [TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): NoError}
        assert [o["partition"] for o in ok(http.get(f"/v1/groups/{offsets_only}/offsets"))["offsets"]] == [1]
        kp.delete_groups([offsets_only])
        assert ok(http.get(f"/v1/groups/{offsets_only}/offsets"))["offsets"] == []
        # IncrementalAlterConfigs, as kafka-python sends it by default
        kp.alter_configs([ConfigResource("TOPIC", topic, configs={"retention.bytes": (AlterConfigOp.SET, "2048")})])
        assert ok(http.get(f"/v1/topics/{topic}"))["config"] == {"retention.bytes": 2048}
    finally:
        kp.close()
        consumer.close()


def test_confluent_kafka_whole_set_alter_configs(http: httpx.Client, wire: GatewayProcess) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    topic = _name("confluent")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {"retention.ms": 1000, "segment.ms": 5000}}))
    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.bytes": "4096"})
    with pytest.warns(DeprecationWarning, match="alter_configs"):  # still sent by applications written for it
        futures = admin.alter_configs([resource])
    for future in futures.values():
        future.result(30)
    assert ok(http.get(f"/v1/topics/{topic}"))["config"] == {"retention.bytes": 4096}  # the whole set replaced
