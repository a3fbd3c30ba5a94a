"""Hostile sign-ins: each is closed (or refused) and the gateway goes on serving a connection that
signed in before, with no thread left behind: a wrong password, an unknown mechanism, a request
before signing in, a 100 MB token announced, garbage for a token, a sender that trickles its
sign-in byte by byte (bounded by TXLOG_KAFKA_AUTHENTICATION_TIMEOUT_MS as a whole), and a
thousand connections that never sign in (bounded by TXLOG_KAFKA_MAX_CONNECTIONS)."""

from __future__ import annotations

import os
import secrets
import select
import socket
import struct
import time
from typing import Iterator

import pytest

from app.wire.kafka.messages import ApiKey
from app.wire.kafka.structs import encode_request
from tests.conftest import fresh_database
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.support import wait_until

ADMIN_TOKEN = "admin-" + secrets.token_hex(16)
SIGN_IN_MS = 2000
MAX_CONNECTIONS = 50


@pytest.fixture(scope="module")
def guarded(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("limits") / "gateway.log"
    with fresh_database(pg_admin_url, template_db) as url:
        env = {
            "TXLOG_AUTH": "token",
            "TXLOG_ADMIN_TOKEN": ADMIN_TOKEN,
            "TXLOG_KAFKA_AUTHENTICATION_TIMEOUT_MS": str(SIGN_IN_MS),
            "TXLOG_KAFKA_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
            "TXLOG_DB_POOL_SIZE": "2",
        }
        with GatewayProcess(url, env=env, log_path=log) as g:
            yield g


def _sign_in(conn: RawConnection, password: str = ADMIN_TOKEN, mechanism: str = "PLAIN") -> int:
    shake = conn.request(ApiKey.SaslHandshake, 1, {"mechanism": mechanism})
    if shake.error_code:
        return int(shake.error_code)
    auth = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": b"\x00admin\x00" + password.encode()})
    return int(auth.error_code)


@pytest.fixture
def keeper(guarded: GatewayProcess) -> Iterator[RawConnection]:
    """A connection signed in before the trouble, served throughout; the gateway's thread pool warm."""
    with guarded.connect() as conn:
        assert _sign_in(conn) == 0
        for _ in range(4):
            assert conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers
        yield conn


def _threads(gateway: GatewayProcess) -> int:
    assert gateway.proc is not None
    return len(os.listdir(f"/proc/{gateway.proc.pid}/task"))


def _served(conn: RawConnection) -> bool:
    return bool(conn.request(ApiKey.Metadata, 1, {"topics": None}).brokers)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bad_sign_ins_close_their_connection_only(guarded: GatewayProcess, keeper: RawConnection) -> None:
    threads = _threads(guarded)
    with guarded.connect() as conn:  # a wrong password
        assert _sign_in(conn, "txlog_wrong") == 58 and conn.closed_by_peer()
    assert _served(keeper)
    with guarded.connect() as conn:  # an unknown mechanism
        assert _sign_in(conn, mechanism="GSSAPI") == 33 and conn.closed_by_peer()
    assert _served(keeper)
    with guarded.connect() as conn:  # a request before signing in
        conn.send(ApiKey.Produce, 9, {"acks": -1, "timeout_ms": 1000, "topic_data": []})
        assert conn.read_frame() is None
    assert _served(keeper)
    with guarded.connect() as conn:  # a 100 MB token announced
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 0
        conn.send_bytes(struct.pack(">i", 100 * 1024 * 1024))
        assert conn.closed_by_peer()
    assert _served(keeper)
    with guarded.connect() as conn:  # garbage for a PLAIN token
        assert conn.request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}).error_code == 0
        auth = conn.request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": b"\xff" * 1000})
        assert auth.error_code == 58 and conn.closed_by_peer()
    assert _served(keeper)
    with guarded.connect() as conn:  # bytes that are no request at all
        conn.send_bytes(struct.pack(">i", 12) + b"\x00\x99" + b"\xee" * 10)
        assert conn.closed_by_peer()
    assert _served(keeper)
    assert _threads(guarded) <= threads
    assert "Traceback" not in guarded.log()


def test_a_sign_in_trickled_byte_by_byte_is_cut_off_as_a_whole(guarded: GatewayProcess, keeper: RawConnection) -> None:
    handshake = encode_request(ApiKey.SaslHandshake, 1, {"mechanism": "PLAIN"}, 1, "slow")
    token = b"\x00admin\x00" + ADMIN_TOKEN.encode()
    authenticate = encode_request(ApiKey.SaslAuthenticate, 2, {"auth_bytes": token}, 2, "slow")
    stream = handshake + authenticate
    # Before connecting: the gateway's sign-in time runs from its accept, which may come before
    # this thread runs again after the connection is made.
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", guarded.port), timeout=10)
    with sock:
        sock.settimeout(0.2)  # one byte each time the gateway has said nothing for 0.2 s
        for i in range(len(stream)):
            try:
                data = sock.recv(65536)
                if data == b"":
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                break
            try:
                sock.sendall(stream[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("the whole sign-in was let through, byte by byte")
    elapsed = time.monotonic() - started
    assert SIGN_IN_MS / 1000 <= elapsed < SIGN_IN_MS / 1000 + 5
    assert _served(keeper)


def _open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the gateway has not closed (nothing to read: no end of stream yet)."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    return len(socks) - len(poller.poll(0))


def test_a_thousand_connections_that_never_sign_in_exhaust_nothing(guarded: GatewayProcess, keeper: RawConnection) -> None:
    threads = _threads(guarded)
    socks: list[socket.socket] = []
    try:
        for _ in range(1000):
            socks.append(socket.create_connection(("127.0.0.1", guarded.port), timeout=10))
        assert _served(keeper)
        # at most TXLOG_KAFKA_MAX_CONNECTIONS at once (the keeper is one): the others are closed at
        # once (within well under the time to sign in), those let in when their time to sign in is up
        wait_until(lambda: _open(socks) < MAX_CONNECTIONS, SIGN_IN_MS / 2000, 0.05, "the connections beyond the limit to close")
        started = time.monotonic()
        for sock in socks:
            assert _closed(sock)
        assert time.monotonic() - started < SIGN_IN_MS / 1000 + 5
    finally:
        for sock in socks:
            sock.close()
    assert _served(keeper)
    assert _threads(guarded) <= threads
    assert "refusing a connection from" in guarded.log()
    with guarded.connect() as conn:  # room again
        assert _sign_in(conn) == 0
