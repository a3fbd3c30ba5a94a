"""The gateway's frame, dispatch and bootstrap APIs: the one version table, the codec adapter, and a
real ``txlog kafka`` process answering confluent-kafka (librdkafka), kafka-python and aiokafka,
plus raw frames for what no client sends on purpose."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import httpx
import pytest

from api.kafka import versions
from api.kafka.handlers import Node
from api.kafka.server import CloseConnection, Gateway
from app.config import Settings
from app.domain import topic_configs
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.error_responses import error_body
from app.wire.kafka.messages import ApiKey, has_codec
from app.wire.kafka.requests import FrameError, RequestHeader, decode_request
from app.wire.kafka.structs import build, decode_response, encode_request, encode_response
from tests.conftest import fresh_database
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.support import ROOT, free_port, wait_until

UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION.kafka_code


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


# -- the table and the codec ---------------------------------------------------------------------


def test_every_table_entry_resolves_to_a_coroutine_handler() -> None:
    routes = versions.resolve()
    assert set(routes) == {api.api_key for api in versions.APIS}
    for api, handler in routes.values():
        assert inspect.iscoroutinefunction(handler), api.handler
        assert 0 <= api.min_version <= api.max_version


def test_apiversions_answer_is_the_table() -> None:
    advertised = versions.advertised()
    assert advertised == sorted(advertised)
    assert {k for k, _, _ in advertised} == set(versions.BY_KEY)
    assert (ApiKey.ApiVersions, 0, 4) in advertised


@pytest.mark.parametrize("api", versions.APIS, ids=lambda api: api.name)
def test_every_served_version_decodes_and_answers(api: versions.Api) -> None:
    """Each version in the table: a request decodes, a handler-shaped dict and an error build a
    valid answer of that version."""
    for version in range(api.min_version, api.max_version + 1):
        assert has_codec(api.api_key, version)
        frame = encode_request(api.api_key, version, {}, correlation_id=version + 1, client_id="t")
        request = decode_request(frame[4:])
        assert request.header == RequestHeader(api.api_key, version, version + 1, "t")
        header = request.header
        for body in ({}, error_body(api.api_key, version, 42, "bad", request.body)):
            correlation_id, _answer = decode_response(api.api_key, version, encode_response(header, body)[4:])
            assert correlation_id == version + 1


def test_build_drops_fields_a_version_lacks_and_defaults_the_rest() -> None:
    body = {"throttle_time_ms": 5, "cluster_id": "c", "brokers": [{"node_id": 1, "host": "h", "port": 9, "rack": "r"}]}
    v0 = build(ApiKey.Metadata, 0, body)
    assert v0.brokers[0].node_id == 1 and v0.topics == []
    assert "throttle_time_ms" not in repr(v0) and "rack" not in repr(v0)
    v12 = build(ApiKey.Metadata, 12, body)
    assert (v12.throttle_time_ms, v12.cluster_id, v12.brokers[0].rack, v12.controller_id) == (5, "c", "r", -1)
    # Kafka's own names for the fields kafka-python renames are accepted, as Kafka's int32 bit set
    topic = build(ApiKey.Metadata, 12, {"topics": [{"name": "t", "topic_authorized_operations": 0b1100}]}).topics[0]
    assert topic.authorized_operations == {2, 3}
    with pytest.raises(ValueError, match="no field 'brokerz'"):
        build(ApiKey.Metadata, 12, {"brokerz": []})
    with pytest.raises(ValueError, match="expected a dict"):
        build(ApiKey.Metadata, 12, {"brokers": [1]})


def test_error_body_mirrors_the_request_where_there_is_no_top_level_error() -> None:
    produce = {
        "acks": -1,
        "timeout_ms": 100,
        "topic_data": [
            {"name": "a", "partition_data": [{"index": 0, "records": b""}, {"index": 2, "records": b""}]},
            {"name": "b", "partition_data": [{"index": 1, "records": None}]},
        ],
    }
    request = decode_request(encode_request(ApiKey.Produce, 9, produce)[4:]).body
    body = error_body(ApiKey.Produce, 9, 47, "fenced", request)
    assert body == {
        "responses": [
            {
                "name": "a",
                "partition_responses": [
                    {"index": 0, "error_code": 47, "record_errors": [], "error_message": "fenced"},
                    {"index": 2, "error_code": 47, "record_errors": [], "error_message": "fenced"},
                ],
            },
            {
                "name": "b",
                "partition_responses": [{"index": 1, "error_code": 47, "record_errors": [], "error_message": "fenced"}],
            },
        ]
    }
    # a top-level error code wins: FindCoordinator v3 has one, v4 answers per key
    assert error_body(ApiKey.FindCoordinator, 3, 15, "x") == {"error_code": 15, "error_message": "x"}
    keys = decode_request(encode_request(ApiKey.FindCoordinator, 4, {"key_type": 0, "coordinator_keys": ["g1", "g2"]})[4:]).body
    assert [c["key"] for c in error_body(ApiKey.FindCoordinator, 4, 15, None, keys)["coordinators"]] == ["g1", "g2"]
    # v0-3 of AddPartitionsToTxn name partitions as plain numbers
    add = decode_request(
        encode_request(
            ApiKey.AddPartitionsToTxn,
            3,
            {"v3_and_below_transactional_id": "t", "v3_and_below_topics": [{"name": "a", "partitions": [0, 4]}]},
        )[4:]
    ).body
    results = error_body(ApiKey.AddPartitionsToTxn, 3, 48, None, add)["results_by_topic_v3_and_below"]
    assert results == [
        {
            "name": "a",
            "results_by_partition": [
                {"partition_index": 0, "partition_error_code": 48},
                {"partition_index": 4, "partition_error_code": 48},
            ],
        }
    ]


def test_decode_request_refuses_what_does_not_decode() -> None:
    frame = encode_request(ApiKey.Metadata, 1, {"topics": [{"name": "orders"}]})[4:]
    assert decode_request(frame).body.topics[0].name == "orders"
    for bad in (frame[:9], frame[:-3], frame[:12]):  # shorter than a header, a name cut short, a header cut short
        with pytest.raises(FrameError):
            decode_request(bad)
    unknown = struct.pack(">hhih", 999, 0, 1, -1)
    with pytest.raises(FrameError, match="no codec"):
        decode_request(unknown)
    # librdkafka's Metadata v12 for every topic carries three bytes past the body; Kafka ignores them
    rdkafka = bytes.fromhex("0003000c00000003000772646b61666b610000000000010000")
    request = decode_request(rdkafka)
    assert request.header == RequestHeader(ApiKey.Metadata, 12, 3, "rdkafka")
    assert request.body.topics is None  # null: every topic, as the schema allows


@pytest.mark.parametrize("version", [3, 9])
def test_decode_request_refuses_a_null_the_schema_does_not_allow(version: int) -> None:
    """The generated decoder reads a length of -1 (or a compact 0) as null for any array or string;
    where the schema allows no null the frame is malformed, not a request for a handler to trip on."""
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [{"name": "t", "partition_data": []}]}
    frame = encode_request(ApiKey.Produce, version, body)[4:]
    assert decode_request(frame).body.topic_data[0].partition_data == []
    # the empty array is the body's last field (flexible versions then carry two empty tag sections)
    null = frame[:-4] + b"\xff\xff\xff\xff" if version < 9 else frame[:-3] + b"\x00" + frame[-2:]
    with pytest.raises(FrameError, match=r"partition_data is null"):
        decode_request(null)
    null_name = encode_request(ApiKey.Produce, version, {**body, "topic_data": [{"name": "t", "partition_data": []}]})[4:]
    name_at = null_name.index(b"\x00\x01t" if version < 9 else b"\x02t")
    null_name = null_name[:name_at] + (b"\xff\xff" if version < 9 else b"\x00") + null_name[name_at + (3 if version < 9 else 2) :]
    with pytest.raises(FrameError, match=r"name is null"):
        decode_request(null_name)


# -- dispatch, in process (handlers replaced) ----------------------------------------------------


@pytest.fixture
def dispatch() -> Gateway:
    return Gateway(types.SimpleNamespace(settings=Settings()), Node(0, "127.0.0.1", 9092))  # type: ignore[arg-type]


def answer(gateway: Gateway, api_key: int, version: int, body: dict) -> object:
    frame = encode_request(api_key, version, body, correlation_id=11)
    raw = asyncio.run(gateway.answer(frame[4:], "127.0.0.1:5000"))
    if raw is None:
        return None
    correlation_id, decoded = decode_response(api_key, version, raw[4:])
    assert correlation_id == 11
    return decoded


def replace_handler(
    gateway: Gateway, api_key: int, handler: versions.Handler, min_version: int = 0, max_version: int = 12
) -> None:
    gateway.routes[api_key] = (versions.Api(api_key, min_version, max_version, "tests:handler"), handler)


def test_a_handler_failure_is_answered(dispatch: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    async def refuses(ctx, request):  # type: ignore[no-untyped-def]
        raise TxlogError(ErrorCode.INVALID_TOPIC_EXCEPTION, "no such name")

    async def crashes(ctx, request):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    async def misspells(ctx, request):  # type: ignore[no-untyped-def]
        return {"topicz": []}

    async def forgets(ctx, request):  # type: ignore[no-untyped-def]
        return None

    request = {"topics": [{"name": "a"}, {"name": "b"}]}
    replace_handler(dispatch, ApiKey.Metadata, refuses)
    got = answer(dispatch, ApiKey.Metadata, 12, request)
    assert [(t.name, t.error_code) for t in got.topics] == [("a", 17), ("b", 17)]
    for handler in (crashes, misspells, forgets):
        replace_handler(dispatch, ApiKey.Metadata, handler)
        with caplog.at_level(logging.ERROR, logger="txlog.kafka"):
            got = answer(dispatch, ApiKey.Metadata, 12, request)
        assert [(t.name, t.error_code) for t in got.topics] == [("a", -1), ("b", -1)]
    assert "boom" in caplog.text and "topicz" in caplog.text


def test_produce_with_acks_0_is_never_answered(dispatch: Gateway) -> None:
    seen = []

    async def produce(ctx, request):  # type: ignore[no-untyped-def]
        seen.append(request.acks)
        if request.topic_data[0].name == "fails":
            raise TxlogError(ErrorCode.INVALID_PRODUCER_EPOCH)
        return (
            None
            if request.acks == 0
            else {"responses": [{"name": "ok", "partition_responses": [{"index": 0, "base_offset": 7}]}]}
        )

    replace_handler(dispatch, ApiKey.Produce, produce, 3, 10)
    body = {"acks": 0, "timeout_ms": 100, "topic_data": [{"name": "ok", "partition_data": [{"index": 0, "records": b""}]}]}
    assert answer(dispatch, ApiKey.Produce, 9, body) is None
    with pytest.raises(CloseConnection):  # a failed acks=0 produce closes the connection, as Kafka does
        answer(dispatch, ApiKey.Produce, 9, {**body, "topic_data": [{"name": "fails", "partition_data": []}]})
    got = answer(dispatch, ApiKey.Produce, 9, {**body, "acks": -1})
    assert got.responses[0].partition_responses[0].base_offset == 7
    failing = [{"name": "fails", "partition_data": [{"index": 3, "records": b""}]}]
    got = answer(dispatch, ApiKey.Produce, 9, {**body, "acks": 1, "topic_data": failing})
    assert [(p.index, p.error_code) for p in got.responses[0].partition_responses] == [(3, 47)]
    assert seen == [0, 0, -1, 1]


def test_versions_outside_the_table(dispatch: Gateway) -> None:
    # a served API at a version not served: UNSUPPORTED_VERSION where the answer has error codes
    got = answer(dispatch, ApiKey.CreateTopics, 1, {"topics": [{"name": "a", "num_partitions": 1, "replication_factor": 1}]})
    assert [(t.name, t.error_code) for t in got.topics] == [("a", UNSUPPORTED_VERSION)]
    assert "versions 2 to 7" in got.topics[0].error_message
    assert answer(dispatch, ApiKey.Metadata, 13, {"topics": None}).error_code == UNSUPPORTED_VERSION
    # an API not served at all, that the codec knows
    assert answer(dispatch, ApiKey.DescribeQuorum, 0, {"topics": []}).error_code == UNSUPPORTED_VERSION
    # a key nobody knows: the connection closes
    with pytest.raises(CloseConnection):
        asyncio.run(dispatch.answer(struct.pack(">hhih", 999, 0, 1, -1)))


# -- a real gateway, real clients ----------------------------------------------------------------


def confluent_topics(bootstrap: str, wanted: list[str]) -> dict[str, int]:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    assert [b.id for b in metadata.brokers.values()] == [0]
    return {name: len(metadata.topics[name].partitions) for name in wanted if name in metadata.topics}


def kafka_python_topics(bootstrap: str, wanted: list[str]) -> dict[str, int]:
    from kafka import KafkaAdminClient, KafkaConsumer

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kp-admin")
    try:
        listed = set(admin.list_topics())
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics([n for n in wanted if n in listed])}
        assert admin.describe_cluster()["brokers"][0]["port"] == int(bootstrap.rpartition(":")[2])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="kp-consumer")
    try:
        seen = consumer.topics()
        counted = {name: len(consumer.partitions_for_topic(name)) for name in wanted if name in seen}
    finally:
        consumer.close()
    assert counted == described
    return counted


def aiokafka_topics(bootstrap: str, wanted: list[str]) -> dict[str, int]:
    from aiokafka import AIOKafkaClient

    async def run() -> dict[str, int]:
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            metadata = await client.fetch_all_metadata()
            return {name: len(metadata.partitions_for_topic(name)) for name in wanted if name in metadata.topics()}
        finally:
            await client.close()

    return asyncio.run(run())


def test_three_clients_agree_on_topics_created_through_the_wire(gateway: GatewayProcess, topic_name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka.admin import NewTopic as KafkaNewTopic

    from kafka import KafkaAdminClient

    rdk = names(topic_name + "-rdk", 3)
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(rdk[0], num_partitions=3, replication_factor=1),
            NewTopic(
                rdk[1], num_partitions=1, replication_factor=3, config={"retention.ms": "3600000", "cleanup.policy": "delete"}
            ),
            NewTopic(rdk[2]),  # -1: the gateway's default (2 here)
        ],
        operation_timeout=10,
    )
    for future in futures.values():
        assert future.result(timeout=30) is None
    kp = f"{topic_name}-kp"
    client = KafkaAdminClient(bootstrap_servers=gateway.bootstrap)
    try:
        client.create_topics([KafkaNewTopic(kp, 4, 1)])
    finally:
        client.close()
    wanted = {rdk[0]: 3, rdk[1]: 1, rdk[2]: 2, kp: 4}
    assert confluent_topics(gateway.bootstrap, list(wanted)) == wanted
    assert kafka_python_topics(gateway.bootstrap, list(wanted)) == wanted
    assert aiokafka_topics(gateway.bootstrap, list(wanted)) == wanted
    # the topics are txlog's: the HTTP API's services see them
    with gateway.connect() as raw:
        created = raw.request(
            ApiKey.CreateTopics, 7, {"topics": [{"name": rdk[1], "num_partitions": 1, "replication_factor": 1}]}
        ).topics[0]
    assert created.error_code == ErrorCode.TOPIC_ALREADY_EXISTS.kafka_code


def test_create_topics_answers_each_topic(gateway: GatewayProcess, topic_name: str) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    good, dry = f"{topic_name}-good", f"{topic_name}-dry"
    futures = admin.create_topics(
        [
            NewTopic(good, 2),
            NewTopic("no spaces allowed", 1),
            NewTopic(f"{topic_name}-zero", 0, 1),
            NewTopic(f"{topic_name}-conf", 1, config={"retention.ms": "soon"}),
        ],
        operation_timeout=10,
    )
    errors = {}
    for name, future in futures.items():
        try:
            future.result(timeout=30)
        except Exception as exc:  # KafkaException carrying the topic's error
            errors[name] = exc.args[0].code()
    assert errors == {
        "no spaces allowed": KafkaError.TOPIC_EXCEPTION,
        f"{topic_name}-zero": KafkaError.INVALID_PARTITIONS,
        f"{topic_name}-conf": KafkaError.INVALID_CONFIG,
    }
    dry_run = admin.create_topics([NewTopic(dry, 3), NewTopic(good, 1)], validate_only=True, operation_timeout=10)
    assert dry_run[dry].result(timeout=30) is None
    with pytest.raises(Exception) as exists:
        dry_run[good].result(timeout=30)
    assert exists.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert confluent_topics(gateway.bootstrap, [good, dry]) == {good: 2}
    with gateway.connect() as raw:
        answered = raw.request(
            ApiKey.CreateTopics,
            7,
            {
                "topics": [
                    {"name": f"{topic_name}-twice", "num_partitions": 1, "replication_factor": -1},
                    {"name": f"{topic_name}-twice", "num_partitions": 1, "replication_factor": -1},
                    {"name": f"{topic_name}-rf0", "num_partitions": 1, "replication_factor": 0},
                    {
                        "name": f"{topic_name}-manual",
                        "num_partitions": -1,
                        "replication_factor": -1,
                        "assignments": [{"partition_index": i, "broker_ids": [0]} for i in range(3)],
                        "configs": [{"name": "retention.bytes", "value": "1000"}],
                    },
                ]
            },
        ).topics
    assert [(t.name, t.error_code) for t in answered] == [
        (f"{topic_name}-twice", ErrorCode.INVALID_REQUEST.kafka_code),
        (f"{topic_name}-twice", ErrorCode.INVALID_REQUEST.kafka_code),
        (f"{topic_name}-rf0", ErrorCode.INVALID_REPLICATION_FACTOR.kafka_code),
        (f"{topic_name}-manual", 0),
    ]
    manual = answered[3]
    assert (manual.num_partitions, manual.replication_factor) == (3, 1)
    # v7+ answers the created topic's id, the one Metadata gives; a refused topic has the zero id
    with gateway.connect() as raw:
        (described,) = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": f"{topic_name}-manual"}]}).topics
    assert manual.topic_id == described.topic_id != uuid.UUID(int=0)
    assert {t.topic_id for t in answered[:3]} == {None}  # the zero id, which the codec reads as None
    # v5+ lists every topic config, as DescribeConfigs: its own (DYNAMIC_TOPIC_CONFIG), a setting
    # the server was given (STATIC_BROKER_CONFIG), or the default (DEFAULT_CONFIG): the server's own
    # (log.retention.ms -1: keep everything) or Kafka's
    configs = {c.name: (c.value, c.config_source) for c in manual.configs}
    assert list(configs) == [c.name for c in topic_configs.TOPIC_CONFIGS]
    assert configs["retention.bytes"] == ("1000", 1)
    assert configs["retention.ms"] == ("-1", 5)
    assert configs["cleanup.policy"] == ("delete", 5)


def test_metadata_auto_creates_when_asked_and_allowed(gateway: GatewayProcess, topic_name: str, raw: RawConnection) -> None:
    created, refused, old, invalid = (f"{topic_name}-{s}" for s in ("auto", "refused", "v3", "bad"))
    got = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": created}, {"name": refused}], "allow_auto_topic_creation": True})
    assert [(t.name, t.error_code, len(t.partitions)) for t in got.topics] == [(created, 0, 2), (refused, 0, 2)]
    partition = got.topics[0].partitions[0]
    assert (partition.leader_id, partition.leader_epoch, partition.replica_nodes, partition.isr_nodes) == (0, 0, [0], [0])
    assert got.controller_id == 0 and got.cluster_id and [(b.node_id, b.port) for b in got.brokers] == [(0, gateway.port)]
    got = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": f"{refused}-no"}], "allow_auto_topic_creation": False})
    assert [(t.name, t.error_code) for t in got.topics] == [(f"{refused}-no", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_code)]
    got = raw.request(ApiKey.Metadata, 3, {"topics": [{"name": old}, {"name": "bad/name"}]})  # before v4: always allowed
    assert [(t.name, t.error_code) for t in got.topics] == [(old, 0), ("bad/name", ErrorCode.INVALID_TOPIC_EXCEPTION.kafka_code)]
    # null is every topic, empty is none (but empty is every topic in v0)
    every = {t.name for t in raw.request(ApiKey.Metadata, 12, {"topics": None}).topics}
    assert {created, refused, old} <= every and f"{refused}-no" not in every and invalid not in every
    assert raw.request(ApiKey.Metadata, 12, {"topics": []}).topics == []
    assert {t.name for t in raw.request(ApiKey.Metadata, 0, {"topics": []}).topics} == every
    # clients see the auto-created topics
    assert confluent_topics(gateway.bootstrap, [created, old]) == {created: 2, old: 2}


def test_metadata_by_topic_id(gateway: GatewayProcess, topic_name: str, raw: RawConnection) -> None:
    """v10+ may name a topic by its id: answered with its name; an id no topic has is UNKNOWN_TOPIC_ID."""
    raw.request(ApiKey.CreateTopics, 7, {"topics": [{"name": topic_name, "num_partitions": 2, "replication_factor": 1}]})
    (by_name,) = raw.request(ApiKey.Metadata, 12, {"topics": [{"name": topic_name}]}).topics
    assert by_name.topic_id != uuid.UUID(int=0)
    missing = uuid.uuid4()
    got = raw.request(
        ApiKey.Metadata, 12, {"topics": [{"name": None, "topic_id": by_name.topic_id}, {"name": None, "topic_id": missing}]}
    )
    assert [(t.name, t.topic_id, t.error_code, len(t.partitions)) for t in got.topics] == [
        (topic_name, by_name.topic_id, 0, 2),
        (None, missing, ErrorCode.UNKNOWN_TOPIC_ID.kafka_code, 0),
    ]


def test_metadata_without_auto_create(start_gateway, topic_name: str) -> None:  # type: ignore[no-untyped-def]
    g = start_gateway(kafka_auto_create_topics="false")
    with g.connect() as raw:
        for version in (1, 3, 12):
            got = raw.request(ApiKey.Metadata, version, {"topics": [{"name": topic_name}]})
            assert [(t.name, t.error_code) for t in got.topics] == [(topic_name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.kafka_code)]
        assert raw.request(ApiKey.Metadata, 12, {"topics": None}).topics == []
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=g.bootstrap)
    try:
        assert not consumer.partitions_for_topic(topic_name)
    finally:
        consumer.close()
    with g.connect() as raw:
        assert raw.request(ApiKey.Metadata, 12, {"topics": None}).topics == []


def test_apiversions_quirks(raw: RawConnection) -> None:
    advertised = [(k, lo, hi) for k, lo, hi in versions.advertised()]
    for version in range(0, 5):
        got = raw.request(ApiKey.ApiVersions, version, {"client_software_name": "raw-test", "client_software_version": "1.0"})
        assert got.error_code == 0
        assert [(k.api_key, k.min_version, k.max_version) for k in got.api_keys] == advertised
    # the header of the answer stays v0 even for the flexible v3: the body follows the correlation id
    correlation_id = raw.send(ApiKey.ApiVersions, 3, {"client_software_name": "raw", "client_software_version": "1"})
    frame = raw.read_frame()
    assert frame is not None and struct.unpack(">ih", frame[:6]) == (correlation_id, 0) and frame[6] == len(advertised) + 1
    # an unknown version, whatever its body: a v0 body with UNSUPPORTED_VERSION and the full list
    raw.send_bytes(_frame(struct.pack(">hhih", ApiKey.ApiVersions, 99, 4242, 3) + b"abc" + os.urandom(20)))
    frame = raw.read_frame()
    assert frame is not None
    correlation_id, got = decode_response(ApiKey.ApiVersions, 0, frame)
    assert (correlation_id, got.error_code) == (4242, UNSUPPORTED_VERSION)
    assert [(k.api_key, k.min_version, k.max_version) for k in got.api_keys] == advertised
    # v3+ client software must look like Kafka's rule; the error is a v0 body too
    raw.send(ApiKey.ApiVersions, 3, {"client_software_name": "bad name!", "client_software_version": "1"})
    frame = raw.read_frame()
    assert frame is not None
    got = decode_response(ApiKey.ApiVersions, 0, frame)[1]
    assert got.error_code == ErrorCode.INVALID_REQUEST.kafka_code and len(got.api_keys) == len(advertised)
    # the connection still serves
    assert raw.request(ApiKey.Metadata, 1, {"topics": []}).brokers[0].node_id == 0


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def test_find_coordinator(raw: RawConnection, gateway: GatewayProcess) -> None:
    for version in range(0, 4):
        got = raw.request(ApiKey.FindCoordinator, version, {"key": "group-1", "key_type": 0})
        assert (got.error_code, got.node_id, got.host, got.port) == (0, 0, "127.0.0.1", gateway.port)
    got = raw.request(ApiKey.FindCoordinator, 3, {"key": "txn-1", "key_type": 1})
    assert (got.error_code, got.node_id) == (0, 0)
    got = raw.request(ApiKey.FindCoordinator, 2, {"key": "x", "key_type": 7})
    assert (got.error_code, got.node_id) == (ErrorCode.INVALID_REQUEST.kafka_code, -1)
    got = raw.request(ApiKey.FindCoordinator, 4, {"key_type": 1, "coordinator_keys": ["t1", "t2"]})
    assert [(c.key, c.error_code, c.node_id, c.port) for c in got.coordinators] == [
        ("t1", 0, 0, gateway.port),
        ("t2", 0, 0, gateway.port),
    ]


def test_answers_leave_in_request_order(raw: RawConnection, topic_name: str) -> None:
    sent = [
        (ApiKey.ApiVersions, 3, {"client_software_name": "a", "client_software_version": "1"}),
        (ApiKey.Metadata, 12, {"topics": [{"name": topic_name}]}),  # auto-creates: the slowest
        (ApiKey.FindCoordinator, 4, {"key_type": 0, "coordinator_keys": ["g"]}),
        (ApiKey.Metadata, 1, {"topics": []}),
        (ApiKey.CreateTopics, 2, {"topics": [{"name": topic_name, "num_partitions": 1, "replication_factor": 1}]}),
        (ApiKey.ApiVersions, 99, {}),
        (ApiKey.ApiVersions, 0, {}),
    ]
    ids = []
    for api_key, version, body in sent:
        if version == 99:
            raw.correlation_id += 1
            raw.send_bytes(_frame(struct.pack(">hhih", api_key, version, raw.correlation_id, -1)))
            ids.append(raw.correlation_id)
        else:
            ids.append(raw.send(api_key, version, body))
    answers = []
    for api_key, version, _ in sent:
        frame = raw.read_frame()
        assert frame is not None
        answers.append(decode_response(api_key, 0 if version == 99 else version, frame))
    assert [correlation_id for correlation_id, _ in answers] == ids
    assert answers[1][1].topics[0].error_code == 0
    assert answers[4][1].topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS.kafka_code


def test_unserved_apis_are_answered_or_closed(raw: RawConnection, gateway: GatewayProcess) -> None:
    got = raw.request(ApiKey.ElectLeaders, 1, {"election_type": 0, "topic_partitions": None, "timeout_ms": 1000})
    assert got.error_code == UNSUPPORTED_VERSION
    got = raw.request(ApiKey.CreateTopics, 1, {"topics": [{"name": "never", "num_partitions": 1, "replication_factor": 1}]})
    assert [(t.name, t.error_code) for t in got.topics] == [("never", UNSUPPORTED_VERSION)]
    raw.send_bytes(_frame(struct.pack(">hhih", 999, 0, 77, -1)))
    assert raw.closed_by_peer()
    with gateway.connect() as again:  # only that connection
        assert again.request(ApiKey.Metadata, 1, {"topics": []}).controller_id == 0


def test_connection_cap(start_gateway) -> None:  # type: ignore[no-untyped-def]
    g = start_gateway(kafka_max_connections="2")

    def admitted(conn: RawConnection) -> bool:
        try:
            return conn.request(ApiKey.ApiVersions, 0).error_code == 0
        except (AssertionError, ConnectionError):
            conn.close()
            return False

    def connected() -> RawConnection | None:
        conn = g.connect()
        return conn if admitted(conn) else None

    # the readiness probe's connection may still count for a moment
    first = wait_until(connected, 10, 0.1, "a first connection")
    second = wait_until(connected, 10, 0.1, "a second connection")
    with g.connect() as third:
        assert third.closed_by_peer()
    assert admitted(second)  # the two admitted still serve
    first.close()
    wait_until(connected, 10, 0.1, "a connection to be admitted once another closed").close()
    second.close()


def test_sigterm_closes_connections_and_exits(start_gateway) -> None:  # type: ignore[no-untyped-def]
    g = start_gateway()
    idle = g.connect()
    assert idle.request(ApiKey.ApiVersions, 1).error_code == 0
    started = time.monotonic()
    assert g.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 10
    assert idle.closed_by_peer()
    idle.close()
    assert "Traceback" not in g.log()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )


def test_cli_refuses_an_open_listener() -> None:
    from app.cli.listeners import refuse_open_gateway

    run = run_cli("kafka", "--listen", "0.0.0.0:19092")
    assert run.returncode == 2
    assert "without authentication" in run.stderr and "--insecure" in run.stderr
    assert "TXLOG_AUTH=token" in run.stderr
    refuse_open_gateway("0.0.0.0:19092", "token", False)  # clients sign in: any address may be served
    run = run_cli("kafka", "--listen", "localhost")
    assert run.returncode == 2 and "HOST:PORT" in run.stderr
    run = run_cli("serve", "--kafka", env={"TXLOG_KAFKA_LISTEN": "0.0.0.0:19092"})
    assert run.returncode == 2 and "without authentication" in run.stderr


def test_serve_with_kafka_runs_both_on_one_database(pg_admin_url: str, template_db: str, tmp_path: Path, topic_name: str) -> None:
    http_port, kafka_port = free_port(), free_port()
    with fresh_database(pg_admin_url, template_db) as url:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
        environment.update({"TXLOG_DATABASE_URL": url, "TXLOG_KAFKA_LISTEN": f"127.0.0.1:{kafka_port}"})
        log = open(tmp_path / "serve.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(http_port), "--log-level", "warning", "--kafka"],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                try:
                    httpx.get(f"http://127.0.0.1:{http_port}/readyz", timeout=1).raise_for_status()
                    socket.create_connection(("127.0.0.1", kafka_port), timeout=1).close()
                except (httpx.HTTPError, OSError):
                    return False
                return True

            wait_until(ready, 60, 0.2, "serve and its gateway")
            with RawConnection(socket.create_connection(("127.0.0.1", kafka_port), timeout=10)) as raw:
                got = raw.request(
                    ApiKey.CreateTopics, 5, {"topics": [{"name": topic_name, "num_partitions": 3, "replication_factor": 1}]}
                )
                assert got.topics[0].error_code == 0
            listed = httpx.get(f"http://127.0.0.1:{http_port}/v1/topics", timeout=10).json()
            assert topic_name in str(listed)
        finally:
            proc.send_signal(signal.SIGTERM)  # serve alone: it stops its gateway
            assert proc.wait(timeout=30) in (0, 128 + signal.SIGTERM)
            log.close()
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", kafka_port)) != 0, "the gateway outlived serve"
