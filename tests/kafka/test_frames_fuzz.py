"""Corrupt frames thrown at a running gateway over raw sockets: random bytes, size prefixes above
the limit or below a header, truncated frames, valid headers with garbage bodies, unknown API keys
and versions, valid requests with bytes flipped. Each such connection is closed or answered with
whole, well-formed frames carrying the sender's correlation id; meanwhile one healthy connection
keeps being answered, the process stays up and logs no crash."""

from __future__ import annotations

import socket
import struct
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.kafka import versions
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.requests import HEADER_MIN_BYTES
from app.wire.kafka.structs import encode_request
from tests.conftest import fresh_database
from tests.kafka.conftest import GatewayProcess, RawConnection

MAX_FRAME = 65_536

# Valid requests of every served API, to cut short, mutate, or give a garbage body to.
VALID = [
    encode_request(ApiKey.ApiVersions, 3, {"client_software_name": "fuzz", "client_software_version": "1"}, 1),
    encode_request(ApiKey.ApiVersions, 0, {}, 2),
    encode_request(ApiKey.Metadata, 12, {"topics": [{"name": "fuzz-a"}, {"name": "fuzz-b"}]}, 3),
    encode_request(ApiKey.Metadata, 1, {"topics": None}, 4),
    encode_request(
        ApiKey.CreateTopics,
        7,
        {
            "topics": [
                {
                    "name": "fuzz-c",
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "configs": [{"name": "retention.ms", "value": "1"}],
                }
            ]
        },
        5,
    ),
    encode_request(ApiKey.FindCoordinator, 4, {"key_type": 0, "coordinator_keys": ["g1", "g2"]}, 6),
    encode_request(ApiKey.FindCoordinator, 0, {"key": "g"}, 7),
    encode_request(
        ApiKey.Produce,
        9,
        {
            "acks": -1,
            "timeout_ms": 10,
            "topic_data": [{"name": "fuzz-a", "partition_data": [{"index": 0, "records": b"\x00" * 61}]}],
        },
        8,
    ),
]
KEYS = sorted({*versions.BY_KEY, ApiKey.Produce, ApiKey.Fetch, ApiKey.SaslHandshake, ApiKey.DescribeConfigs, 75, 999, -1, 32767})


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


random_bytes = st.binary(min_size=1, max_size=400)
bad_sizes = st.one_of(st.integers(MAX_FRAME + 1, 2**31 - 1), st.integers(-(2**31), HEADER_MIN_BYTES - 1)).flatmap(
    lambda size: st.binary(max_size=64).map(lambda tail: struct.pack(">i", size) + tail)
)
truncated = st.sampled_from(VALID).flatmap(lambda frame: st.integers(1, len(frame) - 1).map(lambda cut: frame[:cut]))


@st.composite
def garbage_bodies(draw: st.DrawFn) -> bytes:
    api_key = draw(st.sampled_from(KEYS))
    version = draw(st.integers(-1, 20))
    client_id = draw(st.one_of(st.none(), st.binary(max_size=12)))
    header = struct.pack(">hhi", api_key, version, draw(st.integers(0, 2**31 - 1)))
    header += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return framed(header + draw(st.binary(max_size=200)))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(4, len(frame) - 1))  # the size prefix stays right
        frame[at] = draw(st.integers(0, 255))
    return bytes(frame)


corrupt = st.one_of(random_bytes, bad_sizes, truncated, garbage_bodies(), mutated())


@pytest.fixture(scope="module")
def fuzz_gateway(pg_admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("fuzz-gateway") / "gateway.log"
    env = {"TXLOG_KAFKA_MAX_FRAME_BYTES": str(MAX_FRAME), "TXLOG_KAFKA_AUTO_CREATE_TOPICS": "false"}
    with fresh_database(pg_admin_url, template_db) as url, GatewayProcess(url, env=env, log_path=log) as g:
        yield g


@pytest.fixture(scope="module")
def healthy(fuzz_gateway: GatewayProcess) -> Iterator[RawConnection]:
    with fuzz_gateway.connect() as conn:
        yield conn


def exchange(gateway: GatewayProcess, data: bytes) -> bytes:
    """Send ``data``, end the sending side, and read until the gateway closes: what it answered."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=15) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed before everything was sent
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received


def sent_correlation_ids(data: bytes) -> list[int]:
    """The correlation id of each whole frame in ``data`` that has a request header's room."""
    ids, pos = [], 0
    while pos + 4 <= len(data):
        size = struct.unpack_from(">i", data, pos)[0]
        if size < HEADER_MIN_BYTES or pos + 4 + size > len(data):
            break
        ids.append(struct.unpack_from(">i", data, pos + 8)[0])
        pos += 4 + size
    return ids


def assert_healthy(conn: RawConnection) -> None:
    versions_answer = conn.request(ApiKey.ApiVersions, 3, {"client_software_name": "healthy", "client_software_version": "1"})
    assert versions_answer.error_code == 0 and len(versions_answer.api_keys) == len(versions.APIS)
    metadata = conn.request(ApiKey.Metadata, 12, {"topics": None})
    assert [b.node_id for b in metadata.brokers] == [0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=corrupt)
def test_corrupt_frames_close_or_answer_only_their_connection(
    fuzz_gateway: GatewayProcess, healthy: RawConnection, data: bytes
) -> None:
    received = exchange(fuzz_gateway, data)
    expected = sent_correlation_ids(data)
    pos, answered = 0, []
    while pos < len(received):
        assert pos + 4 <= len(received), f"a cut size prefix in {received!r}"
        size = struct.unpack_from(">i", received, pos)[0]
        assert size >= 4 and pos + 4 + size <= len(received), f"a cut answer in {received!r}"
        answered.append(struct.unpack_from(">i", received, pos + 4)[0])
        pos += 4 + size
    # answers come in order, one per request at most (acks=0 Produce has none), each to a request sent
    assert answered == expected[: len(answered)], (answered, expected)
    assert_healthy(healthy)
    assert fuzz_gateway.alive()


def test_the_gateway_survived_the_fuzzing(fuzz_gateway: GatewayProcess, healthy: RawConnection) -> None:
    from confluent_kafka.admin import AdminClient

    assert_healthy(healthy)
    metadata = AdminClient({"bootstrap.servers": fuzz_gateway.bootstrap}).list_topics(timeout=30)
    assert list(metadata.brokers) == [0]
    assert fuzz_gateway.alive()
    log = fuzz_gateway.log()
    assert "closing the connection" in log  # the fuzzing did reach the gateway
    assert "Traceback" not in log, log[-5000:]
