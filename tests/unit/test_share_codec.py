"""The share-group APIs in the codec (``app.wire.kafka.messages``, schemas in app/wire/kafka/schemas):
every request and response version the codec knows decodes what it encodes; an unknown tagged field
is skipped; error bodies name every item asked for; and the first ShareGroupHeartbeat a real
confluent-kafka ``ShareConsumer`` sends reads as Kafka reads it."""

from __future__ import annotations

import base64
import socket
import struct
import threading
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.wire.kafka.direct_responses import uvarint
from app.wire.kafka.error_responses import error_body
from app.wire.kafka.messages import REQUESTS, RESPONSES, ApiKey, api_name, codec_versions, has_codec
from app.wire.kafka.requests import RequestHeader, decode_request, read_header
from app.wire.kafka.structs import build, decode_response, encode_request, encode_response

SHARE_KEYS = {
    ApiKey.ShareGroupHeartbeat: (1, 1),
    ApiKey.ShareGroupDescribe: (1, 1),
    ApiKey.ShareFetch: (1, 1),
    ApiKey.ShareAcknowledge: (1, 1),
    ApiKey.DescribeShareGroupOffsets: (0, 0),
    ApiKey.AlterShareGroupOffsets: (0, 0),
    ApiKey.DeleteShareGroupOffsets: (0, 0),
}
CASES = [(key, version) for key, (first, last) in SHARE_KEYS.items() for version in range(first, last + 1)]

_INTS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def _value(field: Any, version: int) -> st.SearchStrategy:
    """Any value of one field of a schema at ``version`` (null too where the version allows it)."""
    nullable = field.nullable_for_version_q(version)
    if field.is_struct_array():
        strategy: st.SearchStrategy = st.lists(_struct(field.array_of, version), max_size=3)
    elif field.is_array():
        strategy = st.lists(_value(field.array_of, version), max_size=4)
    elif field.is_struct():
        strategy = _struct(field, version)
    elif field.type_str in _INTS:
        bits = _INTS[field.type_str]
        strategy = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    elif field.type_str == "bool":
        strategy = st.booleans()
    elif field.type_str == "string":
        strategy = st.text(max_size=40)
    elif field.type_str == "uuid":
        strategy = st.uuids().filter(lambda u: u.int != 0)  # the zero UUID reads as null
    elif field.type_str in ("bytes", "records"):
        strategy = st.binary(max_size=200)
    else:
        raise AssertionError(f"no strategy for {field.type_str}")
    return st.none() | strategy if nullable else strategy


def _struct(schema: Any, version: int) -> st.SearchStrategy:
    """A dict of any of the struct's fields at ``version``: one left out takes the schema's default."""
    fields = {f.name: _value(f, version) for f in schema._fields if f.for_version_q(version) and f.tag is None}
    return st.fixed_dictionaries({}, optional=fields)


@pytest.mark.parametrize(("key", "version"), CASES, ids=[f"{api_name(k)}-v{v}" for k, v in CASES])
def test_the_codec_knows_exactly_the_versions_clients_send(key: int, version: int) -> None:
    assert codec_versions(key) == SHARE_KEYS[key]
    assert has_codec(key, version)
    assert not has_codec(key, SHARE_KEYS[key][0] - 1)  # the share APIs' v0 was Kafka 4.0's early access
    assert not has_codec(key, SHARE_KEYS[key][1] + 1)


@pytest.mark.parametrize(("key", "version"), CASES, ids=[f"{api_name(k)}-v{v}" for k, v in CASES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_request_and_response_decodes_what_it_encodes(key: int, version: int, data: st.DataObject) -> None:
    request_class = REQUESTS[key]
    request = data.draw(_struct(request_class._struct, version))
    frame = encode_request(key, version, request, correlation_id=7, client_id="c")
    decoded = decode_request(frame[4:])
    assert decoded.header == RequestHeader(key, version, 7, "c")
    assert decoded.body == build(request_class, version, request)

    response = data.draw(_struct(RESPONSES[key]._struct, version))
    framed = encode_response(RequestHeader(key, version, 9, "c"), response)
    correlation_id, answer = decode_response(key, version, bytes(framed[4:]))
    assert correlation_id == 9
    assert answer == build(key, version, response)


def _with_unknown_tag(frame: bytes) -> bytes:
    """``frame`` (size prefix included) with an unknown tagged field in its body's top-level tagged
    fields (the body's last byte, 0: none): Kafka skips tags it does not know, and so must we."""
    assert frame[-1] == 0
    tagged = b"\x01" + uvarint(27) + uvarint(3) + b"abc"
    body = frame[4:-1] + tagged
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize(("key", "version"), CASES, ids=[f"{api_name(k)}-v{v}" for k, v in CASES])
def test_an_unknown_tagged_field_is_skipped(key: int, version: int) -> None:
    frame = encode_request(key, version, {})
    plain = decode_request(frame[4:]).body
    tagged = decode_request(_with_unknown_tag(frame)[4:]).body
    assert tagged.to_dict() == plain.to_dict()

    framed = bytes(encode_response(RequestHeader(key, version, 1, None), {"throttle_time_ms": 5}))
    _, answer = decode_response(key, version, _with_unknown_tag(framed)[4:])
    assert answer.throttle_time_ms == 5


def test_the_heartbeat_request_is_laid_out_as_kafkas() -> None:
    """Kafka's ShareGroupHeartbeatRequest v1, field by field: compact strings and arrays (length + 1),
    the nullable rack (0: null), the body's tagged fields; after request header v2."""
    frame = encode_request(
        ApiKey.ShareGroupHeartbeat,
        1,
        {"group_id": "g", "member_id": "m1", "member_epoch": 0, "rack_id": None, "subscribed_topic_names": ["t"]},
        correlation_id=3,
        client_id="c",
    )
    header = struct.pack(">hhih", 76, 1, 3, 1) + b"c" + b"\x00"
    body = b"\x02g" + b"\x03m1" + struct.pack(">i", 0) + b"\x00" + b"\x02\x02t" + b"\x00"
    assert frame == struct.pack(">i", len(header + body)) + header + body


def test_the_heartbeat_response_is_laid_out_as_kafkas() -> None:
    """ShareGroupHeartbeatResponse v1, response header v1 (its tagged fields), the assignment a
    nullable struct (1: present, -1: null) of topic ids and partitions."""
    topic = uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF)
    body = {
        "member_id": "m1",
        "member_epoch": 4,
        "heartbeat_interval_ms": 5000,
        "assignment": {"topic_partitions": [{"topic_id": topic, "partitions": [0, 2]}]},
    }
    framed = bytes(encode_response(RequestHeader(ApiKey.ShareGroupHeartbeat, 1, 3, "c"), body))
    expected = (
        struct.pack(">i", 3)
        + b"\x00"  # correlation id, header tagged fields
        + struct.pack(">ih", 0, 0)
        + b"\x00"  # throttle, error code, null message
        + b"\x03m1"
        + struct.pack(">ii", 4, 5000)
        + b"\x01"
        + b"\x02"
        + topic.bytes
        + b"\x03"
        + struct.pack(">ii", 0, 2)
        + b"\x00"
        + b"\x00"  # assignment
        + b"\x00"
    )
    assert framed == struct.pack(">i", len(expected)) + expected
    # and null: no assignment change
    framed = bytes(encode_response(RequestHeader(ApiKey.ShareGroupHeartbeat, 1, 3, "c"), {"member_epoch": 4}))
    assert framed[-2:] == b"\xff\x00"  # null assignment, body tagged fields


def test_error_bodies_name_every_item_asked_for() -> None:
    describe = decode_request(encode_request(ApiKey.ShareGroupDescribe, 1, {"group_ids": ["a", "b"]})[4:])
    body = error_body(ApiKey.ShareGroupDescribe, 1, 16, "not the coordinator", describe.body)
    assert [(g["group_id"], g["error_code"], g["error_message"]) for g in body["groups"]] == [
        ("a", 16, "not the coordinator"),
        ("b", 16, "not the coordinator"),
    ]
    offsets = decode_request(
        encode_request(
            ApiKey.DescribeShareGroupOffsets,
            0,
            {
                "groups": [
                    {"group_id": "a", "topics": [{"topic_name": "t", "partitions": [0, 3]}]},
                    {"group_id": "b", "topics": None},
                ]
            },
        )[4:]
    )
    body = error_body(ApiKey.DescribeShareGroupOffsets, 0, 16, None, offsets.body)
    assert body["groups"][0]["error_code"] == body["groups"][1]["error_code"] == 16
    assert [(p["partition_index"], p["error_code"]) for p in body["groups"][0]["topics"][0]["partitions"]] == [(0, 16), (3, 16)]
    assert body["groups"][0]["topics"][0]["topic_name"] == "t"
    for key, version in CASES:  # top-level errors where the version has one
        if key not in (ApiKey.ShareGroupDescribe, ApiKey.DescribeShareGroupOffsets):
            assert error_body(key, version, 15, "x") == {"error_code": 15, "error_message": "x"}
        encode_response(RequestHeader(key, version, 0, None), error_body(key, version, 15, "x"))


def test_list_groups_filters_and_answers_share_groups() -> None:
    request = decode_request(encode_request(ApiKey.ListGroups, 5, {"types_filter": ["share"]})[4:])
    assert request.body.types_filter == ["share"]
    framed = encode_response(
        RequestHeader(ApiKey.ListGroups, 5, 1, None),
        {"groups": [{"group_id": "q", "protocol_type": "share", "group_state": "Stable", "group_type": "share"}]},
    )
    _, answer = decode_response(ApiKey.ListGroups, 5, bytes(framed[4:]))
    assert (answer.groups[0].group_type, answer.groups[0].protocol_type) == ("share", "share")


# -- a real share consumer's first heartbeat ---------------------------------------------------------


def _read_frame(conn: socket.socket) -> bytes | None:
    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = conn.recv(n - len(data))
            except ConnectionResetError:  # the client closed the connection abruptly, as librdkafka may
                return None
            if not chunk:
                return None
            data += chunk
        return data

    size = exactly(4)
    return None if size is None else exactly(struct.unpack(">i", size)[0])


class _ShareBroker:
    """A listener that answers what a share consumer asks before it heartbeats (ApiVersions, with
    the share APIs; Metadata; FindCoordinator: itself) and keeps the first ShareGroupHeartbeat."""

    def __init__(self, topic: str) -> None:
        self.topic, self.topic_id = topic, uuid.uuid4()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.heartbeat: bytes | None = None
        self.heard = threading.Event()
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while (frame := _read_frame(conn)) is not None:
                header = read_header(frame)
                if header.api_key == ApiKey.ShareGroupHeartbeat and self.heartbeat is None:
                    self.heartbeat = frame
                    self.heard.set()
                body = self._answer(header)
                if body is None:
                    continue  # not answered: the client waits
                conn.sendall(encode_response(header, body))

    def _answer(self, header: RequestHeader) -> dict[str, Any] | None:
        me = {"node_id": 0, "host": "127.0.0.1", "port": self.port}
        if header.api_key == ApiKey.ApiVersions:
            if not has_codec(ApiKey.ApiVersions, header.api_version):
                return None
            served = [(ApiKey.ApiVersions, 0, 3), (ApiKey.Metadata, 0, 12), (ApiKey.FindCoordinator, 0, 6)]
            served += [
                (key, *SHARE_KEYS[key]) for key in (ApiKey.ShareGroupHeartbeat, ApiKey.ShareFetch, ApiKey.ShareAcknowledge)
            ]
            return {"api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in served]}
        if header.api_key == ApiKey.Metadata:
            partition = {"partition_index": 0, "leader_id": 0, "replica_nodes": [0], "isr_nodes": [0]}
            return {
                "brokers": [me],
                "cluster_id": "c",
                "controller_id": 0,
                "topics": [{"name": self.topic, "topic_id": self.topic_id, "partitions": [partition]}],
            }
        if header.api_key == ApiKey.FindCoordinator:
            return {**me, "coordinators": [{"key": "g", **me}]}
        return None  # the heartbeat, and anything else, stays unanswered

    def close(self) -> None:
        self.closing = True
        self.server.close()


def test_a_share_consumers_first_heartbeat_reads_as_kafka_reads_it() -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    broker = _ShareBroker("jobs")
    consumer = confluent_kafka.ShareConsumer(
        {"bootstrap.servers": f"127.0.0.1:{broker.port}", "group.id": "workers", "socket.timeout.ms": 10000}
    )
    try:
        consumer.subscribe(["jobs"])
        for _ in range(20):  # the client's threads do the work; poll only drives it
            if broker.heard.is_set():
                break
            consumer.poll(0.25)
        assert broker.heard.wait(5), "no ShareGroupHeartbeat within 10 s"
    finally:
        broker.close()
        consumer.close()

    assert broker.heartbeat is not None
    request = decode_request(broker.heartbeat)
    assert (request.header.api_key, request.header.api_version) == (ApiKey.ShareGroupHeartbeat, 1)
    body = request.body
    assert body.group_id == "workers"
    assert body.member_epoch == 0
    assert body.subscribed_topic_names == ["jobs"]
    # KIP-1082: the member generates its id and sends it from its first heartbeat on: a UUID
    # written as Kafka writes its Uuid (URL-safe base64 of its 16 bytes, unpadded: 22 characters)
    assert len(body.member_id) == 22
    assert len(base64.urlsafe_b64decode(body.member_id + "==")) == 16
