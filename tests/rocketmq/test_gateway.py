"""The RocketMQ gateway with RocketMQ's own Python client, unmodified (``rocketmq-python-client``),
and with its generated stub for what the client never sends: normal messages routed and sent,
read back through txlog's SQL views with their tag, keys, properties and offsets; RocketMQ's
status codes for an unknown topic and bad input; the settings a client is answered."""

from __future__ import annotations

import gzip
import time
import uuid
from typing import Any, Iterator

import click
import grpc
import pytest
from sqlalchemy import text

from api.rocketmq.messages import KEYS_HEADER, MESSAGE_ID_HEADER, TAG_HEADER
from app.services import Broker
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import wait_until

# The client configures its own logging at import (a file under ~/logs) and brings OpenTelemetry.
rocketmq = pytest.importorskip("rocketmq")
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402

Code = definition_pb2.Code


def _records(store: Broker, topic: str) -> list[dict[str, Any]]:
    with store.db.read() as conn:
        rows = conn.execute(
            text(
                'SELECT partition, "offset", key, value, header_keys, header_values, "timestamp" '
                'FROM txlog.committed_records WHERE topic = :t ORDER BY partition, "offset"'
            ),
            {"t": topic},
        ).mappings()
        return [dict(r) for r in rows]


def _headers(record: dict[str, Any]) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in zip(record["header_keys"], record["header_values"])}


@pytest.fixture(scope="module")
def topic(store: Broker) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, name, 3)
    return name


@pytest.fixture(scope="module")
def producer(rocketmq_gateway: RocketMQGatewayProcess, topic: str) -> Iterator[Any]:
    config = rocketmq.ClientConfiguration(rocketmq_gateway.endpoints, rocketmq.Credentials(), request_timeout=10)
    p = rocketmq.Producer(config, (topic,))
    p.startup()
    yield p
    p.shutdown()


@pytest.fixture(scope="module")
def stub(rocketmq_gateway: RocketMQGatewayProcess) -> Iterator[Any]:
    with grpc.insecure_channel(rocketmq_gateway.endpoints) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


CLIENT = (("x-mq-client-id", "test-client@1"),)


def _message(topic: str, body: bytes = b"x", **system: Any) -> Any:
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=body)
    message.system_properties.message_id = system.pop("message_id", uuid.uuid4().hex.upper())
    message.system_properties.message_type = system.pop("message_type", definition_pb2.NORMAL)
    for name, value in system.items():
        setattr(message.system_properties, name, value)
    return message


def test_the_client_routes_and_sends_normal_messages_that_land_in_the_log(producer: Any, store: Broker, topic: str) -> None:
    receipts = []
    for i in range(6):
        message = rocketmq.Message()
        message.topic = topic
        message.body = f"order {i}".encode()
        message.tag = "created"
        message.keys = f"order-{i}"  # the client's setter adds a key to the message's set of keys
        message.keys = f"customer-{i % 2}"
        message.add_property("region", "eu-west")
        message.add_property("attempt", str(i))
        receipts.append(producer.send(message))

    records = _records(store, topic)
    assert len(records) == 6
    by_id = {_headers(r)[MESSAGE_ID_HEADER].decode(): r for r in records}
    assert set(by_id) == {r.message_id for r in receipts}
    # NORMAL messages are spread over the topic's partitions (the queues of its route)
    assert {r["partition"] for r in records} == {0, 1, 2}
    now_ms = time.time() * 1000
    for i, receipt in enumerate(receipts):
        record = by_id[receipt.message_id]
        assert record["value"] == f"order {i}".encode()
        assert record["key"] is None
        assert record["offset"] == receipt.offset
        assert abs(record["timestamp"].timestamp() * 1000 - now_ms) < 120_000  # the born timestamp
        headers = _headers(record)
        assert headers[TAG_HEADER] == b"created"
        assert set(headers[KEYS_HEADER].decode().split(" ")) == {f"order-{i}", f"customer-{i % 2}"}
        assert headers["region"] == b"eu-west"
        assert headers["attempt"] == str(i).encode()
    # offsets within a partition follow each other from 0
    for partition in {r["partition"] for r in records}:
        offsets = [r["offset"] for r in records if r["partition"] == partition]
        assert offsets == list(range(len(offsets)))


def test_an_unknown_topic_is_refused_with_topic_not_found(producer: Any, caplog: pytest.LogCaptureFixture) -> None:
    message = rocketmq.Message()
    message.topic = f"missing-{uuid.uuid4().hex[:8]}"
    message.body = b"lost"
    with pytest.raises(Exception, match=f"failed to fetch topic:{message.topic} route"):
        producer.send(message)
    # the client raises its own exception for a route it could not fetch, and logs the status
    # code it was answered (its NotFoundException's)
    assert any(f"{Code.TOPIC_NOT_FOUND}, Topic '{message.topic}' does not exist" in r.getMessage() for r in caplog.records)


def test_the_client_takes_the_gateways_settings_and_refuses_an_oversized_body_itself(
    producer: Any, store: Broker, topic: str
) -> None:
    # The producer sends its Settings on the Telemetry stream at start-up and takes the answer
    # when it comes (its publishing.max_body_size replaces the client's 4 MiB default).
    limit = store.settings.max_value_bytes
    wait_until(lambda: producer._Producer__max_body_size == limit, 30, 0.05, "the producer to take the gateway's settings")
    message = rocketmq.Message()
    message.topic = topic
    message.body = b"x" * (limit + 1)
    with pytest.raises(Exception, match=f"max size={limit}"):
        producer.send(message)


def test_query_route_names_each_partition_as_a_writable_queue_of_this_gateway(
    stub: Any, rocketmq_gateway: RocketMQGatewayProcess, topic: str
) -> None:
    answer = stub.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), metadata=CLIENT)
    assert answer.status.code == Code.OK
    assert [q.id for q in answer.message_queues] == [0, 1, 2]
    for queue in answer.message_queues:
        assert queue.permission == definition_pb2.READ_WRITE
        # a topic of RocketMQ 5's MIXED type
        assert list(queue.accept_message_types) == [
            definition_pb2.NORMAL,
            definition_pb2.FIFO,
            definition_pb2.DELAY,
            definition_pb2.TRANSACTION,
        ]
        assert queue.broker.id == 0
        assert [(a.host, a.port) for a in queue.broker.endpoints.addresses] == [("127.0.0.1", rocketmq_gateway.port)]
    missing = stub.QueryRoute(service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name="no-such-topic")), metadata=CLIENT)
    assert missing.status.code == Code.TOPIC_NOT_FOUND
    assert not missing.message_queues


def test_bad_sends_answer_rocketmq_status_codes_and_append_nothing(
    stub: Any, store: Broker, rocketmq_gateway: RocketMQGatewayProcess
) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, name, 1)
    limit = store.settings.max_value_bytes

    def send(message: Any) -> Any:
        return stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), metadata=CLIENT).status

    oversized = send(_message(name, b"x" * (limit + 1)))
    assert oversized.code == Code.MESSAGE_BODY_TOO_LARGE, oversized
    assert send(_message(name, b"")).code == Code.MESSAGE_BODY_EMPTY
    assert send(_message(name, message_id="")).code == Code.ILLEGAL_MESSAGE_ID
    assert send(_message(name, tag="a|b")).code == Code.ILLEGAL_MESSAGE_TAG
    reserved = _message(name)
    reserved.user_properties["UNIQ_KEY"] = "mine"
    assert send(reserved).code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    assert send(_message(name, message_type=definition_pb2.LITE)).code == Code.UNSUPPORTED
    assert send(_message(name, message_type=definition_pb2.FIFO, message_group=" ")).code == Code.ILLEGAL_MESSAGE_GROUP
    assert send(_message("no-such-topic")).code == Code.TOPIC_NOT_FOUND
    assert _records(store, name) == []
    # RPCs not served yet are gRPC's UNIMPLEMENTED, and the gateway lives on
    with pytest.raises(grpc.RpcError) as raised:
        stub.PullMessage(service_pb2.PullMessageRequest(), metadata=CLIENT).next()
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    ok = stub.SendMessage(service_pb2.SendMessageRequest(messages=[_message(name, b"fine")]), metadata=CLIENT)
    assert ok.status.code == Code.OK and ok.entries[0].offset == 0
    # a GZIP body lands inflated; one that does not inflate is MESSAGE_CORRUPTED
    compressed = _message(name, gzip.compress(b"inflated"), body_encoding=definition_pb2.GZIP)
    assert send(compressed).code == Code.OK
    assert send(_message(name, b"not gzip", body_encoding=definition_pb2.GZIP)).code == Code.MESSAGE_CORRUPTED
    assert [r["value"] for r in _records(store, name)] == [b"fine", b"inflated"]
    assert rocketmq_gateway.alive()


def test_telemetry_answers_a_producers_settings_as_the_broker_does(stub: Any, store: Broker) -> None:
    settings = definition_pb2.Settings(client_type=definition_pb2.PRODUCER)
    settings.publishing.topics.add(name="anything")
    settings.publishing.max_body_size = 128 * 1024 * 1024
    stream = stub.Telemetry(iter([service_pb2.TelemetryCommand(settings=settings)]), metadata=CLIENT)
    answer = next(stream)
    assert answer.status.code == Code.OK
    assert answer.settings.publishing.max_body_size == store.settings.max_value_bytes
    assert answer.settings.publishing.validate_message_type
    assert [t.name for t in answer.settings.publishing.topics] == ["anything"]
    assert answer.settings.backoff_policy.max_attempts == 3
    assert answer.settings.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert not answer.settings.metric.on
    stream.cancel()
    heartbeat = stub.Heartbeat(service_pb2.HeartbeatRequest(client_type=definition_pb2.PRODUCER), metadata=CLIENT)
    assert heartbeat.status.code == Code.OK
    assert stub.Heartbeat(service_pb2.HeartbeatRequest()).status.code == Code.CLIENT_ID_REQUIRED
    done = stub.NotifyClientTermination(service_pb2.NotifyClientTerminationRequest(), metadata=CLIENT)
    assert done.status.code == Code.OK


def test_every_rpc_of_the_service_is_served_or_named_unserved() -> None:
    from api.rocketmq.server import UNSERVED, MessagingService

    served = {"QueryRoute", "Heartbeat", "Telemetry", "NotifyClientTermination", "SendMessage", "EndTransaction"}
    served |= {"QueryAssignment", "ReceiveMessage", "AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"}
    methods = {m.name for m in service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods}
    assert methods == served | set(UNSERVED)
    assert not served & set(UNSERVED)
    for name in methods:
        assert getattr(MessagingService, name) is not getattr(service_pb2_grpc.MessagingServiceServicer, name), name


def test_the_gateway_refuses_to_start_where_it_would_let_clients_in_unchecked() -> None:
    from click.testing import CliRunner

    from app.cli.listeners import rocketmq_listener
    from app.cli.root import cli
    from app.config import Settings

    # With TXLOG_AUTH=token every call is signed (tests/rocketmq/test_auth.py): any address will do.
    assert rocketmq_listener(Settings.model_construct(rocketmq_listen="0.0.0.0:8081", auth="token"), False) == ("0.0.0.0", 8081)
    assert rocketmq_listener(Settings.model_construct(rocketmq_listen="127.0.0.1:8081", auth="none"), False) == (
        "127.0.0.1",
        8081,
    )
    assert rocketmq_listener(Settings.model_construct(rocketmq_listen="0.0.0.0:8081", auth="none"), True) == ("0.0.0.0", 8081)
    for listen, auth in (("0.0.0.0:8081", "none"), ("localhost", "none")):
        with pytest.raises(click.UsageError):
            rocketmq_listener(Settings.model_construct(rocketmq_listen=listen, auth=auth), False)
    # serve --rocketmq checks the same before it starts anything
    refused = CliRunner().invoke(
        cli, ["serve", "--rocketmq"], env={"TXLOG_ROCKETMQ_LISTEN": "0.0.0.0:18081", "TXLOG_AUTH": "none"}
    )
    assert refused.exit_code == 2 and "--insecure" in refused.output, refused.output
