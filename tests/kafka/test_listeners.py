"""Listeners and TLS: two gateways (node registry) with a PLAINTEXT, an SSL (mutual TLS) and a
SASL_SSL listener each, one database. Metadata, FindCoordinator and DescribeCluster name the
endpoints of the listener a client connected to; SSL clients are the principal their certificate
maps to; SASL_SSL clients sign in with SASL over TLS. Tested with confluent-kafka, kafka-python,
aiokafka, kcat and raw frames; the certificates are made at test time (``tests.kafka.tls``)."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from app.services import security, topics
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection, polled_values
from tests.kafka.tls import Authority, Pair
from tests.support import ROOT, free_port, wait_until

ADMIN_TOKEN = "admin-" + secrets.token_hex(16)
KCAT = shutil.which("kcat")
LISTENERS = {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL", "SASL_SSL": "SASL_SSL"}
HANDSHAKE_TIMEOUT_MS = 1000


class Certs:
    def __init__(self, folder: Path) -> None:
        self.ca = Authority.make(folder, "ca")
        self.server = self.ca.issue("server", "/CN=localhost", server=True)
        self.suffix = uuid.uuid4().hex[:6]
        self.alice_name = f"alice-{self.suffix}"
        self.alice = self.ca.issue("alice", f"/O=txlog-test/CN={self.alice_name}")
        self.nobody = self.ca.issue("nobody", f"/O=txlog-test/CN=nobody-{self.suffix}")  # maps to no principal
        self.stranger = Authority.make(folder / "other", "other-ca").issue("stranger", f"/O=txlog-test/CN={self.alice_name}")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


class Cluster:
    def __init__(self, gateways: list[GatewayProcess], certs: Certs, alice_token: str) -> None:
        self.gateways = gateways
        self.certs = certs
        self.alice_token = alice_token

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.gateways[0].ports[listener]}"

    def endpoints(self, listener: str) -> list[tuple[int, str, int]]:
        return [(g.node_id, "127.0.0.1", g.ports[listener]) for g in self.gateways]


def _env(certs: Certs) -> dict[str, str]:
    return {
        "TXLOG_AUTH": "token",
        "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN,
        "TXLOG_KAFKA_AUTO_CREATE_TOPICS": "true",
        "TXLOG_KAFKA_NUM_PARTITIONS": "2",
        "TXLOG_KAFKA_NODE_LEASE_MS": "3000",
        "TXLOG_KAFKA_SSL_CERTFILE": str(certs.server.cert),
        "TXLOG_KAFKA_SSL_KEYFILE": str(certs.server.key),
        "TXLOG_KAFKA_SSL_CAFILE": str(certs.ca.cert),
        "TXLOG_KAFKA_SSL_CLIENT_AUTH": "required",
        "TXLOG_KAFKA_SSL_PRINCIPAL_MAPPING_RULES": "RULE:^CN=([^,]*),O=txlog-test$/$1/,DEFAULT",
        "TXLOG_KAFKA_SSL_HANDSHAKE_TIMEOUT_MS": str(HANDSHAKE_TIMEOUT_MS),
    }


@pytest.fixture(scope="module")
def cluster(pg_admin_url: str, template_db: str, certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("listeners")
    with fresh_database(pg_admin_url, template_db) as url:
        broker = make_broker(url)
        try:
            made = security.create_principal(broker.db, certs.alice_name)
            security.add_acls(broker.db, security.admin_bindings(made.principal.name))
        finally:
            broker.db.dispose()
        gateways = [
            GatewayProcess(
                url, env=_env(certs), log_path=logs / f"gateway-{i}.log", node_id=i, listeners=LISTENERS, args=("--insecure",)
            )
            for i in (0, 1)
        ]
        try:
            for g in gateways:
                g.start()
            found = Cluster(gateways, certs, made.token)
            with _plain(found, 0) as conn:  # both gateways see each other
                wait_until(
                    lambda: len(conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers) == 2,
                    30,
                    0.2,
                    "both gateways in Metadata",
                )
            yield found
        finally:
            for g in gateways:
                g.stop()


def _tls(certs: Certs, pair: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca.cert))
    if pair is not None:
        context.load_cert_chain(str(pair.cert), str(pair.key))
    return context


def _plain(cluster: Cluster, node: int) -> RawConnection:
    return RawConnection(socket.create_connection(("127.0.0.1", cluster.gateways[node].ports["PLAINTEXT"]), timeout=10))


def _tls_raw(cluster: Cluster, node: int, listener: str, pair: Pair | None = None) -> RawConnection:
    sock = socket.create_connection(("127.0.0.1", cluster.gateways[node].ports[listener]), timeout=10)
    return RawConnection(_tls(cluster.certs, pair).wrap_socket(sock, server_hostname="127.0.0.1"))


def _sign_in(conn: RawConnection, username: str, password: str) -> Any:
    assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 0
    return conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": b"\x00" + username.encode() + b"\x00" + password.encode()})


def _refused(conn: RawConnection) -> bool:
    """Whether the gateway ends the connection instead of answering (a TLS alert, a reset or EOF)."""
    try:
        conn.send(ApiKey.ApiVersions, 0)
        return conn.read_frame() is None
    except (ssl.SSLError, ConnectionError, OSError):
        return True


def _brokers(answer: Any) -> list[tuple[int, str, int]]:
    return sorted((b.node_id, b.host, b.port) for b in answer.brokers)


# --- the endpoints of the client's listener ------------------------------------------------------


def test_metadata_names_the_endpoints_of_the_listener_asked(cluster: Cluster) -> None:
    for node in (0, 1):
        with _plain(cluster, node) as conn:
            assert _brokers(conn.request(ApiKey.Metadata, 1, {"topics": None})) == cluster.endpoints("PLAINTEXT")
        with _tls_raw(cluster, node, "SSL", cluster.certs.alice) as conn:
            assert _brokers(conn.request(ApiKey.Metadata, 1, {"topics": None})) == cluster.endpoints("SSL")
        with _tls_raw(cluster, node, "SASL_SSL") as conn:
            assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
            assert _brokers(conn.request(ApiKey.Metadata, 1, {"topics": None})) == cluster.endpoints("SASL_SSL")


def test_describe_cluster_and_find_coordinator_name_the_listeners_endpoints(cluster: Cluster) -> None:
    with _tls_raw(cluster, 1, "SSL", cluster.certs.alice) as conn:
        described = conn.request(ApiKey.DescribeCluster, 0, {"include_cluster_authorized_operations": False})
        assert described.error_code == 0
        assert sorted((b.broker_id, b.host, b.port) for b in described.brokers) == cluster.endpoints("SSL")
        found = conn.request(ApiKey.FindCoordinator, 1, {"key": f"g-{uuid.uuid4().hex}", "key_type": 0})
        assert found.error_code == 0 and (found.node_id, found.host, found.port) in cluster.endpoints("SSL")
        txn = conn.request(ApiKey.FindCoordinator, 1, {"key": "t", "key_type": 1})
        assert (txn.node_id, txn.host, txn.port) == cluster.endpoints("SSL")[1]  # any gateway coordinates: the one asked
    with _plain(cluster, 0) as conn:
        described = conn.request(ApiKey.DescribeCluster, 0, {"include_cluster_authorized_operations": False})
        assert sorted((b.broker_id, b.host, b.port) for b in described.brokers) == cluster.endpoints("PLAINTEXT")


def test_describe_configs_names_every_listener_of_a_broker(cluster: Cluster) -> None:
    with _tls_raw(cluster, 0, "SSL", cluster.certs.alice) as conn:
        for node in (0, 1):
            answer = conn.request(
                ApiKey.DescribeConfigs,
                1,
                {
                    "resources": [
                        {
                            "resource_type": 4,
                            "resource_name": str(node),
                            "configuration_keys": ["listeners", "advertised.listeners"],
                        }
                    ],
                    "include_synonyms": False,
                },
            )
            [result] = answer.results
            assert result.error_code == 0, result.error_message
            expected = ",".join(f"{name}://127.0.0.1:{port}" for name, port in sorted(cluster.gateways[node].ports.items()))
            assert {c.name: c.value for c in result.configs} == {"listeners": expected, "advertised.listeners": expected}


def test_the_registry_records_every_listener_of_each_gateway(cluster: Cluster) -> None:
    from app.services import cluster as registry

    broker = make_broker(cluster.gateways[0].database_url)
    try:
        live = registry.live_node_listeners(broker)
    finally:
        broker.db.dispose()
    assert [(node_id, listeners) for node_id, _, _, listeners in live] == [
        (g.node_id, {name: ("127.0.0.1", port) for name, port in g.ports.items()}) for g in cluster.gateways
    ]


# --- mutual TLS ----------------------------------------------------------------------------------


def test_a_client_certificate_maps_to_its_principal(cluster: Cluster) -> None:
    with _tls_raw(cluster, 0, "SSL", cluster.certs.alice) as conn:
        assert conn.request(ApiKey.ApiVersions, 0).error_code == 0
        # a principal authenticated by its certificate has nothing to sign in to
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 34  # ILLEGAL_SASL_STATE


def test_certificates_that_name_no_active_principal_are_refused(cluster: Cluster) -> None:
    with _tls_raw(cluster, 0, "SSL", cluster.certs.nobody) as conn:  # signed by the CA, no such principal
        assert _refused(conn)
    assert "which is no active principal" in cluster.gateways[0].log()
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):  # another CA: the handshake fails
        with _tls_raw(cluster, 0, "SSL", cluster.certs.stranger) as conn:
            assert _refused(conn)
            raise ConnectionError("refused after the handshake")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):  # no certificate where one is required
        with _tls_raw(cluster, 0, "SSL") as conn:
            assert _refused(conn)
            raise ConnectionError("refused after the handshake")
    with _tls_raw(cluster, 0, "SSL", cluster.certs.alice) as conn:  # the listener goes on
        assert conn.request(ApiKey.ApiVersions, 0).error_code == 0


def test_a_sasl_ssl_listener_signs_in_with_sasl_over_tls(cluster: Cluster) -> None:
    with _tls_raw(cluster, 1, "SASL_SSL") as conn:
        conn.send(ApiKey.Metadata, 1, {"topics": None})  # before sign-in: closed
        assert conn.read_frame() is None
    with _tls_raw(cluster, 1, "SASL_SSL") as conn:
        failed = _sign_in(conn, cluster.certs.alice_name, "txlog_not_the_token")
        assert failed.error_code == 58
    with _tls_raw(cluster, 1, "SASL_SSL") as conn:
        assert _sign_in(conn, cluster.certs.alice_name, cluster.alice_token).error_code == 0
        assert conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers


def test_a_tls_client_that_never_finishes_its_handshake_is_cut_off(cluster: Cluster) -> None:
    gateway = cluster.gateways[0]
    assert gateway.proc is not None
    threads = len(os.listdir(f"/proc/{gateway.proc.pid}/task"))
    stalled = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", gateway.ports["SSL"]), timeout=10)
        sock.sendall(b"\x16\x03\x01\x00\xff")  # a ClientHello's record header, and nothing more
        stalled.append(sock)
    with _plain(cluster, 0) as conn:  # meanwhile the others are served
        assert conn.request(ApiKey.ApiVersions, 0).error_code == 0
    started = time.monotonic()
    for sock in stalled:
        with sock:
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT_MS / 1000 + 5
    assert len(os.listdir(f"/proc/{gateway.proc.pid}/task")) <= threads
    with _tls_raw(cluster, 0, "SSL", cluster.certs.alice) as conn:
        assert conn.request(ApiKey.ApiVersions, 0).error_code == 0


# --- clients -------------------------------------------------------------------------------------


def _topic(cluster: Cluster) -> str:
    name = f"tls-{uuid.uuid4().hex[:10]}"
    broker = make_broker(cluster.gateways[0].database_url)
    try:
        topics.create_topic(broker, name, 2)
    finally:
        broker.db.dispose()
    return name


def _confluent(cluster: Cluster, listener: str) -> dict[str, object]:
    certs = cluster.certs
    if listener == "SSL":
        return {
            "bootstrap.servers": cluster.bootstrap("SSL"),
            "security.protocol": "SSL",
            "ssl.ca.location": str(certs.ca.cert),
            "ssl.certificate.location": str(certs.alice.cert),
            "ssl.key.location": str(certs.alice.key),
        }
    return {
        "bootstrap.servers": cluster.bootstrap("SASL_SSL"),
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(certs.ca.cert),
        "sasl.mechanism": "PLAIN",
        "sasl.username": certs.alice_name,
        "sasl.password": cluster.alice_token,
    }


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_confluent_kafka_produces_and_consumes(cluster: Cluster, listener: str) -> None:
    from confluent_kafka import Consumer, Producer

    topic = _topic(cluster)
    producer = Producer({**_confluent(cluster, listener), "enable.idempotence": True})
    for i in range(10):
        producer.produce(topic, f"m{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {**_confluent(cluster, listener), "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        seen: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(seen) < 10 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                seen.add(message.value())
        assert seen == {f"m{i}".encode() for i in range(10)}
    finally:
        consumer.close()


def _kafka_python(cluster: Cluster, listener: str) -> dict[str, object]:
    certs = cluster.certs
    if listener == "SSL":
        return {
            "bootstrap_servers": cluster.bootstrap("SSL"),
            "security_protocol": "SSL",
            "ssl_cafile": str(certs.ca.cert),
            "ssl_certfile": str(certs.alice.cert),
            "ssl_keyfile": str(certs.alice.key),
        }
    return {
        "bootstrap_servers": cluster.bootstrap("SASL_SSL"),
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(certs.ca.cert),
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": certs.alice_name,
        "sasl_plain_password": cluster.alice_token,
    }


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_kafka_python_produces_and_consumes(cluster: Cluster, listener: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = _topic(cluster)
    conf = _kafka_python(cluster, listener)
    producer = KafkaProducer(**conf)
    for i in range(4):
        producer.send(topic, f"kp{i}".encode(), partition=i % 2).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", **conf)
    try:
        assert sorted(polled_values(consumer, 4)) == [f"kp{i}".encode() for i in range(4)]
    finally:
        consumer.close()


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_aiokafka_produces_and_consumes(cluster: Cluster, listener: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    certs = cluster.certs
    topic = _topic(cluster)
    if listener == "SSL":
        context = create_ssl_context(cafile=str(certs.ca.cert), certfile=str(certs.alice.cert), keyfile=str(certs.alice.key))
        conf: dict[str, Any] = {"bootstrap_servers": cluster.bootstrap("SSL"), "security_protocol": "SSL", "ssl_context": context}
    else:
        context = create_ssl_context(cafile=str(certs.ca.cert))
        conf = {
            "bootstrap_servers": cluster.bootstrap("SASL_SSL"),
            "security_protocol": "SASL_SSL",
            "ssl_context": context,
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": certs.alice_name,
            "sasl_plain_password": cluster.alice_token,
        }

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        try:
            for i in range(4):
                await producer.send_and_wait(topic, f"ai{i}".encode(), partition=i % 2)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **conf)
        await consumer.start()
        try:
            got: list[bytes] = []
            while len(got) < 4:
                got.append((await asyncio.wait_for(consumer.getone(), 30)).value)
            return sorted(got)
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"ai{i}".encode() for i in range(4)]


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install kcat)")
@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_kcat_lists_produces_and_consumes(cluster: Cluster, listener: str) -> None:
    assert KCAT is not None
    certs = cluster.certs
    topic = _topic(cluster)
    if listener == "SSL":
        conf = [
            "-X",
            "security.protocol=ssl",
            "-X",
            f"ssl.ca.location={certs.ca.cert}",
            "-X",
            f"ssl.certificate.location={certs.alice.cert}",
            "-X",
            f"ssl.key.location={certs.alice.key}",
        ]
    else:
        conf = [
            "-X",
            "security.protocol=sasl_ssl",
            "-X",
            f"ssl.ca.location={certs.ca.cert}",
            "-X",
            "sasl.mechanism=PLAIN",
            "-X",
            f"sasl.username={certs.alice_name}",
            "-X",
            f"sasl.password={cluster.alice_token}",
        ]
    bootstrap = cluster.bootstrap(listener)
    listed = subprocess.run([KCAT, "-b", bootstrap, *conf, "-L", "-t", topic], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    for node_id, host, port in cluster.endpoints(listener):
        assert f"broker {node_id} at {host}:{port}" in listed.stdout, listed.stdout
    done = subprocess.run(
        [KCAT, "-b", bootstrap, *conf, "-P", "-t", topic, "-p", "0"],
        input="from kcat\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [KCAT, "-b", bootstrap, *conf, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.splitlines() == ["from kcat"], done.stderr


# --- what a gateway refuses to start with ----------------------------------------------------------


def _start(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TXLOG_")}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "kafka", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_listeners_that_would_let_anyone_in_are_refused(certs: Certs) -> None:
    port = free_port()
    tls = {"TXLOG_KAFKA_SSL_CERTFILE": str(certs.server.cert), "TXLOG_KAFKA_SSL_KEYFILE": str(certs.server.key)}
    refused = _start({"TXLOG_AUTH": "token"}, "--listeners", f"PLAINTEXT://127.0.0.1:{port}")
    assert refused.returncode == 2 and "authenticates no one" in refused.stderr and "--insecure" in refused.stderr
    refused = _start({"TXLOG_AUTH": "token", **tls}, "--listeners", f"SSL://127.0.0.1:{port}")
    assert refused.returncode == 2 and "TXLOG_KAFKA_SSL_CLIENT_AUTH=none" in refused.stderr
    refused = _start({"TXLOG_AUTH": "none", **tls}, "--listeners", f"SASL_SSL://127.0.0.1:{port}", "--insecure")
    assert refused.returncode == 2 and "set TXLOG_AUTH=token" in refused.stderr
    refused = _start({"TXLOG_AUTH": "token"}, "--listeners", f"SASL_SSL://127.0.0.1:{port}")
    assert refused.returncode == 2 and "TXLOG_KAFKA_SSL_CERTFILE" in refused.stderr
    refused = _start({"TXLOG_AUTH": "none"}, "--listeners", f"PLAINTEXT://0.0.0.0:{port}")
    assert refused.returncode == 2 and "TXLOG_AUTH=token" in refused.stderr
    refused = _start({"TXLOG_KAFKA_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}"}, "--listen", f"127.0.0.1:{port}")
    assert refused.returncode == 2 and "not both" in refused.stderr
    refused = _start({}, "--listeners", f"HTTP://127.0.0.1:{port}")
    assert refused.returncode == 2 and "No security protocol defined for listener HTTP" in refused.stderr
    refused = _start({"TXLOG_KAFKA_SSL_PRINCIPAL_MAPPING_RULES": "RULE:^CN=(.*)$"}, "--listen", f"127.0.0.1:{port}")
    assert refused.returncode == 2 and "Invalid rule" in refused.stderr


def test_named_listeners_and_tls_flags(pg_admin_url: str, template_db: str, certs: Certs, tmp_path: Path) -> None:
    """Listener names of one's own (listener.security.protocol.map), advertised.listeners, and the
    TLS settings given as flags of `txlog kafka`; without authentication on loopback."""
    with fresh_database(pg_admin_url, template_db) as url:
        gateway = GatewayProcess(
            url,
            log_path=tmp_path / "gateway.log",
            listeners={"INTERNAL": "PLAINTEXT", "EXTERNAL": "SSL"},
            args=("--ssl-certfile", str(certs.server.cert), "--ssl-keyfile", str(certs.server.key), "--ssl-client-auth", "none"),
        )
        gateway.env["TXLOG_KAFKA_ADVERTISED_LISTENERS"] = f"EXTERNAL://localhost:{gateway.ports['EXTERNAL']}"
        with gateway:
            with gateway.connect() as conn:
                assert _brokers(conn.request(ApiKey.Metadata, 1, {"topics": None})) == [
                    (0, "127.0.0.1", gateway.ports["INTERNAL"])
                ]
            sock = socket.create_connection(("127.0.0.1", gateway.ports["EXTERNAL"]), timeout=10)
            with RawConnection(_tls(certs).wrap_socket(sock, server_hostname="localhost")) as conn:  # no client certificate
                assert _brokers(conn.request(ApiKey.Metadata, 1, {"topics": None})) == [
                    (0, "localhost", gateway.ports["EXTERNAL"])
                ]
                assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 34
            assert "listener EXTERNAL (SSL)" in gateway.log()
