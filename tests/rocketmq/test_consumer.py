"""RocketMQ's simple consumer, unmodified (``rocketmq-python-client``), on txlog's share groups:
messages sent by a RocketMQ producer, a Kafka client and txlog's own services received and
acknowledged; invisible durations changed; a message not acknowledged delivered again when its
invisible time ends; two consumers of a group given disjoint messages; aborted Kafka
transactions never received; tag filters; the dead-letter topic; malformed receipt handles."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import grpc
import pytest

from api.rocketmq.consumers import DLQ_ORIGIN_MESSAGE_ID, DLQ_ORIGIN_TOPIC, DLQ_PREFIX
from app.domain.records import NewRecord
from app.domain.share_partition import RecordState
from app.services import Broker, fetch, produce, share_admin, share_configs
from app.services import topics as topic_service
from spark.reader import read_topic
from tests.kafka.conftest import GatewayProcess
from tests.rocketmq.conftest import RocketMQGatewayProcess, all_done, send
from tests.support import ServerProcess, wait_until

rocketmq = pytest.importorskip("rocketmq")
confluent_kafka = pytest.importorskip("confluent_kafka")
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from rocketmq.v5.exception import BadRequestException  # noqa: E402

Code = definition_pb2.Code
CLIENT = (("x-mq-client-id", "test-consumer@1"),)
AWAIT_S = 3  # the consumers' long-polling timeout: how long a receive that finds nothing takes


@pytest.fixture(scope="module")
def kafka_gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A Kafka gateway on the RocketMQ gateway's database: the other door to the same log."""
    g = GatewayProcess(rocketmq_db, log_path=tmp_path_factory.mktemp("kafka") / "gateway.log").start()
    yield g
    assert g.stop() == 0, g.log()


@pytest.fixture(scope="module")
def stub(rocketmq_gateway: RocketMQGatewayProcess) -> Iterator[Any]:
    with grpc.insecure_channel(rocketmq_gateway.endpoints) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


@pytest.fixture
def consumers(rocketmq_gateway: RocketMQGatewayProcess) -> Iterator[Callable[..., Any]]:
    started: list[Any] = []

    def start(group: str, topic: str, expression: str = "*") -> Any:
        config = rocketmq.ClientConfiguration(rocketmq_gateway.endpoints, rocketmq.Credentials(), request_timeout=10)
        c = rocketmq.SimpleConsumer(config, group, {topic: rocketmq.FilterExpression(expression)}, await_duration=AWAIT_S)
        c.startup()
        started.append(c)
        return c

    yield start
    for c in started:
        c.shutdown()


@pytest.fixture(scope="module")
def producer(rocketmq_gateway: RocketMQGatewayProcess) -> Iterator[Any]:
    config = rocketmq.ClientConfiguration(rocketmq_gateway.endpoints, rocketmq.Credentials(), request_timeout=10)
    p = rocketmq.Producer(config)
    p.startup()
    yield p
    p.shutdown()


def _receive_all(consumer: Any, expected: int, invisible_s: int = 30, batch: int = 16) -> list[Any]:
    """Receive until ``expected`` messages came (each receive long-polls: no sleeps)."""
    got: list[Any] = []
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        got.extend(consumer.receive(batch, invisible_s))
    return got


def _in_flight(store: Broker, group: str, topic: str) -> list[Any]:
    parts = [p for p in share_admin.describe(store, group).partitions if p.topic == topic]
    return [r for p in parts for r in p.in_flight]


def test_messages_from_every_door_are_received_and_acknowledged(
    producer: Any, kafka_gateway: GatewayProcess, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(), make_group()
    sent = {send(producer, topic, b"from rocketmq", tag="created")}
    kafka = confluent_kafka.Producer({"bootstrap.servers": kafka_gateway.bootstrap})
    kafka.produce(topic, value=b"from kafka", key=b"k", headers=[("TAGS", b"created"), ("region", b"eu")])
    assert kafka.flush(30) == 0
    produce.produce_to_topic(store, topic, [NewRecord(None, b"from txlog", (("KEYS", b"a b"),))])

    consumer = consumers(group, topic)
    got = _receive_all(consumer, 3)
    by_body = {m.body: m for m in got}
    assert set(by_body) == {b"from rocketmq", b"from kafka", b"from txlog"}
    assert by_body[b"from rocketmq"].message_id in sent
    assert by_body[b"from kafka"].tag == "created" and by_body[b"from kafka"].properties == {"region": "eu"}
    assert by_body[b"from txlog"].keys == {"a", "b"}
    assert all(m.delivery_attempt == 1 for m in got)
    for m in got:
        consumer.ack(m)
    assert all_done(store, group, topic)
    assert consumer.receive(16, 30) == []  # nothing left, nothing delivered again


def test_a_rocketmq_message_is_read_by_a_kafka_consumer_over_http_and_by_spark_with_its_tag_keys_and_properties(
    producer: Any, kafka_gateway: GatewayProcess, rocketmq_db: str, make_topic: Any, tmp_path: Any, spark: Any
) -> None:
    """One log, every door: what a RocketMQ producer sends, a Kafka consumer (read_committed), the
    HTTP API and Spark (over JDBC, from ``txlog.committed_records``) read as the same record, the
    tag, keys and properties as headers."""
    topic = make_topic(1)
    message = rocketmq.Message()
    message.topic = topic
    message.body = b"order 7"
    message.tag = "created"
    message.keys = "order-7"
    message.add_property("region", "eu-west")
    message_id = str(producer.send(message).message_id)
    expected = {"TAGS": b"created", "KEYS": b"order-7", "UNIQ_KEY": message_id.encode(), "region": b"eu-west"}

    kafka = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kafka_gateway.bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    try:
        kafka.subscribe([topic])
        got = None
        deadline = time.monotonic() + 60
        while got is None and time.monotonic() < deadline:
            m = kafka.poll(1)
            if m is not None and m.error() is None:
                got = m
    finally:
        kafka.close()
    assert got is not None, "the Kafka consumer read nothing"
    assert (got.value(), got.key(), got.offset()) == (b"order 7", None, 0)
    assert dict(got.headers() or []) == expected

    with ServerProcess(rocketmq_db, log_path=tmp_path / "server.log") as server, server.client() as api:
        answer = api.get(f"/v1/topics/{topic}/partitions/0/records", params={"isolation_level": "read_committed"})
    assert answer.status_code == 200, answer.text
    [record] = answer.json()["records"]
    assert (record["offset"], record["value"]) == (0, "order 7")
    assert {k: v.encode() for k, v in record["headers"].items()} == expected

    [row] = read_topic(spark, rocketmq_db, topic).collect()
    assert (row["partition"], row["offset"], row["key"], bytes(row["value"])) == (0, 0, None, b"order 7")
    assert {k: v.encode() for k, v in json.loads(row["headers"]).items()} == expected


def test_a_message_not_acknowledged_comes_again_after_its_invisible_time(
    producer: Any, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(1), make_group()
    message_id = send(producer, topic, b"retry me")
    consumer = consumers(group, topic)
    [first] = _receive_all(consumer, 1, invisible_s=1)
    assert (first.message_id, first.delivery_attempt) == (message_id, 1)
    # The next receive long-polls; the lock's end wakes it (no sleep here).
    [again] = _receive_all(consumer, 1, invisible_s=30)
    assert (again.message_id, again.delivery_attempt) == (message_id, 2)
    with pytest.raises(BadRequestException) as refused:
        consumer.ack(first)  # the first delivery's handle no longer holds the message
    assert refused.value.code == Code.INVALID_RECEIPT_HANDLE
    consumer.ack(again)
    assert all_done(store, group, topic)


def test_a_message_delivered_the_groups_maximum_attempts_goes_to_the_dead_letter_topic(
    producer: Any, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(1), make_group()
    # share.delivery.count.limit 3: two attempts told to clients, the third acquisition dead-letters.
    share_configs.alter_group_configs(store, group, {"share.delivery.count.limit": "3"})
    message_id = send(producer, topic, b"never acknowledged", tag="poison")
    consumer = consumers(group, topic)
    attempts = [m.delivery_attempt for m in _receive_all(consumer, 1, invisible_s=1) + _receive_all(consumer, 1, invisible_s=1)]
    assert attempts == [1, 2]
    # The second lock ends on the last attempt: the next acquisition copies the message to the
    # dead-letter topic and archives it, never streaming it again.
    deadline = time.monotonic() + 60
    while not all_done(store, group, topic) and time.monotonic() < deadline:
        assert consumer.receive(16, 1) == []
    assert all_done(store, group, topic), message_id
    assert consumer.receive(16, 1) == []
    [copy] = store_records(store, DLQ_PREFIX + group)
    assert copy.value == b"never acknowledged"
    headers = dict(copy.headers)
    assert headers[DLQ_ORIGIN_TOPIC] == topic.encode()
    assert headers[DLQ_ORIGIN_MESSAGE_ID] == message_id.encode()
    assert headers["TAGS"] == b"poison" and headers["UNIQ_KEY"] == message_id.encode()
    [archived] = [p for p in share_admin.describe(store, group).partitions if p.topic == topic]
    assert archived.start_offset == archived.end_offset  # archived: never delivered again


def test_change_invisible_duration_renews_the_lock_and_answers_a_handle_that_acknowledges(
    producer: Any, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(1), make_group()
    send(producer, topic, b"slow work")
    consumer = consumers(group, topic)
    [message] = _receive_all(consumer, 1, invisible_s=2)
    [held] = _in_flight(store, group, topic)
    assert held.state is RecordState.ACQUIRED and held.lock_deadline_ms - store.now() <= 2_000
    consumer.change_invisible_duration(message, 60)
    [renewed] = _in_flight(store, group, topic)
    assert renewed.state is RecordState.ACQUIRED and renewed.lock_deadline_ms - store.now() > 50_000
    assert renewed.delivery_count == 1
    consumer.ack(message)  # with the handle ChangeInvisibleDuration answered
    assert all_done(store, group, topic)


def test_two_consumers_of_one_group_get_disjoint_messages(
    producer: Any, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(3), make_group()
    sent = {send(producer, topic, f"m{i}".encode()) for i in range(12)}
    a, b = consumers(group, topic), consumers(group, topic)
    got_a: list[Any] = []
    got_b: list[Any] = []
    deadline = time.monotonic() + 60
    while len(got_a) + len(got_b) < len(sent) and time.monotonic() < deadline:
        got_a.extend(a.receive(4, 30))
        got_b.extend(b.receive(4, 30))
    ids_a, ids_b = [m.message_id for m in got_a], [m.message_id for m in got_b]
    assert got_a and got_b
    assert not set(ids_a) & set(ids_b)
    assert sorted(ids_a + ids_b) == sorted(sent)
    for consumer, got in ((a, got_a), (b, got_b)):
        for m in got:
            consumer.ack(m)
    assert all_done(store, group, topic)


def test_records_of_an_aborted_kafka_transaction_are_never_received(
    kafka_gateway: GatewayProcess, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(1), make_group()
    kafka = confluent_kafka.Producer({"bootstrap.servers": kafka_gateway.bootstrap, "transactional.id": f"tx-{topic}"})
    kafka.init_transactions(30)
    kafka.begin_transaction()
    kafka.produce(topic, value=b"aborted")
    kafka.flush(30)
    kafka.abort_transaction(30)
    kafka.begin_transaction()
    kafka.produce(topic, value=b"committed")
    kafka.commit_transaction(30)
    consumer = consumers(group, topic)
    got = _receive_all(consumer, 1)
    assert [m.body for m in got] == [b"committed"]
    consumer.ack(got[0])
    assert consumer.receive(16, 30) == []
    assert all_done(store, group, topic)  # the aborted record and the markers archived, never delivered


def test_a_tag_filter_delivers_matching_messages_and_skips_the_others_for_the_group(
    producer: Any, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(1), make_group()
    for tag in ("a", "b", "c", None):
        send(producer, topic, f"tag {tag}".encode(), tag=tag)
    consumer = consumers(group, topic, "a || c")
    got = _receive_all(consumer, 2)
    assert sorted(m.tag for m in got) == ["a", "c"]
    for m in got:
        consumer.ack(m)
    assert consumer.receive(16, 30) == []
    assert all_done(store, group, topic)  # "b" and the untagged message accepted for the group


def test_forward_to_dead_letter_queue_copies_the_message_and_archives_it(
    producer: Any, stub: Any, store: Broker, make_topic: Any, make_group: Any, consumers: Any
) -> None:
    topic, group = make_topic(1), make_group()
    message_id = send(producer, topic, b"poison", tag="bad")
    consumer = consumers(group, topic)
    [message] = _receive_all(consumer, 1)
    request = service_pb2.ForwardMessageToDeadLetterQueueRequest(
        group=definition_pb2.Resource(name=group),
        topic=definition_pb2.Resource(name=topic),
        receipt_handle=message.receipt_handle,
        message_id=message.message_id,
        delivery_attempt=1,
        max_delivery_attempts=5,
    )
    answer = stub.ForwardMessageToDeadLetterQueue(request, metadata=CLIENT, timeout=10)
    assert answer.status.code == Code.OK, answer.status
    dlq = DLQ_PREFIX + group
    assert topic_service.partition_count(store, dlq) == 1
    [copy] = store_records(store, dlq)
    assert copy.value == b"poison"
    headers = dict(copy.headers)
    assert (
        headers[DLQ_ORIGIN_TOPIC] == topic.encode() and headers["TAGS"] == b"bad" and headers["UNIQ_KEY"] == message_id.encode()
    )
    [archived] = [p for p in share_admin.describe(store, group).partitions if p.topic == topic]
    assert archived.start_offset == archived.end_offset  # archived: never delivered again
    again = stub.ForwardMessageToDeadLetterQueue(request, metadata=CLIENT, timeout=10)
    assert again.status.code == Code.INVALID_RECEIPT_HANDLE  # done already: no second copy
    assert len(store_records(store, dlq)) == 1


def store_records(store: Broker, topic: str) -> list[Any]:
    return list(fetch.fetch(store, topic, 0, 0, 100).records)


def test_malformed_and_foreign_receipt_handles_are_refused_with_invalid_receipt_handle(stub: Any, make_topic: Any) -> None:
    topic = make_topic(1)
    for handle in ("garbage", "txlog1.!!!", "txlog1.WzFd"):
        request = service_pb2.AckMessageRequest(
            group=definition_pb2.Resource(name="GID_x"),
            topic=definition_pb2.Resource(name=topic),
            entries=[service_pb2.AckMessageEntry(message_id="01", receipt_handle=handle)],
        )
        answer = stub.AckMessage(request, metadata=CLIENT, timeout=10)
        assert answer.status.code == Code.INVALID_RECEIPT_HANDLE
        assert [e.status.code for e in answer.entries] == [Code.INVALID_RECEIPT_HANDLE]
    change = service_pb2.ChangeInvisibleDurationRequest(
        group=definition_pb2.Resource(name="GID_x"), topic=definition_pb2.Resource(name=topic), receipt_handle="garbage"
    )
    change.invisible_duration.FromSeconds(10)
    assert stub.ChangeInvisibleDuration(change, metadata=CLIENT, timeout=10).status.code == Code.INVALID_RECEIPT_HANDLE


def test_receive_streams_status_then_delivery_timestamp_and_refuses_bad_requests(stub: Any, make_topic: Any) -> None:
    topic = make_topic(1)

    def receive(**fields: Any) -> list[Any]:
        request = service_pb2.ReceiveMessageRequest(
            group=definition_pb2.Resource(name=fields.pop("group", "GID_raw")),
            message_queue=definition_pb2.MessageQueue(topic=definition_pb2.Resource(name=fields.pop("topic", topic)), id=0),
            batch_size=fields.pop("batch_size", 4),
            **fields,
        )
        request.long_polling_timeout.FromMilliseconds(0)
        return list(stub.ReceiveMessage(request, metadata=CLIENT, timeout=10))

    empty = receive(invisible_duration={"seconds": 10})
    assert [r.WhichOneof("content") for r in empty] == ["status", "delivery_timestamp"]
    assert empty[0].status.code == Code.MESSAGE_NOT_FOUND
    assert receive(invisible_duration={"seconds": 0})[0].status.code == Code.ILLEGAL_INVISIBLE_TIME
    assert receive(topic="no-such-topic", invisible_duration={"seconds": 10})[0].status.code == Code.TOPIC_NOT_FOUND
    bad_filter = definition_pb2.FilterExpression(type=definition_pb2.TAG, expression="a || ")
    assert (
        receive(invisible_duration={"seconds": 10}, filter_expression=bad_filter)[0].status.code == Code.ILLEGAL_FILTER_EXPRESSION
    )
    assert receive(group="", invisible_duration={"seconds": 10})[0].status.code == Code.ILLEGAL_CONSUMER_GROUP


def test_query_assignment_assigns_every_queue_of_the_topic_to_each_consumer(stub: Any, make_topic: Any) -> None:
    topic = make_topic(3)
    request = service_pb2.QueryAssignmentRequest(
        topic=definition_pb2.Resource(name=topic), group=definition_pb2.Resource(name="GID_push")
    )
    answer = stub.QueryAssignment(request, metadata=CLIENT, timeout=10)
    assert answer.status.code == Code.OK
    [assignment] = answer.assignments
    assert assignment.message_queue.id == -1 and assignment.message_queue.broker.id == 0
    assert assignment.message_queue.permission == definition_pb2.READ_WRITE


def test_a_consumers_settings_carry_the_groups_delivery_count_limit(stub: Any, store: Broker) -> None:
    group = f"GID_{uuid.uuid4().hex[:8]}"
    share_configs.alter_group_configs(store, group, {"share.delivery.count.limit": "3"})
    command = service_pb2.TelemetryCommand()
    command.settings.client_type = definition_pb2.SIMPLE_CONSUMER
    command.settings.subscription.group.name = group
    call = stub.Telemetry(iter([command]), metadata=CLIENT, timeout=10)
    answer = next(iter(call))
    call.cancel()
    assert answer.status.code == Code.OK
    assert answer.settings.backoff_policy.max_attempts == 2  # the limit's last acquisition dead-letters
    assert answer.settings.subscription.receive_batch_size == 32


def test_a_push_consumer_is_assigned_the_topic_and_its_messages_are_acknowledged(
    producer: Any, rocketmq_gateway: RocketMQGatewayProcess, store: Broker, make_topic: Any, make_group: Any
) -> None:
    topic, group = make_topic(2), make_group()
    sent = {send(producer, topic, f"push {i}".encode()) for i in range(4)}
    received: list[str] = []
    done = threading.Event()

    class Listener(rocketmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            received.append(message.message_id)
            if set(received) >= sent:
                done.set()
            return rocketmq.ConsumeResult.SUCCESS

    config = rocketmq.ClientConfiguration(rocketmq_gateway.endpoints, rocketmq.Credentials(), request_timeout=10)
    consumer = rocketmq.PushConsumer(config, group, Listener(), {topic: rocketmq.FilterExpression()})
    consumer.startup()
    try:
        assert done.wait(60), received
        wait_until(lambda: all_done(store, group, topic), 30, 0.1, "the push consumer's acknowledgements")
    finally:
        consumer.shutdown()
    assert sorted(received) == sorted(sent)
