"""A push consumer's receipt handles renewed in the background by the gateway, as a RocketMQ 5
proxy renews them (``rocketmq-python-client``'s PushConsumer, unmodified): a message consumed for
several invisible durations is acknowledged once and delivered to no other consumer meanwhile; the
messages of a push consumer killed while it holds them go promptly to another consumer. The
gateway runs with a push consumer's invisible duration of seconds, renewed a second ahead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest

from app.services import Broker, share_admin
from tests.rocketmq.conftest import RocketMQGatewayProcess, all_done, send
from tests.support import ROOT, wait_until

rocketmq = pytest.importorskip("rocketmq")

INVISIBLE_S = 2
AWAIT_S = 3  # the other consumer's long-polling timeout
RENEWING = {
    "TXLOG_ROCKETMQ_DEFAULT_INVISIBLE_MS": str(INVISIBLE_S * 1000),
    "TXLOG_ROCKETMQ_RENEW_AHEAD_MS": "1000",
    "TXLOG_ROCKETMQ_RENEW_SCHEDULE_PERIOD_MS": "200",
}


@pytest.fixture(scope="module")
def gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    log = tmp_path_factory.mktemp("rocketmq-renewal") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, env=RENEWING, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()


def _config(gateway: RocketMQGatewayProcess) -> Any:
    return rocketmq.ClientConfiguration(gateway.endpoints, rocketmq.Credentials(), request_timeout=10)


@pytest.fixture(scope="module")
def producer(gateway: RocketMQGatewayProcess) -> Iterator[Any]:
    p = rocketmq.Producer(_config(gateway))
    p.startup()
    yield p
    p.shutdown()


@pytest.fixture
def simple_consumer(gateway: RocketMQGatewayProcess) -> Iterator[Any]:
    started: list[Any] = []

    def start(group: str, topic: str) -> Any:
        c = rocketmq.SimpleConsumer(_config(gateway), group, {topic: rocketmq.FilterExpression()}, await_duration=AWAIT_S)
        c.startup()
        started.append(c)
        return c

    yield start
    for c in started:
        c.shutdown()


def _lock_deadline_ms(store: Broker, group: str, topic: str) -> int:
    """The latest lock deadline of the group's records held on ``topic`` (0: none held)."""
    parts = [p for p in share_admin.describe(store, group).partitions if p.topic == topic]
    return max((r.lock_deadline_ms or 0 for p in parts for r in p.in_flight), default=0)


def test_a_message_consumed_for_several_invisible_durations_is_acknowledged_once_and_not_delivered_again(
    gateway: RocketMQGatewayProcess, producer: Any, store: Broker, make_topic: Any, make_group: Any, simple_consumer: Any
) -> None:
    topic, group = make_topic(2), make_group()
    message_id = send(producer, topic, b"slow work")
    deliveries: list[str] = []
    received, finish = threading.Event(), threading.Event()

    class Slow(rocketmq.MessageListener):  # type: ignore[misc]
        def consume(self, message: Any) -> Any:
            deliveries.append(message.message_id)
            received.set()
            finish.wait(120)
            return rocketmq.ConsumeResult.SUCCESS

    push = rocketmq.PushConsumer(_config(gateway), group, Slow(), {topic: rocketmq.FilterExpression()})
    push.startup()
    try:
        other = simple_consumer(group, topic)
        assert received.wait(60)
        held_since = time.monotonic()
        taken: list[Any] = []
        while time.monotonic() - held_since < 4 * INVISIBLE_S:  # each receive long-polls
            taken += other.receive(16, 30)
        assert taken == []
        finish.set()
        wait_until(lambda: all_done(store, group, topic), 30, 0.1, "the push consumer's acknowledgement")
    finally:
        finish.set()
        push.shutdown()
    assert deliveries == [message_id]


def test_the_messages_of_a_push_consumer_killed_while_holding_them_go_promptly_to_another_consumer(
    gateway: RocketMQGatewayProcess, producer: Any, store: Broker, make_topic: Any, make_group: Any, simple_consumer: Any
) -> None:
    topic, group = make_topic(2), make_group()
    message_id = send(producer, topic, b"held by the dying")
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.rocketmq.holding_consumer", gateway.endpoints, group, topic],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        lines: list[bytes] = []
        reader = threading.Thread(target=lambda: lines.append(holder.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(60)
        assert lines and lines[0].decode().strip() == message_id, lines
        # Renewed past the invisible duration: only the gateway can make it visible again soon.
        wait_until(lambda: _lock_deadline_ms(store, group, topic) > time.time() * 1000 + 30_000, 30, 0.1, "the lock's renewal")
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(30)
        killed = time.monotonic()
        other = simple_consumer(group, topic)
        got: list[Any] = []
        while not got and time.monotonic() - killed < 30:
            got = other.receive(16, 30)
        after_s = time.monotonic() - killed
        assert [m.message_id for m in got] == [message_id]
        assert got[0].delivery_attempt == 2
        assert after_s < 15, after_s  # the renewed lock had 30 s and more to run
        other.ack(got[0])
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(30)
        if holder.stdout is not None:
            holder.stdout.close()
