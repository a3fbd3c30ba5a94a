"""Two ``txlog rocketmq`` processes on one database: each routes clients to both (QueryRoute lists
every live gateway's endpoint), a gateway killed with ``kill -9`` drops out of the other's routes
once its lease ends, and Kafka's node registry never lists a RocketMQ gateway."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Iterator

import grpc
import pytest

from app.services import Broker
from app.services import cluster as registry
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import wait_until

rocketmq = pytest.importorskip("rocketmq")
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402

LEASE = {"TXLOG_ROCKETMQ_GATEWAY_LEASE_MS": "1500"}


@pytest.fixture
def two(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RocketMQGatewayProcess, ...]]:
    logs = tmp_path_factory.mktemp("registry")
    a = RocketMQGatewayProcess(rocketmq_db, env=LEASE, log_path=logs / "a.log").start()
    b = RocketMQGatewayProcess(rocketmq_db, env=LEASE, log_path=logs / "b.log").start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def _routed(gateway: RocketMQGatewayProcess, topic: str) -> set[str]:
    with grpc.insecure_channel(gateway.endpoints) as channel:
        answer = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=topic)), metadata=(("x-mq-client-id", "t@1"),)
        )
    assert answer.status.code == definition_pb2.Code.OK, answer
    found = {f"{a.host}:{a.port}" for q in answer.message_queues for a in q.broker.endpoints.addresses}
    first = {f"{q.broker.endpoints.addresses[0].host}:{q.broker.endpoints.addresses[0].port}" for q in answer.message_queues}
    assert first == {gateway.endpoints}  # the gateway asked comes first
    return found


def test_every_live_gateway_is_routed_to_and_a_dead_one_drops_out(store: Broker, two: tuple[RocketMQGatewayProcess, ...]) -> None:
    a, b = two
    topic = f"routed-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, topic, 2)
    both = {a.endpoints, b.endpoints}
    wait_until(lambda: _routed(a, topic) == both and _routed(b, topic) == both, 20, 0.1, "both gateways in both routes")
    assert registry.live_nodes(store) == []  # no Kafka broker among them
    config = rocketmq.ClientConfiguration(a.endpoints, rocketmq.Credentials(), request_timeout=10)
    producer = rocketmq.Producer(config, (topic,))
    producer.startup()  # routed to both addresses of the logical broker
    try:
        message = rocketmq.Message()
        message.topic = topic
        message.body = b"routed"
        producer.send(message)
    finally:
        producer.shutdown()
    assert {f"{h}:{p}" for _, h, p in registry.live_rocketmq_gateways(store)} == both
    assert b.proc is not None
    os.killpg(b.proc.pid, signal.SIGKILL)
    b.proc.wait(timeout=30)
    wait_until(lambda: _routed(a, topic) == {a.endpoints}, 20, 0.1, "the killed gateway out of the route")
    assert {f"{h}:{p}" for _, h, p in registry.live_rocketmq_gateways(store)} == {a.endpoints}


def test_a_gateway_stopped_cleanly_leaves_the_registry_at_once(store: Broker, two: tuple[RocketMQGatewayProcess, ...]) -> None:
    a, b = two
    wait_until(lambda: len(registry.live_rocketmq_gateways(store)) == 2, 20, 0.1, "both gateways registered")
    assert b.stop() == 0, b.log()
    assert {f"{h}:{p}" for _, h, p in registry.live_rocketmq_gateways(store)} == {a.endpoints}
