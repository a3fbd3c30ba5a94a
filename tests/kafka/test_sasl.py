"""Signing in on the wire: a gateway with TXLOG_AUTH=token lets a connection do nothing but
ApiVersions and SASL until it signs in, and signs clients in with SASL PLAIN — the username a
principal's name, the password its API token (the one identity of both doors: TXLOG_ADMIN_TOKEN's
principal ``admin`` included). Tested with confluent-kafka, kafka-python, aiokafka, kcat and raw
frames (SaslHandshake v0's bare tokens included)."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import struct
import subprocess
import uuid
from typing import Iterator

import pytest

from app.services import security, topics
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection, polled_values

ADMIN_TOKEN = "admin-" + secrets.token_hex(16)
KCAT = shutil.which("kcat")


@pytest.fixture(scope="module")
def secured(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway that authenticates: TXLOG_AUTH=token with an admin token."""
    log = tmp_path_factory.mktemp("sasl") / "gateway.log"
    with fresh_database(pg_admin_url, template_db) as url:
        env = {"TXLOG_AUTH": "token", "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN, "TXLOG_KAFKA_AUTO_CREATE_TOPICS": "true"}
        with GatewayProcess(url, env=env, log_path=log) as g:
            yield g


@pytest.fixture(scope="module")
def alice(secured: GatewayProcess) -> tuple[str, str]:
    """A principal of its own, with a token and All on every topic and group."""
    broker = make_broker(secured.database_url)
    try:
        made = security.create_principal(broker.db, f"alice-{uuid.uuid4().hex[:6]}")
        security.add_acls(broker.db, security.admin_bindings(made.principal.name))
        return made.principal.name, made.token
    finally:
        broker.db.dispose()


def _topic(secured: GatewayProcess) -> str:
    name = f"sasl-{uuid.uuid4().hex[:10]}"
    broker = make_broker(secured.database_url)
    try:
        topics.create_topic(broker, name, 1)
    finally:
        broker.db.dispose()
    return name


def _confluent(secured: GatewayProcess, username: str, password: str) -> dict[str, object]:
    return {
        "bootstrap.servers": secured.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": password,
    }


def test_confluent_kafka_signs_in_with_the_admin_token_and_produces_and_consumes(secured: GatewayProcess) -> None:
    from confluent_kafka import Consumer, Producer

    topic = _topic(secured)
    producer = Producer({**_confluent(secured, "admin", ADMIN_TOKEN), "enable.idempotence": True})
    producer.produce(topic, b"signed in")
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            **_confluent(secured, "admin", ADMIN_TOKEN),
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.subscribe([topic])
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                break
        assert message is not None and message.error() is None and message.value() == b"signed in"
    finally:
        consumer.close()


def test_confluent_kafka_with_a_wrong_password_fails_authentication(secured: GatewayProcess, alice: tuple[str, str]) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    name, _ = alice
    errors: list[KafkaError] = []
    admin = AdminClient({**_confluent(secured, name, "txlog_wrong_token"), "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    admin.poll(0)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert any("Invalid username or password" in e.str() for e in errors), errors


def test_kafka_python_signs_in_as_a_principal_with_its_token(secured: GatewayProcess, alice: tuple[str, str]) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    name, token = alice
    topic = _topic(secured)
    conf = {
        "bootstrap_servers": secured.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": name,
        "sasl_plain_password": token,
    }
    producer = KafkaProducer(**conf)
    producer.send(topic, b"from kafka-python").get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", **conf)
    try:
        assert polled_values(consumer, 1)[:1] == [b"from kafka-python"]
    finally:
        consumer.close()


def test_kafka_python_with_a_token_of_another_principal_fails(secured: GatewayProcess, alice: tuple[str, str]) -> None:
    from kafka.errors import KafkaError

    from kafka import KafkaAdminClient

    name, _ = alice
    with pytest.raises(KafkaError):  # kafka-python retries the bootstrap, then gives up
        KafkaAdminClient(
            bootstrap_servers=secured.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username=name,
            sasl_plain_password=ADMIN_TOKEN,
            bootstrap_timeout_ms=3000,
        ).close()
    assert "failed authentication from 127.0.0.1 with PLAIN: Authentication failed: Invalid username or password" in secured.log()


def test_aiokafka_signs_in_and_produces_and_consumes(secured: GatewayProcess, alice: tuple[str, str]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    name, token = alice
    topic = _topic(secured)
    conf = {
        "bootstrap_servers": secured.bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": name,
        "sasl_plain_password": token,
    }

    async def run() -> bytes:
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"from aiokafka")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **conf)
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), 30)
            return message.value
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == b"from aiokafka"


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install kcat)")
def test_kcat_signs_in_and_lists_and_produces(secured: GatewayProcess, alice: tuple[str, str]) -> None:
    assert KCAT is not None
    name, token = alice
    topic = _topic(secured)
    sasl = [
        "-X",
        "security.protocol=SASL_PLAINTEXT",
        "-X",
        "sasl.mechanism=PLAIN",
        "-X",
        f"sasl.username={name}",
        "-X",
        f"sasl.password={token}",
    ]
    done = subprocess.run(
        [KCAT, "-b", secured.bootstrap, *sasl, "-P", "-t", topic], input="from kcat\n", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [KCAT, "-b", secured.bootstrap, *sasl, "-C", "-t", topic, "-o", "beginning", "-e"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.splitlines() == ["from kcat"], done.stderr
    refused = subprocess.run([KCAT, "-b", secured.bootstrap, "-L", "-m", "5"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0


# --- raw frames --------------------------------------------------------------------------------------


def _plain(username: str, password: str) -> bytes:
    return b"\x00" + username.encode() + b"\x00" + password.encode()


def test_a_request_before_signing_in_closes_the_connection(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        assert conn.request(ApiKey.ApiVersions, 0).error_code == 0  # allowed before sign-in
        conn.send(ApiKey.Metadata, 1, {"topics": None})
        assert conn.closed_by_peer()
    assert secured.alive()


def test_sasl_handshake_v1_and_authenticate_then_requests_are_served(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        shake = conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"})
        assert shake.error_code == 0 and "PLAIN" in shake.mechanisms
        auth = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": _plain("admin", ADMIN_TOKEN)})
        assert auth.error_code == 0, auth.error_message
        assert conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers


def test_an_unknown_mechanism_is_named_and_closes(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        shake = conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "GSSAPI"})
        assert shake.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
        assert "PLAIN" in shake.mechanisms
        assert conn.closed_by_peer()


def test_a_wrong_token_is_sasl_authentication_failed_and_closes(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"})
        auth = conn.request(ApiKey.SaslAuthenticate, 1, {"auth_bytes": _plain("admin", "not-the-token")})
        assert auth.error_code == 58 and "Invalid username or password" in auth.error_message
        assert conn.closed_by_peer()


def test_authenticate_without_a_handshake_is_illegal_sasl_state(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        auth = conn.request(ApiKey.SaslAuthenticate, 0, {"auth_bytes": _plain("admin", ADMIN_TOKEN)})
        assert auth.error_code == 34  # ILLEGAL_SASL_STATE
        assert conn.closed_by_peer()


def test_handshake_v0_takes_bare_tokens(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        assert conn.request(ApiKey.SaslHandshake, 0, {"mechanism": "PLAIN"}).error_code == 0
        token = _plain("admin", ADMIN_TOKEN)
        conn.send_bytes(struct.pack(">i", len(token)) + token)
        assert conn.read_frame() == b""  # PLAIN's empty answer, bare
        assert conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers


def test_a_frame_above_the_sign_in_bound_closes_at_once(secured: GatewayProcess) -> None:
    with secured.connect() as conn:
        conn.send_bytes(struct.pack(">i", 100 * 1024 * 1024))  # a 100 MB token announced, never sent
        assert conn.closed_by_peer()
    with secured.connect() as conn:  # the gateway goes on
        assert conn.request(ApiKey.ApiVersions, 0).error_code == 0


def test_an_open_gateway_answers_a_handshake_illegal_sasl_state(raw: RawConnection) -> None:
    assert raw.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 34
