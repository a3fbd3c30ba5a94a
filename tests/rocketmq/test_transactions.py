"""Transactional and FIFO messages through the RocketMQ gateway, with RocketMQ's own Python client,
unmodified: a half message committed or rolled back by its producer, a TransactionChecker answering
the gateway's check-backs (COMMIT, ROLLBACK, UNKNOWN then COMMIT), a producer killed with SIGKILL
after its half message whose check-back reaches the producer started after it, and message groups
kept in order on one partition each. The check-backs are counted on both sides: none for a
message decided already (unexpected), none sent twice (duplicated)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from sqlalchemy import text

from api.rocketmq.messages import KEYS_HEADER, MESSAGE_ID_HEADER, TAG_HEADER
from app.domain.half_messages import DecidedBy, HalfState
from app.services import Broker
from app.services import half_messages as half_service
from app.services import topics as topic_service
from tests.rocketmq.conftest import RocketMQGatewayProcess
from tests.support import ROOT, wait_until

rocketmq = pytest.importorskip("rocketmq")

COMMIT = rocketmq.TransactionResolution.COMMIT
ROLLBACK = rocketmq.TransactionResolution.ROLLBACK
UNKNOWN = rocketmq.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
CHECK_INTERVAL_MS = 300  # between two check-backs of one half message (the producer group's setting)
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    log = tmp_path_factory.mktemp("rocketmq-transactions") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, env={"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100"}, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()
    # the gateway's own count, logged as it stops
    assert re.search(r"check-backs: sent \d+, released \d+, answered \d+ \(late \d+\), unexpected 0, duplicated 0", g.log()), (
        g.log()
    )


class Checker(rocketmq.TransactionChecker):  # type: ignore[misc]
    """Answers the check-backs of each message in the order given (the last answer again after
    that), noting each."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers) or [UNKNOWN]
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def check(self, message: Any) -> Any:
        with self._lock:
            self.calls.append(message.message_id)
            asked = self.calls.count(message.message_id)
            return self.answers[min(asked, len(self.answers)) - 1]


def _topic(store: Broker, partitions: int = 3, max_checks: int | None = None) -> str:
    """A topic, and its producer group (the topic's name, as RocketMQ's proxy names it) with short check-backs."""
    name = f"tx-{uuid.uuid4().hex[:8]}"
    topic_service.create_topic(store, name, partitions)
    half_service.register_producer_group(store, name, None, check_interval_ms=CHECK_INTERVAL_MS, max_checks=max_checks)
    return name


def _producer(gateway: RocketMQGatewayProcess, topic: str, checker: Checker | None = None) -> Any:
    config = rocketmq.ClientConfiguration(gateway.endpoints, rocketmq.Credentials(), request_timeout=10)
    p = rocketmq.Producer(config, (topic,), checker)
    p.startup()
    return p


def _message(topic: str, body: bytes, immunity_s: int | None = None) -> Any:
    message = rocketmq.Message()
    message.topic = topic
    message.body = body
    message.tag = "paid"
    message.keys = "order-1"
    message.add_property("region", "eu-west")
    if immunity_s is not None:
        message.add_property("CHECK_IMMUNITY_TIME_IN_SECONDS", str(immunity_s))
    return message


def _records(store: Broker, topic: str) -> list[dict[str, Any]]:
    with store.db.read() as conn:
        rows = conn.execute(
            text(
                'SELECT partition, "offset", key, value, header_keys, header_values FROM txlog.committed_records '
                'WHERE topic = :t ORDER BY partition, "offset"'
            ),
            {"t": topic},
        ).mappings()
        return [dict(r) for r in rows]


def _headers(record: dict[str, Any]) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in zip(record["header_keys"], record["header_values"])}


def _state(store: Broker, transaction_id: str) -> HalfState:
    return half_service.describe(store, transaction_id).stored.msg.state


def _decided(store: Broker, transaction_id: str) -> half_service.HalfMessageDetail:
    wait_until(lambda: _state(store, transaction_id).is_decided, TIMEOUT, 0.05, f"half message {transaction_id} decided")
    return half_service.describe(store, transaction_id)


def _sent_checks(*gateways: RocketMQGatewayProcess) -> Counter[tuple[str, int]]:
    """How many times each check of each half message was sent, by the gateways given together."""
    return Counter(
        (tid, int(n))
        for g in gateways
        for n, tid in re.findall(r"check-back (\d+) of half message (\S+) sent to producer", g.log())
    )


def _assert_landed_once(store: Broker, topic: str, message_id: str, body: bytes) -> None:
    records = _records(store, topic)
    assert [r["value"] for r in records] == [body]
    headers = _headers(records[0])
    assert headers[MESSAGE_ID_HEADER] == message_id.encode()
    assert headers[TAG_HEADER] == b"paid" and headers[KEYS_HEADER] == b"order-1" and headers["region"] == b"eu-west"
    assert records[0]["key"] is None


def test_a_committed_half_message_lands_once_with_a_normal_messages_headers(
    store: Broker, gateway: RocketMQGatewayProcess
) -> None:
    topic = _topic(store)
    checker = Checker(ROLLBACK)
    producer = _producer(gateway, topic, checker)
    try:
        transaction = producer.begin_transaction()
        receipt = producer.send(_message(topic, b"paid order"), transaction)
        assert receipt.transaction_id
        assert _state(store, receipt.transaction_id) is HalfState.PREPARED
        assert _records(store, topic) == []  # invisible until committed
        transaction.commit()
        assert _state(store, receipt.transaction_id) is HalfState.COMMITTED
        _assert_landed_once(store, topic, receipt.message_id, b"paid order")
    finally:
        producer.shutdown()
    assert checker.calls == []  # decided by its producer: never checked


def test_a_rolled_back_half_message_is_never_visible(store: Broker, gateway: RocketMQGatewayProcess) -> None:
    topic = _topic(store)
    checker = Checker(COMMIT)
    producer = _producer(gateway, topic, checker)
    try:
        transaction = producer.begin_transaction()
        receipt = producer.send(_message(topic, b"cancelled order"), transaction)
        transaction.rollback()
        detail = half_service.describe(store, receipt.transaction_id)
        assert detail.stored.msg.state is HalfState.ROLLED_BACK and detail.stored.msg.decided_by is not None
        assert detail.stored.msg.decided_by.value == "producer"
        assert _records(store, topic) == []
    finally:
        producer.shutdown()
    assert checker.calls == []


@pytest.mark.parametrize(
    ("answers", "state", "checks"),
    [
        ((COMMIT,), HalfState.COMMITTED, ["COMMIT"]),
        ((ROLLBACK,), HalfState.ROLLED_BACK, ["ROLLBACK"]),
        ((UNKNOWN, COMMIT), HalfState.COMMITTED, ["UNKNOWN", "COMMIT"]),
    ],
    ids=["commit", "rollback", "unknown-then-commit"],
)
def test_the_checker_decides_an_orphaned_half_message(
    store: Broker, gateway: RocketMQGatewayProcess, answers: tuple[Any, ...], state: HalfState, checks: list[str]
) -> None:
    topic = _topic(store)
    checker = Checker(*answers)
    producer = _producer(gateway, topic, checker)
    try:
        transaction = producer.begin_transaction()
        # the producer never ends its transaction: the gateway asks after the message's own immunity
        receipt = producer.send(_message(topic, b"orphan", immunity_s=1), transaction)
        detail = _decided(store, receipt.transaction_id)
    finally:
        producer.shutdown()
    assert detail.stored.msg.state is state
    assert detail.stored.msg.decided_by is not None and detail.stored.msg.decided_by.value == "check_back"
    assert [c.answer for c in detail.checks] == checks
    assert [c.check_no for c in detail.checks] == list(range(1, len(checks) + 1))
    # the first check came after the message's immunity, not before
    assert detail.checks[0].started_at_ms - detail.stored.msg.created_at_ms >= 1000
    assert checker.calls == [receipt.message_id] * len(checks)
    if state is HalfState.COMMITTED:
        _assert_landed_once(store, topic, receipt.message_id, b"orphan")
    else:
        assert _records(store, topic) == []
    sent = _sent_checks(gateway)
    assert sorted(n for (tid, n), _ in sent.items() if tid == receipt.transaction_id) == list(range(1, len(checks) + 1))
    assert set(sent.values()) <= {1}


ORPHAN = """
import sys
import rocketmq

class Never(rocketmq.TransactionChecker):
    def check(self, message):
        return rocketmq.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED

endpoints, topic = sys.argv[1], sys.argv[2]
producer = rocketmq.Producer(rocketmq.ClientConfiguration(endpoints, rocketmq.Credentials(), request_timeout=10), (topic,), Never())
producer.startup()
message = rocketmq.Message()
message.topic = topic
message.body = b"paid by a producer that died"
message.tag = "paid"
message.keys = "order-1"
message.add_property("region", "eu-west")
message.add_property("CHECK_IMMUNITY_TIME_IN_SECONDS", "2")
receipt = producer.send(message, producer.begin_transaction())
print(receipt.transaction_id, receipt.message_id, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def orphan(tmp_path: Path) -> Callable[[str, str], tuple[str, str]]:
    """Sends a half message to ``topic`` through the gateway at ``endpoints`` from a producer (the
    ORPHAN script) killed with SIGKILL before it could decide it; its transaction id and message id."""

    def send(endpoints: str, topic: str) -> tuple[str, str]:
        producer = subprocess.Popen(
            [sys.executable, "-c", ORPHAN, endpoints, topic],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            assert producer.stdout is not None
            transaction_id, message_id = producer.stdout.readline().decode().split()
        finally:
            os.kill(producer.pid, signal.SIGKILL)
            producer.wait(timeout=30)
        return transaction_id, message_id

    return send


def test_a_producer_killed_after_its_half_message_is_succeeded_by_the_next_one(
    store: Broker, gateway: RocketMQGatewayProcess, orphan: Callable[[str, str], tuple[str, str]]
) -> None:
    topic = _topic(store)
    transaction_id, message_id = orphan(gateway.endpoints, topic)
    assert _state(store, transaction_id) is HalfState.PREPARED
    checker = Checker(COMMIT)
    successor = _producer(gateway, topic, checker)
    try:
        detail = _decided(store, transaction_id)
    finally:
        successor.shutdown()
    assert detail.stored.msg.state is HalfState.COMMITTED
    assert checker.calls == [message_id]  # the successor was asked once, and that decided it
    assert detail.checks[-1].answer == "COMMIT"
    _assert_landed_once(store, topic, message_id, b"paid by a producer that died")
    assert set(_sent_checks(gateway).values()) <= {1}


def test_a_half_message_whose_producers_are_all_gone_is_rolled_back_after_its_last_check(
    rocketmq_db: str, store: Broker, tmp_path: Path, orphan: Callable[[str, str], tuple[str, str]]
) -> None:
    """No producer of the group on any gateway: each check-back no gateway could send is counted
    once a gateway lease has passed since it fell due, as a broker counts a check it found no
    producer for, and after max_checks the half message is rolled back, not left undecided."""
    topic = _topic(store, max_checks=2)
    env = {"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100", "TXLOG_ROCKETMQ_GATEWAY_LEASE_MS": "1000"}
    g = RocketMQGatewayProcess(rocketmq_db, env=env, log_path=tmp_path / "gateway.log").start()
    try:
        transaction_id, _ = orphan(g.endpoints, topic)
        detail = _decided(store, transaction_id)
    finally:
        assert g.stop() == 0, g.log()
    log = g.log()
    assert (detail.stored.msg.state, detail.stored.msg.decided_by) == (HalfState.ROLLED_BACK, DecidedBy.MAX_CHECKS)
    assert len(detail.checks) == 2 and all(c.answer is None for c in detail.checks)
    assert _records(store, topic) == []
    assert "counted with no live producer of their group on any gateway" in log
    assert not _sent_checks(g)


def test_each_message_group_keeps_its_order_on_one_partition(store: Broker, gateway: RocketMQGatewayProcess) -> None:
    topic = _topic(store, partitions=4)
    producer = _producer(gateway, topic)
    groups = [f"customer-{i}" for i in range(3)]
    n = 8
    try:
        for i in range(n):
            for group in groups:
                message = rocketmq.Message()
                message.topic = topic
                message.body = f"{group} step {i}".encode()
                message.message_group = group
                producer.send(message)
    finally:
        producer.shutdown()
    records = _records(store, topic)
    assert len(records) == n * len(groups)
    for group in groups:
        mine = [r for r in records if r["key"] == group.encode()]
        assert len({r["partition"] for r in mine}) == 1
        assert [r["value"] for r in mine] == [f"{group} step {i}".encode() for i in range(n)]


@pytest.fixture(scope="module")
def second_gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    log = tmp_path_factory.mktemp("rocketmq-transactions-2") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, env={"TXLOG_HALF_CHECK_POLL_INTERVAL_MS": "100"}, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()
    assert re.search(r"check-backs: sent \d+, released \d+, answered \d+ \(late \d+\), unexpected 0, duplicated 0", g.log()), (
        g.log()
    )


def test_two_gateways_with_producers_of_one_group_send_each_check_once(
    store: Broker, gateway: RocketMQGatewayProcess, second_gateway: RocketMQGatewayProcess
) -> None:
    topic = _topic(store)
    checker = Checker(UNKNOWN, UNKNOWN, COMMIT)  # one application: its two producers share their answers
    first, second = _producer(gateway, topic, checker), _producer(second_gateway, topic, checker)
    try:
        receipts = [first.send(_message(topic, f"order {i}".encode(), immunity_s=1), first.begin_transaction()) for i in range(4)]
        details = [_decided(store, r.transaction_id) for r in receipts]
    finally:
        first.shutdown()
        second.shutdown()
    sent = _sent_checks(gateway, second_gateway)
    for receipt, detail in zip(receipts, details):
        assert detail.stored.msg.state is HalfState.COMMITTED
        assert [c.answer for c in detail.checks] == ["UNKNOWN", "UNKNOWN", "COMMIT"]
        assert checker.calls.count(receipt.message_id) == 3
        assert sorted(n for (tid, n) in sent if tid == receipt.transaction_id) == [1, 2, 3]
    assert set(sent.values()) == {1}
    assert sorted(r["value"] for r in _records(store, topic)) == [f"order {i}".encode() for i in range(4)]


def test_bad_transactional_calls_answer_rocketmq_status_codes(store: Broker, gateway: RocketMQGatewayProcess) -> None:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

    code = definition_pb2.Code
    topic = _topic(store)
    metadata = (("x-mq-client-id", "raw-client@1"),)

    def half(**properties: str) -> Any:
        message = definition_pb2.Message(topic=definition_pb2.Resource(name=topic), body=b"x")
        message.system_properties.message_id = uuid.uuid4().hex.upper()
        message.system_properties.message_type = definition_pb2.TRANSACTION
        message.user_properties.update(properties)
        return message

    def end(transaction_id: str, resolution: int, name: str = topic) -> Any:
        request = service_pb2.EndTransactionRequest(
            topic=definition_pb2.Resource(name=name),
            transaction_id=transaction_id,
            resolution=resolution,
            source=definition_pb2.SOURCE_CLIENT,
        )
        return stub.EndTransaction(request, metadata=metadata).status

    with grpc.insecure_channel(gateway.endpoints) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for bad in ("soon", "3601"):
            sent = stub.SendMessage(
                service_pb2.SendMessageRequest(messages=[half(CHECK_IMMUNITY_TIME_IN_SECONDS=bad)]), metadata=metadata
            )
            assert sent.status.code == code.BAD_REQUEST
        sent = stub.SendMessage(service_pb2.SendMessageRequest(messages=[half()]), metadata=metadata)
        assert sent.status.code == code.OK
        tid = sent.entries[0].transaction_id
        assert tid == sent.entries[0].message_id
        assert end("", definition_pb2.COMMIT).code == code.INVALID_TRANSACTION_ID
        assert end("NO-SUCH-TRANSACTION", definition_pb2.COMMIT).code == code.INVALID_TRANSACTION_ID
        assert end(tid, definition_pb2.COMMIT, name="other-topic").code == code.INVALID_TRANSACTION_ID
        assert end(tid, definition_pb2.TRANSACTION_RESOLUTION_UNSPECIFIED).code == code.OK  # decides nothing
        assert _state(store, tid) is HalfState.PREPARED
        assert end(tid, definition_pb2.ROLLBACK).code == code.OK
        assert end(tid, definition_pb2.ROLLBACK).code == code.OK  # the same decision again
        contradicted = end(tid, definition_pb2.COMMIT)
        assert contradicted.code == code.BAD_REQUEST and "RolledBack" in contradicted.message
    assert _records(store, topic) == []
    assert gateway.alive()


def test_no_check_back_was_unexpected_or_duplicated(gateway: RocketMQGatewayProcess) -> None:
    log = gateway.log()
    assert "unexpected check-back" not in log
    assert "duplicated check-back" not in log
    assert _sent_checks(gateway)
    assert set(_sent_checks(gateway).values()) == {1}
