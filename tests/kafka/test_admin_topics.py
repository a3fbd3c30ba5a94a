"""Topics deleted and configured through Kafka's admin APIs, against a real ``txlog kafka`` and a
real ``txlog serve`` on one database: DeleteTopics, DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs through confluent-kafka's ``AdminClient``, kafka-python's
``KafkaAdminClient``, aiokafka's admin client and raw frames; HTTP, the SQL tables and views, and
the wire agree afterwards.

- A deleted topic is gone from Metadata, HTTP, the views and the admin pages, with its records, aborted ranges,
  committed and pending group offsets and producer states; an open transaction that wrote to it is
  aborted on every partition (its records elsewhere never read_committed); the name can be created
  again and starts at offset 0. Records not yet deleted keep the name from being created again
  ("marked for deletion") until the sweeper's trim has them.
- Configs are Kafka's table: every topic config described with its source, read-only broker
  configs under Kafka's names, an unknown or invalid config INVALID_CONFIG (CreateTopics too),
  compaction refused, the incremental operations applied; the HTTP API sees each change.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest

from app.domain import topic_configs
from app.errors import ErrorCode
from app.services import retention, topics
from app.storage.db import libpq_url
from app.wire.kafka.messages import ApiKey
from tests.conftest import make_broker
from tests.kafka import test_agree
from tests.kafka.conftest import GatewayProcess
from tests.kafka.test_fetch import confluent_consume
from tests.support import wait_until

# The HTTP server and the gateway on one database, as test_agree.py has them.
agree_db, server, wire, http, ok = test_agree.agree_db, test_agree.server, test_agree.wire, test_agree.http, test_agree.ok
INVALID_CONFIG = ErrorCode.INVALID_CONFIG.kafka_code
UNKNOWN_TOPIC = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_code


def _name(what: str) -> str:
    return f"admin-{what}-{uuid.uuid4().hex[:8]}"


def _rows(url: str, sql: str, *params: Any) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def _counts(url: str, topic: str) -> dict[str, int]:
    """What the database still holds of ``topic``, table by table."""
    tables = (
        "records",
        "partitions",
        "aborted_txns",
        "group_offsets",
        "pending_group_offsets",
        "producer_partitions",
        "transaction_partitions",
        "deleted_partitions",
    )
    return {t: _rows(url, f"SELECT count(*) FROM txlog.{t} WHERE topic = %s", topic)[0][0] for t in tables}


def test_a_deleted_topic_is_gone_everywhere_with_what_refers_to_it(
    http: httpx.Client, wire: GatewayProcess, agree_db: str
) -> None:
    """Records of committed and aborted transactions, a group's committed offset and an open
    transaction over this topic and another: confluent-kafka's AdminClient deletes it; the open
    transaction is aborted on the other topic too; nothing of the topic is left; the name comes
    back empty."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    topic, other, group = _name("gone"), _name("other"), _name("group")
    for name in (topic, other):
        ok(http.post("/v1/topics", json={"name": name, "partitions": 2}))
    producer = Producer({"bootstrap.servers": wire.bootstrap, "transactional.id": _name("tx"), "linger.ms": 0})
    producer.init_transactions(30)
    for commit in (True, False):
        producer.begin_transaction()
        producer.produce(topic, b"decided", partition=0)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": wire.bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()
    # an open transaction, with a record on each topic and an offset of the group pending in it
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=1)
    producer.produce(other, b"open-elsewhere", partition=0)
    producer.flush(30)
    before = _counts(agree_db, topic)
    assert (
        before["records"] == 5
        and before["aborted_txns"] == 1
        and before["group_offsets"] == 1
        and before["producer_partitions"] == 2
    )

    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)

    assert _counts(agree_db, topic) == dict.fromkeys(before, 0)
    assert http.get(f"/v1/topics/{topic}").status_code == 404
    assert http.get(f"/admin/topics/{topic}").status_code == 404  # the admin pages
    assert topic not in {t["name"] for t in ok(http.get("/v1/topics"))["topics"]}
    assert topic not in admin.list_topics(timeout=30).topics
    assert _rows(agree_db, "SELECT count(*) FROM txlog.committed_records WHERE topic = %s", topic) == [(0,)]
    # the open transaction was aborted on the other topic too: read_committed sees nothing there,
    # and past its ABORT marker (the last stable offset moved on)
    assert confluent_consume(wire.bootstrap, other, 0, 0, 0, timeout=5, **{"isolation.level": "read_committed"}) == []
    status = ok(http.get(f"/v1/topics/{other}"))["partitions"][0]
    assert status["last_stable_offset"] == status["high_watermark"] == 2
    with pytest.raises(Exception) as fenced:
        producer.commit_transaction(30)
    assert "abort" in str(fenced.value).lower() or "fenced" in str(fenced.value).lower()
    # the name is free again, and starts over
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 1}))
    plain = Producer({"bootstrap.servers": wire.bootstrap})
    plain.produce(topic, b"again", partition=0)
    assert plain.flush(30) == 0
    assert [r.offset for r in confluent_consume(wire.bootstrap, topic, 0, 0, 1)] == [0]


def test_delete_topics_through_each_client_and_raw_frames(http: httpx.Client, wire: GatewayProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from kafka.admin import KafkaAdminClient
    from kafka.errors import UnknownTopicOrPartitionError

    by_kp, by_aio, by_name, by_id = (_name(w) for w in ("kp", "aio", "raw-name", "raw-id"))
    for name in (by_kp, by_aio, by_name, by_id):
        ok(http.post("/v1/topics", json={"name": name, "partitions": 1}))
    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        kp.delete_topics([by_kp], timeout_ms=30_000)
        with pytest.raises(UnknownTopicOrPartitionError):
            kp.delete_topics([by_kp], timeout_ms=30_000)
    finally:
        kp.close()

    async def aio() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=wire.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([by_aio], timeout_ms=30_000)
        finally:
            await admin.close()

    asyncio.run(aio())
    with wire.connect() as raw:
        (meta,) = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": by_id}]}).topics
        missing = uuid.uuid4()
        v6 = raw.request(
            ApiKey.DeleteTopics,
            6,
            {"topics": [{"name": None, "topic_id": meta.topic_id}, {"name": None, "topic_id": missing}], "timeout_ms": 30_000},
        ).responses
        assert [(r.name, r.topic_id, r.error_code) for r in v6] == [
            (by_id, meta.topic_id, 0),
            (None, missing, ErrorCode.UNKNOWN_TOPIC_ID.kafka_code),
        ]
        v1 = raw.request(ApiKey.DeleteTopics, 1, {"topic_names": [by_name, by_name + "-never"], "timeout_ms": 30_000}).responses
        assert [(r.name, r.error_code) for r in v1] == [(by_name, 0), (by_name + "-never", UNKNOWN_TOPIC)]
    names = {t["name"] for t in ok(http.get("/v1/topics"))["topics"]}
    assert not names & {by_kp, by_aio, by_name, by_id}


def test_records_left_to_delete_keep_the_name_until_the_sweeper_trims_them(
    http: httpx.Client, wire: GatewayProcess, agree_db: str
) -> None:
    """A deletion whose records were not all deleted within its timeout (here 0) answers at once;
    the name is "marked for deletion" over HTTP and the wire until the trim deletes them, a batch
    per database transaction. The partitions' trim locks are held meanwhile, so that the server's
    own sweeper cannot trim them first."""
    topic = _name("pending")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 2}))
    values = [{"value": f"v{i}"} for i in range(2500)]  # more than one trim batch
    for partition in (0, 1):
        ok(http.post(f"/v1/topics/{topic}/partitions/{partition}/records", json={"records": values}))
    broker = make_broker(agree_db)
    holder = psycopg.connect(libpq_url(agree_db), autocommit=True)
    try:
        for partition in (0, 1):  # the trim lock of storage.retention.log_trim and deleted_log_trim
            holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"txlog.log_trim/{topic}/{partition}",))
        deleted = topics.delete_topic(broker, topic, timeout_ms=0)
        assert deleted.records_pending and deleted.aborted_transactions == ()
        assert _counts(agree_db, topic)["deleted_partitions"] == 2
        refused = http.post("/v1/topics", json={"name": topic, "partitions": 1})
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "TOPIC_ALREADY_EXISTS")
        assert "marked for deletion" in refused.json()["error"]["message"]
        with wire.connect() as raw:
            (answer,) = raw.request(
                ApiKey.CreateTopics, 7, {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1}]}
            ).topics
        assert answer.error_code == ErrorCode.TOPIC_ALREADY_EXISTS.kafka_code
        report = retention.RetentionReport()
        retention.trim(broker, report, time.monotonic() + 1, deleted_topic=topic)
        assert report.records_deleted == 0 and _counts(agree_db, topic)["records"] == 5000  # locked: left alone
        holder.execute("SELECT pg_advisory_unlock_all()")
        retention.trim(broker, report, time.monotonic() + 60)  # this trim or the server's sweeper
        wait_until(lambda: _counts(agree_db, topic) == dict.fromkeys(_counts(agree_db, topic), 0), 60)
        assert report.failed == 0
    finally:
        holder.close()
        broker.db.dispose()
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 1}))


def test_http_delete_answers_what_it_did(http: httpx.Client) -> None:
    topic = _name("http")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 1}))
    deleted = ok(http.delete(f"/v1/topics/{topic}"))
    assert deleted["name"] == topic and deleted["aborted_transactions"] == [] and deleted["records_pending"] is False
    uuid.UUID(deleted["topic_id"])
    again = http.delete(f"/v1/topics/{topic}")
    assert (again.status_code, again.json()["error"]["code"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")


# --- configs -------------------------------------------------------------------------------------


def test_describe_configs_through_each_client(http: httpx.Client, wire: GatewayProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource as AioResource
    from aiokafka.admin.config_resource import ConfigResourceType as AioType
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import KafkaAdminClient

    topic = _name("describe")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {"retention.ms": 86_400_000}}))
    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    (configs,) = [f.result(30) for f in described.values()]
    assert set(configs) == {c.name for c in topic_configs.TOPIC_CONFIGS}
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
        "86400000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert (configs["retention.bytes"].value, configs["retention.bytes"].source) == ("-1", ConfigSource.DEFAULT_CONFIG.value)
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].value == "delete" and not configs["cleanup.policy"].is_read_only
    broker = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, str(wire.node_id))])
    (broker_configs,) = [f.result(30) for f in broker.values()]
    assert broker_configs["transaction.max.timeout.ms"].value == "900000"
    assert broker_configs["advertised.listeners"].value == f"PLAINTEXT://{wire.bootstrap}"
    assert broker_configs["auto.create.topics.enable"].value == "false"
    assert all(c.is_read_only for c in broker_configs.values())

    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        modified = kp.describe_configs([KpResource("TOPIC", topic)])
    finally:
        kp.close()
    assert "86400000" in repr(modified) and "retention.ms" in repr(modified)

    async def aio() -> Any:
        client = AIOKafkaAdminClient(bootstrap_servers=wire.bootstrap)
        await client.start()
        try:
            return await client.describe_configs([AioResource(AioType.TOPIC, topic, None)])
        finally:
            await client.close()

    (response,) = asyncio.run(aio())
    (resource,) = response.resources if hasattr(response, "resources") else response.results
    found = {c[0]: c[1] for c in resource[4]} if isinstance(resource, tuple) else {c.name: c.value for c in resource.configs}
    assert found["retention.ms"] == "86400000"


def test_alter_configs_each_way_and_http_sees_it(http: httpx.Client, wire: GatewayProcess) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import KafkaAdminClient

    topic = _name("alter")
    ok(http.post("/v1/topics", json={"name": topic, "partitions": 1, "config": {"retention.ms": 1000, "segment.ms": 5000}}))

    def config() -> dict:
        return ok(http.get(f"/v1/topics/{topic}"))["config"]

    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    incremental = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.bytes", "4096", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    for future in admin.incremental_alter_configs([incremental]).values():
        future.result(30)
    assert config() == {"retention.ms": 1000, "retention.bytes": 4096}
    # validate_only changes nothing; an invalid value is INVALID_CONFIG with Kafka's message
    dry = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("retention.ms", "5", incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([dry], validate_only=True).values():
        future.result(30)
    assert config()["retention.ms"] == 1000
    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(Exception) as refused:
        for future in admin.incremental_alter_configs([bad]).values():
            future.result(30)
    assert refused.value.args[0].code() == INVALID_CONFIG and "txlog supports only delete" in refused.value.args[0].str()

    # kafka-python's AlterConfigs: it gives the other modified keys along, since the request
    # replaces the whole set
    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        kp.alter_configs([KpResource("TOPIC", topic, configs={"retention.ms": "2000"})], incremental=False)
    finally:
        kp.close()
    assert config() == {"retention.ms": 2000, "retention.bytes": 4096}

    with wire.connect() as raw:

        def alter(
            version: int, configs: list[dict], api: int = ApiKey.IncrementalAlterConfigs, rtype: int = 2, name: str = topic
        ) -> tuple:
            (r,) = raw.request(
                api,
                version,
                {"resources": [{"resource_type": rtype, "resource_name": name, "configs": configs}], "validate_only": False},
            ).responses
            return r.error_code, r.error_message

        assert alter(1, [{"name": "no.such.config", "config_operation": 0, "value": "1"}]) == (
            INVALID_CONFIG,
            "Unknown topic config name: no.such.config",
        )
        assert (
            alter(1, [{"name": "retention.ms", "config_operation": 2, "value": "1"}])[0] == INVALID_CONFIG
        )  # APPEND: lists only
        assert alter(1, [{"name": "leader.replication.throttled.replicas", "config_operation": 2, "value": "0:0"}]) == (0, None)
        assert alter(1, [{"name": "retention.ms", "config_operation": 0, "value": "1"}], name="no-such-topic")[0] == UNKNOWN_TOPIC
        # AlterConfigs replaces the whole set: what is not given returns to its default
        assert alter(0, [{"name": "retention.ms", "value": "2000"}], api=ApiKey.AlterConfigs) == (0, None)
        assert config() == {"retention.ms": 2000}
        assert alter(0, [{"name": "retention.ms", "value": "x"}], api=ApiKey.AlterConfigs) == (
            INVALID_CONFIG,
            "Invalid value x for configuration retention.ms: Not a number of type LONG",
        )
        assert alter(1, [{"name": "num.partitions", "config_operation": 0, "value": "3"}], rtype=4, name="")[0] == (
            ErrorCode.INVALID_REQUEST.kafka_code
        )
    assert config() == {"retention.ms": 2000}
    # and HTTP's PATCH is checked against the same table
    patched = http.patch(f"/v1/topics/{topic}", json={"config": {"segment.bytes": 10}})
    assert (patched.status_code, patched.json()["error"]["code"]) == (400, "INVALID_CONFIG")
    assert "Value must be at least 1048576" in patched.json()["error"]["message"]


def test_create_topics_refuses_an_unknown_or_invalid_config(http: httpx.Client, wire: GatewayProcess) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    unknown, invalid, compact, good = (_name(w) for w in ("unknown", "invalid", "compact", "good"))
    admin = AdminClient({"bootstrap.servers": wire.bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(unknown, 1, config={"retention.mss": "1"}),
            NewTopic(invalid, 1, config={"min.insync.replicas": "0"}),
            NewTopic(compact, 1, config={"cleanup.policy": "compact"}),
            NewTopic(good, 1, config={"min.insync.replicas": "2", "compression.type": "zstd"}),
        ],
        operation_timeout=30,
    )
    errors = {}
    for name, future in futures.items():
        try:
            future.result(30)
        except Exception as exc:
            errors[name] = (exc.args[0].code(), exc.args[0].str())
    assert errors == {
        unknown: (KafkaError.INVALID_CONFIG, "Unknown topic config name: retention.mss"),
        invalid: (KafkaError.INVALID_CONFIG, "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1"),
        compact: (
            KafkaError.INVALID_CONFIG,
            "Invalid value compact for configuration cleanup.policy: txlog supports only delete, not compact",
        ),
    }
    assert ok(http.get(f"/v1/topics/{good}"))["config"] == {"min.insync.replicas": 2, "compression.type": "zstd"}
    names = {t["name"] for t in ok(http.get("/v1/topics"))["topics"]}
    assert good in names and not names & {unknown, invalid, compact}
    refused = http.post("/v1/topics", json={"name": unknown, "partitions": 1, "config": {"x": 1}})
    assert (refused.status_code, refused.json()["error"]["message"]) == (400, "Unknown topic config name: x")


def test_describe_topic_partitions_pages_through_kafka_python(http: httpx.Client, wire: GatewayProcess) -> None:
    """KIP-966's paged Metadata, as kafka-python's describe_topic_partitions sends it: the topics in
    name order, at most the limit of partitions a page, the cursor where the next starts."""
    from kafka.admin import KafkaAdminClient

    first, second = sorted(_name(w) for w in ("dtp-a", "dtp-b"))
    ok(http.post("/v1/topics", json={"name": first, "partitions": 3}))
    ok(http.post("/v1/topics", json={"name": second, "partitions": 2}))
    missing = first + "-missing"
    kp = KafkaAdminClient(bootstrap_servers=wire.bootstrap)
    try:
        page = kp.describe_topic_partitions([second, first, missing], response_partition_limit=4)
        assert [(t["name"], t["error_code"], [p["partition_index"] for p in t["partitions"]]) for t in page["topics"]] == [
            (first, 0, [0, 1, 2]),
            (missing, UNKNOWN_TOPIC, []),
            (second, 0, [0]),
        ]
        assert page["next_cursor"] == {"topic_name": second, "partition_index": 1}
        rest = kp.describe_topic_partitions([second, first], response_partition_limit=4, cursor=page["next_cursor"])
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in rest["topics"]] == [(second, [1])]
        assert rest["next_cursor"] is None
        p = page["topics"][0]["partitions"][0]
        assert (p["leader_id"], p["leader_epoch"], p["replica_nodes"], p["isr_nodes"]) == (
            wire.node_id,
            0,
            [wire.node_id],
            [wire.node_id],
        )
    finally:
        kp.close()
