"""Fixtures for the RocketMQ gateway: a real ``txlog rocketmq`` process on a throwaway database,
topics and consumer groups made through txlog's own services."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from app.services import Broker, share_admin, share_configs
from app.services import topics as topic_service
from tests.conftest import fresh_database, make_broker
from tests.support import TxlogProcess, accepting, free_port


class RocketMQGatewayProcess(TxlogProcess):
    """``txlog rocketmq`` in a subprocess, on a free loopback port, against a given database."""

    name = "the gateway"

    def __init__(self, database_url: str, env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.port = free_port()
        self.endpoints = f"127.0.0.1:{self.port}"
        super().__init__(database_url, env, log_path, f"the RocketMQ gateway on {self.endpoints} to accept connections")

    def argv(self) -> list[str]:
        return ["rocketmq", "--listen", self.endpoints, "--log-level", "info"]

    def ready(self) -> bool:
        return accepting(self.port)


@pytest.fixture(scope="module")
def rocketmq_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def store(rocketmq_db: str) -> Iterator[Broker]:
    """txlog's own services on the gateway's database: how tests make topics and read records."""
    b = make_broker(rocketmq_db)
    yield b
    b.db.dispose()


@pytest.fixture(scope="module")
def rocketmq_gateway(rocketmq_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQGatewayProcess]:
    log = tmp_path_factory.mktemp("rocketmq") / "gateway.log"
    g = RocketMQGatewayProcess(rocketmq_db, log_path=log).start()
    yield g
    assert g.stop() == 0, g.log()


@pytest.fixture
def make_topic(store: Broker) -> Callable[..., str]:
    def make(partitions: int = 2) -> str:
        name = f"rq-{uuid.uuid4().hex[:8]}"
        topic_service.create_topic(store, name, partitions)
        return name

    return make


@pytest.fixture
def make_group(store: Broker) -> Callable[[], str]:
    """A consumer group (its share group) reading from the earliest offset: a new RocketMQ group
    starts at the end of the queues, as a proxy's pop does."""

    def make() -> str:
        name = f"GID_{uuid.uuid4().hex[:8]}"
        share_configs.alter_group_configs(store, name, {"share.auto.offset.reset": "earliest"})
        return name

    return make


def send(producer: Any, topic: str, body: bytes, tag: str | None = None) -> str:
    """``body`` sent by a RocketMQ producer (tagged ``tag``); its message id."""
    import rocketmq  # the tests that send skip without the client

    message = rocketmq.Message()
    message.topic = topic
    message.body = body
    if tag is not None:
        message.tag = tag
    return str(producer.send(message).message_id)


def all_done(store: Broker, group: str, topic: str) -> bool:
    """Every record the group took in flight on ``topic`` is done (the start offsets moved past)."""
    parts = [p for p in share_admin.describe(store, group).partitions if p.topic == topic]
    return all(p.start_offset == p.end_offset for p in parts)
