"""DELAY messages through a real ``txlog rocketmq`` process and RocketMQ's own Python client,
unmodified: a delayed message is not in ``txlog.committed_records`` before its delivery time and is
there, once, after it; a time in the past delivers at once; a time beyond the proxy's bound (one
day) is refused ILLEGAL_DELIVERY_TIME; the route lists DELAY.

The 5.x Python client puts ``Message.delivery_timestamp`` into the protocol timestamp's *seconds*
(its docstring says milliseconds): a delivery time is set in whole seconds here."""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import grpc
import pytest
from sqlalchemy import text

from api.rocketmq.messages import MAX_DELAY_MS, MESSAGE_ID_HEADER
from app.services import Broker
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import wait_until

rocketmq = pytest.importorskip("rocketmq")
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402

Code = definition_pb2.Code


@pytest.fixture(scope="module")
def rocketmq_gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    """A gateway looking for due deliveries every 100 ms (the poll interval bounds the lateness)."""
    log = tmp_path_factory.mktemp("rocketmq") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, env={"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100"}, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()


@pytest.fixture(scope="module")
def topic(store: Broker) -> str:
    name = f"delayed-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, name, 2)
    return name


@pytest.fixture(scope="module")
def producer(rocketmq_gateway: RocketMQGatewayProcess, topic: str) -> Iterator[Any]:
    config = rocketmq.ClientConfiguration(rocketmq_gateway.endpoints, rocketmq.Credentials(), request_timeout=10)
    p = rocketmq.Producer(config, (topic,))
    p.startup()
    yield p
    p.shutdown()


def _landed(store: Broker, topic: str, message_id: str) -> list[int]:
    """The offsets of the records carrying ``message_id`` (read_committed, as every reader sees)."""
    with store.db.read() as conn:
        rows = conn.execute(
            text(
                'SELECT "offset" FROM txlog.committed_records WHERE topic = :t '
                "AND header_values[array_position(header_keys, :h)] = :id"
            ),
            {"t": topic, "h": MESSAGE_ID_HEADER, "id": message_id.encode()},
        )
        return [r[0] for r in rows]


def _delayed(topic: str, body: bytes, deliver_at_s: int) -> Any:
    message = rocketmq.Message()
    message.topic = topic
    message.body = body
    message.delivery_timestamp = deliver_at_s
    return message


def test_the_route_accepts_delay_messages(rocketmq_gateway: RocketMQGatewayProcess, topic: str) -> None:
    with grpc.insecure_channel(rocketmq_gateway.endpoints) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answer = stub.QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), metadata=(("x-mq-client-id", "t@1"),)
        )
    assert answer.status.code == Code.OK
    assert all(definition_pb2.DELAY in q.accept_message_types for q in answer.message_queues)


def test_a_delayed_message_lands_at_its_delivery_time_not_before(store: Broker, topic: str, producer: Any) -> None:
    deliver_at_s = int(time.time()) + 3  # 2 to 3 s from now: whole seconds
    receipt = producer.send(_delayed(topic, b"later", deliver_at_s))
    assert _landed(store, topic, receipt.message_id) == []  # held, right after the send
    wait_until(lambda: _landed(store, topic, receipt.message_id), 15, 0.05, "the delayed message to land")
    assert time.time() >= deliver_at_s
    assert len(_landed(store, topic, receipt.message_id)) == 1
    with store.db.read() as conn:
        decided_by = conn.execute(
            text("SELECT decided_by FROM txlog.half_messages WHERE transaction_id = :id"), {"id": receipt.message_id}
        ).scalar_one()
    assert decided_by == "delivery_time"


def test_a_delivery_time_in_the_past_delivers_at_once(store: Broker, topic: str, producer: Any) -> None:
    receipt = producer.send(_delayed(topic, b"overdue", int(time.time()) - 60))
    assert _landed(store, topic, receipt.message_id) == [receipt.offset]


def test_a_delivery_time_beyond_one_day_is_refused(store: Broker, topic: str, rocketmq_gateway: RocketMQGatewayProcess) -> None:
    message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=b"too late")
    message.system_properties.message_id = uuid.uuid4().hex.upper()
    message.system_properties.message_type = definition_pb2.DELAY
    message.system_properties.delivery_timestamp.seconds = int(time.time() + MAX_DELAY_MS / 1000) + 120
    with grpc.insecure_channel(rocketmq_gateway.endpoints) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answer = stub.SendMessage(service_pb2.SendMessageRequest(messages=[message]), metadata=(("x-mq-client-id", "t@1"),))
    assert answer.status.code == Code.ILLEGAL_DELIVERY_TIME, answer
    assert _landed(store, topic, message.system_properties.message_id) == []
