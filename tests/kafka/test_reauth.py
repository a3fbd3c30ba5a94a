"""KIP-368 re-authentication (TXLOG_KAFKA_CONNECTIONS_MAX_REAUTH_MS, Kafka's
connections.max.reauth.ms): SaslAuthenticate v1+ tells the client its session's lifetime; the
client signs in again on the same connection before it ends, as the same principal; a connection
whose session ended is closed at its next request, as Kafka closes an expired channel. Tested with
raw frames and confluent-kafka (librdkafka re-authenticates when told a lifetime)."""

from __future__ import annotations

import secrets
import time
import uuid
from typing import Any, Iterator

import pytest

from app.services import security, topics
from app.wire.kafka.messages import ApiKey
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.support import wait_until

ADMIN_TOKEN = "admin-" + secrets.token_hex(16)
LIFETIME_MS = 3000


@pytest.fixture(scope="module")
def reauth(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("reauth") / "gateway.log"
    with fresh_database(pg_admin_url, template_db) as url:
        env = {
            "TXLOG_AUTH": "token",
            "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN,
            "TXLOG_KAFKA_AUTO_CREATE_TOPICS": "true",
            "TXLOG_KAFKA_CONNECTIONS_MAX_REAUTH_MS": str(LIFETIME_MS),
        }
        with GatewayProcess(url, env=env, log_path=log) as g:
            yield g


def _principal(gateway: GatewayProcess) -> tuple[str, str]:
    """A new principal, once the gateway knows it (it reloads principals within a poll)."""
    broker = make_broker(gateway.database_url)
    try:
        made = security.create_principal(broker.db, f"p-{uuid.uuid4().hex[:8]}")
        security.add_acls(broker.db, security.admin_bindings(made.principal.name))
    finally:
        broker.db.dispose()
    name, token = made.principal.name, made.token

    def known() -> bool:
        with gateway.connect() as conn:
            return bool(_sign_in(conn, name, token).error_code == 0)

    wait_until(known, 30, 0.1, f"the gateway to know {name}")
    return name, token


def _plain(username: str, password: str) -> bytes:
    return b"\x00" + username.encode() + b"\x00" + password.encode()


def _sign_in(conn: RawConnection, username: str, password: str, mechanism: str = "PLAIN", version: int = 2) -> Any:
    shake = conn.request(ApiKey.SaslHandshake, 1, {"mechanism": mechanism})
    if shake.error_code:
        return shake
    return conn.request(ApiKey.SaslAuthenticate, version, {"auth_bytes": _plain(username, password)})


def _answered(conn: RawConnection) -> bool:
    """Whether a Metadata request is still answered (False: the gateway closed the connection)."""
    try:
        conn.send(ApiKey.Metadata, 1, {"topics": []})
        return conn.read_frame() is not None
    except ConnectionError:
        return False


def test_sasl_authenticate_answers_the_session_lifetime(reauth: GatewayProcess) -> None:
    with reauth.connect() as conn:
        auth = _sign_in(conn, "admin", ADMIN_TOKEN, version=1)
        assert auth.error_code == 0 and auth.session_lifetime_ms == LIFETIME_MS


def test_a_session_that_ended_closes_the_connection_at_its_next_request(reauth: GatewayProcess) -> None:
    with reauth.connect() as conn:
        signed_in = time.monotonic()
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
        wait_until(lambda: not _answered(conn), LIFETIME_MS / 1000 + 10, 0.2, "the expired session to be closed")
        assert time.monotonic() - signed_in >= LIFETIME_MS / 1000
    assert "Disconnecting expired channel" in reauth.log()
    with reauth.connect() as conn:  # the others go on
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0


def test_re_authentication_as_the_same_principal_renews_the_session(reauth: GatewayProcess) -> None:
    name, token = _principal(reauth)
    with reauth.connect() as conn:
        first = time.monotonic()
        assert _sign_in(conn, name, token).error_code == 0
        assert _answered(conn)
        # KIP-368 allows one re-authentication a second: wait for that second by asking
        wait_until(lambda: _answered(conn) and time.monotonic() - first > 1.2, 10, 0.2, "a second to pass")
        again = _sign_in(conn, name, token)
        assert again.error_code == 0 and again.session_lifetime_ms == LIFETIME_MS
        # served past the first session's end
        wait_until(
            lambda: _answered(conn) and time.monotonic() - first > LIFETIME_MS / 1000 + 0.3,
            10,
            0.2,
            "the first session's end to pass",
        )
    assert f"re-authenticated {name}" in reauth.log()


def test_re_authentication_cannot_change_the_principal(reauth: GatewayProcess) -> None:
    name, token = _principal(reauth)
    with reauth.connect() as conn:
        started = time.monotonic()
        assert _sign_in(conn, name, token).error_code == 0
        wait_until(lambda: _answered(conn) and time.monotonic() - started > 1.2, 10, 0.2, "a second to pass")
        changed = _sign_in(conn, "admin", ADMIN_TOKEN)
        assert changed.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert changed.error_message == f"Cannot change principals during re-authentication from User.{name}: User.admin"
        assert conn.closed_by_peer()


def test_re_authentication_with_another_mechanism_is_refused(reauth: GatewayProcess) -> None:
    with reauth.connect() as conn:
        started = time.monotonic()
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
        wait_until(lambda: _answered(conn) and time.monotonic() - started > 1.2, 10, 0.2, "a second to pass")
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "SCRAM-SHA-512"}).error_code == 33
        assert conn.closed_by_peer()


def test_only_sasl_authenticate_may_come_during_re_authentication(reauth: GatewayProcess) -> None:
    with reauth.connect() as conn:
        started = time.monotonic()
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
        wait_until(lambda: _answered(conn) and time.monotonic() - started > 1.2, 10, 0.2, "a second to pass")
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 0
        conn.send(ApiKey.Metadata, 1, {"topics": []})
        assert conn.read_frame() is None


def test_a_re_authentication_token_is_bounded_as_a_sign_in(reauth: GatewayProcess) -> None:
    import struct

    with reauth.connect() as conn:
        started = time.monotonic()
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
        wait_until(lambda: _answered(conn) and time.monotonic() - started > 1.2, 10, 0.2, "a second to pass")
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 0
        conn.send_bytes(struct.pack(">i", 100 * 1024 * 1024))  # a 100 MB token announced
        assert conn.closed_by_peer()


def test_a_second_re_authentication_within_a_second_is_illegal(reauth: GatewayProcess) -> None:
    with reauth.connect() as conn:
        started = time.monotonic()
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
        wait_until(lambda: _answered(conn) and time.monotonic() - started > 1.2, 10, 0.2, "a second to pass")
        assert _sign_in(conn, "admin", ADMIN_TOKEN).error_code == 0
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 34  # ILLEGAL_SASL_STATE


def test_a_principal_revoked_meanwhile_fails_re_authentication(reauth: GatewayProcess) -> None:
    name, token = _principal(reauth)
    with reauth.connect() as conn:
        assert _sign_in(conn, name, token).error_code == 0
        broker = make_broker(reauth.database_url)
        try:
            security.revoke_principal(broker.db, name)
        finally:
            broker.db.dispose()

        def refused_afresh() -> bool:
            with reauth.connect() as fresh:
                return bool(_sign_in(fresh, name, token).error_code == 58)

        wait_until(refused_afresh, 30, 0.2, "the gateway to see the revocation")
        again = _sign_in(conn, name, token)
        assert again.error_code == 58
        assert conn.closed_by_peer()
    assert "failed re-authentication from 127.0.0.1 with PLAIN" in reauth.log()


def test_confluent_kafka_re_authenticates_and_keeps_producing(reauth: GatewayProcess) -> None:
    from confluent_kafka import Producer

    name, token = _principal(reauth)
    topic = f"reauth-{uuid.uuid4().hex[:8]}"
    broker = make_broker(reauth.database_url)
    try:
        topics.create_topic(broker, topic, 1)
    finally:
        broker.db.dispose()
    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": reauth.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": name,
            "sasl.password": token,
            "enable.idempotence": True,
            "error_cb": errors.append,
        }
    )
    delivered: list[Any] = []
    started = time.monotonic()
    sent = 0
    # three sessions' worth of producing on the same connections
    while time.monotonic() - started < 3 * LIFETIME_MS / 1000 or f"re-authenticated {name}" not in reauth.log():
        assert time.monotonic() - started < 60, "librdkafka never re-authenticated"
        producer.produce(topic, f"r{sent}".encode(), on_delivery=lambda err, msg: delivered.append(err))
        sent += 1
        producer.flush(10)
    assert producer.flush(30) == 0
    assert len(delivered) == sent and all(err is None for err in delivered), delivered
    assert errors == []
    assert "Disconnecting expired channel" not in "\n".join(line for line in reauth.log().splitlines() if name in line)


def test_kafka_python_re_authenticates_and_keeps_producing(reauth: GatewayProcess) -> None:
    from kafka import KafkaProducer

    name, token = _principal(reauth)
    topic = f"reauth-kp-{uuid.uuid4().hex[:8]}"
    broker = make_broker(reauth.database_url)
    try:
        topics.create_topic(broker, topic, 1)
    finally:
        broker.db.dispose()
    producer = KafkaProducer(
        bootstrap_servers=reauth.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=name,
        sasl_plain_password=token,
    )
    try:
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < 2 * LIFETIME_MS / 1000 or f"re-authenticated {name}" not in reauth.log():
            assert time.monotonic() - started < 60, "kafka-python never re-authenticated"
            producer.send(topic, f"k{sent}".encode()).get(timeout=30)
            sent += 1
    finally:
        producer.close()
    assert f"the session of {name!r} ended" not in reauth.log()


def test_aiokafka_which_does_not_re_authenticate_reconnects_when_its_session_ends(reauth: GatewayProcess) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer

    name, token = _principal(reauth)
    topic = f"reauth-ai-{uuid.uuid4().hex[:8]}"
    broker = make_broker(reauth.database_url)
    try:
        topics.create_topic(broker, topic, 1)
    finally:
        broker.db.dispose()

    async def run() -> int:
        producer = AIOKafkaProducer(
            bootstrap_servers=reauth.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username=name,
            sasl_plain_password=token,
            enable_idempotence=True,
        )
        await producer.start()
        try:
            sent = 0
            started = time.monotonic()
            while time.monotonic() - started < 2 * LIFETIME_MS / 1000 or f"the session of {name!r} ended" not in reauth.log():
                assert time.monotonic() - started < 60, "the session never ended"
                await producer.send_and_wait(topic, f"a{sent}".encode())
                sent += 1
            await producer.send_and_wait(topic, b"after")  # on a new connection
            return sent
        finally:
            await producer.stop()

    assert asyncio.run(run()) > 0
