"""Identity on the RocketMQ gateway: a real ``txlog rocketmq`` with TXLOG_AUTH=token and RocketMQ's
own Python client, unmodified, signing its calls (MQv2-HMAC-SHA1) with a principal's name and its
RocketMQ secret key; each RPC allowed by the ACLs of its Kafka counterpart."""

from __future__ import annotations

import secrets
import uuid
from types import SimpleNamespace
from typing import Any, Iterator

import grpc
import pytest

from app.domain.acl_bindings import CLUSTER_NAME, AclBinding, Operation, PatternType, PermissionType, ResourceType
from app.services import Broker, security, share_configs
from app.services import half_messages as half_service
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import wait_until

rocketmq = pytest.importorskip("rocketmq")
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc  # noqa: E402
from rocketmq.v5.exception import ForbiddenException  # noqa: E402
from rocketmq.v5.util.signature import Signature  # noqa: E402

Code = definition_pb2.Code
ADMIN_TOKEN = "admin-" + secrets.token_hex(16)
O, R = Operation, ResourceType


class World(SimpleNamespace):
    gateway: RocketMQGatewayProcess
    topic: str
    tx_topic: str  # its producer group (the topic's name) checks back soon
    group: str
    writer: tuple[str, str]  # name, RocketMQ secret key
    reader: tuple[str, str]
    describer: tuple[str, str]  # Describe on the topic, nothing more


def _grant(store: Broker, who: str, rt: ResourceType, name: str, *ops: Operation) -> None:
    security.add_acls(
        store.db,
        [
            AclBinding(who, rt, CLUSTER_NAME if rt is R.CLUSTER else name, PatternType.LITERAL, op, PermissionType.ALLOW)
            for op in ops
        ],
    )


def _principal(store: Broker, prefix: str) -> tuple[str, str]:
    made = security.create_principal(store.db, f"{prefix}-{uuid.uuid4().hex[:6]}")
    return made.principal.name, security.rocketmq_secret_key(made.token)


@pytest.fixture(scope="module")
def world(rocketmq_db: str, store: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Principals and ACLs made before the gateway starts: its first snapshot holds them."""
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, topic, 2)
    tx_topic = f"secured-tx-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, tx_topic, 1)
    half_service.register_producer_group(store, tx_topic, None, check_interval_ms=300)
    group = f"GID_{uuid.uuid4().hex[:8]}"
    share_configs.alter_group_configs(store, group, {"share.auto.offset.reset": "earliest"})
    writer, reader, describer = _principal(store, "writer"), _principal(store, "reader"), _principal(store, "describer")
    _grant(store, writer[0], R.TOPIC, topic, O.WRITE)
    _grant(store, reader[0], R.TOPIC, topic, O.READ)
    _grant(store, reader[0], R.GROUP, group, O.READ)
    _grant(store, describer[0], R.TOPIC, topic, O.DESCRIBE)
    _grant(store, writer[0], R.TOPIC, tx_topic, O.WRITE)
    _grant(store, describer[0], R.TOPIC, tx_topic, O.DESCRIBE)
    log = tmp_path_factory.mktemp("rocketmq-auth") / "gateway.log"
    env = {"TXLOG_AUTH": "token", "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN, "TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100"}
    gateway = RocketMQGatewayProcess(rocketmq_db, env=env, log_path=log).start()
    try:
        yield World(
            gateway=gateway, topic=topic, tx_topic=tx_topic, group=group, writer=writer, reader=reader, describer=describer
        )
    finally:
        assert gateway.stop() == 0, gateway.log()


def _config(world: World, access_key: str, secret_key: str) -> Any:
    return rocketmq.ClientConfiguration(world.gateway.endpoints, rocketmq.Credentials(access_key, secret_key), request_timeout=10)


def _message(topic: str, body: bytes) -> Any:
    m = rocketmq.Message()
    m.topic = topic
    m.body = body
    return m


def _signed(access_key: str, secret_key: str) -> list[tuple[str, str]]:
    """The metadata the client sends, made by the client's own signing code."""
    config = SimpleNamespace(credentials=rocketmq.Credentials(access_key, secret_key), namespace="")
    return [(k, v) for k, v in Signature.metadata(config, "auth-test@1") if k != "x-mq-namespace"]


def _route(world: World, metadata: list[tuple[str, str]]) -> Any:
    with grpc.insecure_channel(world.gateway.endpoints) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=world.topic))
        return stub.QueryRoute(request, metadata=metadata, timeout=10)


def test_a_producer_with_a_principals_credentials_sends_and_a_consumer_with_read_receives(world: World) -> None:
    producer = rocketmq.Producer(_config(world, *world.writer), (world.topic,))
    producer.startup()
    try:
        receipt = producer.send(_message(world.topic, b"signed"))
    finally:
        producer.shutdown()
    consumer = rocketmq.SimpleConsumer(
        _config(world, *world.reader), world.group, {world.topic: rocketmq.FilterExpression("*")}, await_duration=3
    )
    consumer.startup()
    try:
        got: list[Any] = []
        for _ in range(10):  # each receive long-polls: no sleeps
            got += consumer.receive(16, 30)
            if got:
                break
        assert [m.body for m in got] == [b"signed"]
        assert got[0].message_id == receipt.message_id
        consumer.ack(got[0])
    finally:
        consumer.shutdown()


def test_a_wrong_secret_an_unknown_principal_and_no_credentials_are_unauthorized(world: World) -> None:
    name, key = world.writer
    assert _route(world, _signed(name, key)).status.code == Code.OK
    for metadata in (
        _signed(name, key[:-1] + ("0" if key[-1] != "0" else "1")),
        _signed(name, ADMIN_TOKEN),  # a token is not a RocketMQ secret key
        _signed("nobody-" + uuid.uuid4().hex[:6], key),
        _signed("", ""),  # the client's default Credentials()
        [("x-mq-client-id", "auth-test@1")],  # not signed at all
    ):
        answer = _route(world, metadata)
        assert answer.status.code == Code.UNAUTHORIZED, (metadata, answer.status)
    # a signature from another time: replayed out of the skew window
    stale = [(k, "20000101T000000Z" if k == "x-mq-date-time" else v) for k, v in _signed(name, key)]
    assert _route(world, stale).status.code == Code.UNAUTHORIZED
    # the unmodified client with a wrong secret cannot send
    producer = rocketmq.Producer(_config(world, name, "wrong"))
    producer.startup()
    try:
        with pytest.raises(Exception, match="route"):  # the client reports a failed route fetch
            producer.send(_message(world.topic, b"refused"))
    finally:
        producer.shutdown()


def test_a_principal_without_write_on_the_topic_is_forbidden(world: World) -> None:
    producer = rocketmq.Producer(_config(world, *world.describer), (world.topic,))
    producer.startup()  # its route: Describe on the topic suffices (Kafka's Metadata)
    try:
        with pytest.raises(ForbiddenException):
            producer.send(_message(world.topic, b"not yours"))
    finally:
        producer.shutdown()
    # a reader may not send either, and a writer may not receive for the group
    answer = _route(world, _signed(*world.reader))
    assert answer.status.code == Code.OK  # Read implies Describe
    with grpc.insecure_channel(world.gateway.endpoints) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        request = service_pb2.AckMessageRequest(
            group=definition_pb2.Resource(name=world.group),
            topic=definition_pb2.Resource(name=world.topic),
            entries=[service_pb2.AckMessageEntry(message_id="X", receipt_handle="Y")],
        )
        acked = stub.AckMessage(request, metadata=_signed(*world.writer), timeout=10)
        assert acked.status.code == Code.FORBIDDEN, acked.status


def test_the_cli_tells_a_tokens_rocketmq_secret_key(world: World) -> None:
    from click.testing import CliRunner

    from app.cli.root import cli

    told = CliRunner().invoke(cli, ["principals", "rocketmq-key"], input=ADMIN_TOKEN + "\n")
    assert told.exit_code == 0, told.output
    key = told.output.strip()
    assert key == security.rocketmq_secret_key(ADMIN_TOKEN) and ADMIN_TOKEN not in key
    # TXLOG_ADMIN_TOKEN's principal, admin, signs with it
    assert _route(world, _signed(security.ADMIN_PRINCIPAL, key)).status.code == Code.OK


class Checker(rocketmq.TransactionChecker):  # type: ignore[misc]
    def __init__(self) -> None:
        self.calls: list[str] = []

    def check(self, message: Any) -> Any:
        self.calls.append(message.message_id)
        return rocketmq.TransactionResolution.COMMIT


def test_a_check_back_goes_only_to_a_producer_that_may_answer_it(world: World, store: Broker) -> None:
    """A check-back carries the half message: a producer that names the topic but may not Write it
    (answer EndTransaction) is never sent one."""
    writes, snoops = Checker(), Checker()
    writer = rocketmq.Producer(_config(world, *world.writer), (world.tx_topic,), writes)
    writer.startup()
    snooper = None
    try:
        transaction = writer.begin_transaction()
        message = _message(world.tx_topic, b"half")
        message.add_property("CHECK_IMMUNITY_TIME_IN_SECONDS", "1")
        receipt = writer.send(message, transaction)
        # the newest producer of the topic: first in line for the check, were it not refused
        snooper = rocketmq.Producer(_config(world, *world.describer), (world.tx_topic,), snoops)
        snooper.startup()
        wait_until(
            lambda: half_service.describe(store, receipt.transaction_id).stored.msg.state.is_decided,
            20,
            0.05,
            "the half message decided by a check-back",
        )
    finally:
        writer.shutdown()
        if snooper is not None:
            snooper.shutdown()
    assert writes.calls and set(writes.calls) == {receipt.message_id}
    assert snoops.calls == []
