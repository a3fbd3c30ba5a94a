"""Fixtures for the Kafka wire gateway: real ``txlog kafka`` processes on real databases, and a raw
connection that speaks frames for the tests that need bytes no client sends."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from app.services import Broker
from app.wire.kafka.structs import decode_response, encode_request
from tests.conftest import fresh_database, make_broker
from tests.support import TxlogProcess, accepting, free_port


class GatewayProcess(TxlogProcess):
    """``txlog kafka`` in a subprocess, on a free port, against a given database. ``listeners``
    ({name: security protocol}, each on a free loopback port: ``ports[name]``) replace ``--listen``;
    ``bootstrap`` is then the first one's."""

    name = "the gateway"

    def __init__(
        self,
        database_url: str,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        node_id: int = 0,
        listeners: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.ports = {name: free_port() for name in listeners or {}}
        self.port = next(iter(self.ports.values())) if self.ports else free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.node_id = node_id
        super().__init__(database_url, env, log_path, f"the gateway on {self.bootstrap} to accept connections")
        if listeners:
            self.env["TXLOG_KAFKA_LISTENERS"] = ",".join(f"{name}://127.0.0.1:{self.ports[name]}" for name in listeners)
            if any(name != protocol for name, protocol in listeners.items()):
                self.env["TXLOG_KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] = ",".join(f"{n}:{p}" for n, p in listeners.items())
        self.args = (*(() if listeners else ("--listen", self.bootstrap)), *args)

    def argv(self) -> list[str]:
        return ["kafka", *self.args, "--node-id", str(self.node_id), "--log-level", "info"]

    def ready(self) -> bool:
        return all(accepting(port) for port in self.ports.values() or (self.port,))

    def connect(self, timeout: float = 10) -> "RawConnection":
        return RawConnection(socket.create_connection(("127.0.0.1", self.port), timeout=timeout))


def polled_values(consumer: Any, count: int, timeout_s: float = 60) -> list[bytes]:
    """The values a kafka-python ``KafkaConsumer`` polls until it has ``count`` of them (or more,
    from the same poll) or ``timeout_s`` passed: a wait on the records, where the consumer's own
    ``consumer_timeout_ms`` would count its connecting and joining on a loaded machine."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value for r in records)
    return values


class RawConnection:
    """Frames over a plain socket: requests built with ``app.wire.kafka.structs``, answers read back."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.correlation_id = 0

    def send(self, api_key: int, version: int, body: dict[str, Any] | None = None, client_id: str | None = "raw-test") -> int:
        self.correlation_id += 1
        self.sock.sendall(encode_request(api_key, version, body or {}, self.correlation_id, client_id))
        return self.correlation_id

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes | None:
        """The next answer frame without its size prefix, or None once the gateway closed the connection."""
        prefix = self._read(4)
        if prefix is None:
            return None
        size = struct.unpack(">i", prefix)[0]
        frame = self._read(size)
        assert frame is not None, "the connection closed inside an answer"
        return frame

    def _read(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                assert not data, "the connection closed inside an answer"
                return None
            data += chunk
        return data

    def request(self, api_key: int, version: int, body: dict[str, Any] | None = None) -> Any:
        """Send one request and decode its answer (which must carry its correlation id)."""
        correlation_id = self.send(api_key, version, body)
        frame = self.read_frame()
        assert frame is not None, "the gateway closed the connection instead of answering"
        got, answer = decode_response(api_key, version, frame)
        assert got == correlation_id
        return answer

    def closed_by_peer(self) -> bool:
        """Whether the gateway closed the connection (end of stream, or a reset)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawConnection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(scope="session")
def gateway_db(pg_admin_url: str, template_db: str) -> Iterator[str]:
    with fresh_database(pg_admin_url, template_db) as url:
        yield url


@pytest.fixture(scope="session")
def store(gateway_db: str) -> Iterator[Broker]:
    """txlog's own services on the shared gateway's database: what tests set up and check through
    besides the wire."""
    b = make_broker(gateway_db)
    yield b
    b.db.dispose()


@pytest.fixture(scope="session")
def gateway(gateway_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One real gateway for the session's wire tests, topics auto-created (each test names its own)."""
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    env = {"TXLOG_KAFKA_AUTO_CREATE_TOPICS": "true", "TXLOG_KAFKA_NUM_PARTITIONS": "2"}
    with GatewayProcess(gateway_db, env=env, log_path=log) as g:
        yield g


@pytest.fixture
def start_gateway(pg_admin_url: str, template_db: str, tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """Start more gateways, each on a database of its own, with TXLOG_* settings given as keywords
    (``kafka_auto_create_topics="false"``); all stopped at the end of the test."""
    started: list[tuple[GatewayProcess, contextlib.ExitStack]] = []

    def start(**settings: str) -> GatewayProcess:
        stack = contextlib.ExitStack()
        url = stack.enter_context(fresh_database(pg_admin_url, template_db))
        env = {f"TXLOG_{k.upper()}": str(v) for k, v in settings.items()}
        g = GatewayProcess(url, env=env, log_path=tmp_path / f"gateway-{len(started)}.log")
        started.append((g, stack))
        return g.start()

    yield start
    for g, stack in reversed(started):
        g.stop()
        stack.close()


@pytest.fixture
def raw(gateway: GatewayProcess) -> Iterator[RawConnection]:
    with gateway.connect() as conn:
        yield conn
