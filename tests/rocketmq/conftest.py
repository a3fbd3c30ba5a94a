"""Fixtures for the RocketMQ gateway: a real ``txlog rocketmq`` process on a throwaway database,
topics and consumer groups made through txlog's own services."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from app.services import Broker, share_admin, share_configs
from app.services import topics as topic_service
from tests.conftest import fresh_database, make_broker
from tests.support import ROOT, free_port, wait_until


class RocketMQGatewayProcess:
    """``txlog rocketmq`` in a subprocess, on a free loopback port, against a given database."""

    def __init__(self, database_url: str, env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        self.port = free_port()
        self.endpoints = f"127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
        self.env.update({"TXLOG_DATABASE_URL": database_url, **(env or {})})
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> "RocketMQGatewayProcess":
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "rocketmq", "--listen", self.endpoints, "--log-level", "info"],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._accepting, timeout, 0.1, f"the RocketMQ gateway on {self.endpoints} to accept connections")
        return self

    def _accepting(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the gateway exited with {self.proc.returncode}:\n{self.log()}")
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        return self.proc.returncode


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
