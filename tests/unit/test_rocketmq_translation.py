"""The RocketMQ gateway's translation, without a server: a message as a record (headers, body,
timestamp, refusals) and the registry of clients whose Telemetry streams the gateway pushes on."""

from __future__ import annotations

import asyncio
import gzip

import pytest

from api.rocketmq import messages, settings
from api.rocketmq.clients import Clients
from api.rocketmq.status import RocketMQError
from app.wire.rocketmq.protocol import ClientType, Code, Encoding, MessageType, definition, service


def _message(body: bytes = b"body", **system: object) -> object:
    message = definition.Message(topic=definition.Resource(name="orders"), body=body)
    message.system_properties.message_id = "01ABC"
    message.system_properties.message_type = MessageType.NORMAL
    for name, value in system.items():
        if name == "keys":
            message.system_properties.keys.extend(value)  # type: ignore[arg-type]
        else:
            setattr(message.system_properties, name, value)
    return message


def test_a_message_becomes_a_record_with_rocketmqs_property_names_as_headers() -> None:
    message = _message(tag="created", keys=["order-1", "customer-7"])
    message.user_properties["region"] = "eu-west"  # type: ignore[attr-defined]
    message.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_123)  # type: ignore[attr-defined]
    out = messages.translate(message, 1024)
    assert (out.topic, out.message_id, out.message_type) == ("orders", "01ABC", MessageType.NORMAL)
    assert out.record.key is None and out.record.value == b"body"
    assert out.record.timestamp_ms == 1_700_000_000_123
    assert dict(out.record.headers) == {
        "TAGS": b"created",
        "KEYS": b"order-1 customer-7",
        "UNIQ_KEY": b"01ABC",
        "region": b"eu-west",
    }


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda m: setattr(m.system_properties, "tag", " "), Code.ILLEGAL_MESSAGE_TAG),
        (lambda m: m.system_properties.keys.append(""), Code.ILLEGAL_MESSAGE_KEY),
        (lambda m: m.user_properties.__setitem__("TRAN_MSG", "true"), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (lambda m: setattr(m.system_properties, "message_id", ""), Code.ILLEGAL_MESSAGE_ID),
        (lambda m: setattr(m, "body", b""), Code.MESSAGE_BODY_EMPTY),
        (lambda m: setattr(m.topic, "resource_namespace", "tenant"), Code.BAD_REQUEST),
        (lambda m: setattr(m.topic, "name", ""), Code.ILLEGAL_TOPIC),
        (lambda m: setattr(m.system_properties, "body_encoding", 7), Code.UNSUPPORTED),
    ],
)
def test_what_a_proxy_refuses_is_refused_with_its_code(change: object, code: int) -> None:
    message = _message()
    change(message)  # type: ignore[operator]
    with pytest.raises(RocketMQError) as raised:
        messages.translate(message, 1024)
    assert raised.value.code == code


def test_a_gzip_body_is_inflated_no_further_than_one_byte_past_the_limit() -> None:
    out = messages.translate(_message(gzip.compress(b"hello"), body_encoding=Encoding.GZIP), 1024)
    assert out.record.value == b"hello"
    bomb = _message(gzip.compress(b"\0" * 10_000_000), body_encoding=Encoding.GZIP)
    assert len(messages.translate(bomb, 1024).record.value or b"") == 1025  # the produce path refuses it by size


def test_a_producers_settings_are_answered_with_the_servers_word() -> None:
    sent = definition.Settings(client_type=ClientType.PRODUCER)
    sent.publishing.topics.add(name="orders")
    sent.publishing.max_body_size = 128 << 20
    sent.metric.on = True
    answer = settings.answer(sent, 1 << 20)
    assert answer.publishing.max_body_size == 1 << 20 and answer.publishing.validate_message_type
    assert [t.name for t in answer.publishing.topics] == ["orders"]
    assert answer.backoff_policy.max_attempts == 3
    assert answer.backoff_policy.exponential_backoff.initial.ToMilliseconds() == 10
    assert not answer.metric.on
    assert sent.publishing.max_body_size == 128 << 20  # the client's own left as it was


def test_clients_are_found_by_the_topics_they_publish_and_reached_on_their_streams() -> None:
    async def scenario() -> None:
        clients = Clients()
        publishing = definition.Settings(client_type=ClientType.PRODUCER)
        publishing.publishing.topics.add(name="orders")
        clients.settings("p1", publishing)
        assert clients.publishers_of("orders") == []  # no stream to reach it on
        stream = clients.open_stream("p1")
        assert [c.client_id for c in clients.publishers_of("orders")] == ["p1"]
        assert clients.publishers_of("payments") == []
        command = service.TelemetryCommand()
        assert clients.push("p1", command) and stream.get_nowait() is command
        assert not clients.push("nobody", command)
        clients.terminated("p1")
        assert clients.get("p1") is None and not clients.push("p1", command)
        clients.close()  # the gateway stops: every stream open ends, a forgotten client's too
        assert stream.get_nowait() is None

    asyncio.run(scenario())


def test_a_message_type_the_protocol_does_not_name_is_named_by_its_number() -> None:
    assert messages.message_type_name(MessageType.FIFO) == "FIFO"
    assert messages.message_type_name(99) == "99"


def test_routes_name_the_advertised_host_else_the_access_point_the_client_asked_through() -> None:
    from typing import Any, cast

    from api.rocketmq.server import Gateway
    from app.wire.rocketmq.protocol import AddressScheme

    asked = definition.Endpoints(addresses=[definition.Address(host="mq.example.com", port=80)])
    gateway = Gateway(cast(Any, None))
    gateway.advertised = ("", 8081)  # listening on every address, no advertised host
    named = gateway.endpoints(asked)
    assert (named.scheme, [(a.host, a.port) for a in named.addresses]) == (AddressScheme.DOMAIN_NAME, [("mq.example.com", 8081)])
    gateway.advertised = ("10.0.0.7", 8081)
    named = gateway.endpoints(asked)
    assert (named.scheme, [(a.host, a.port) for a in named.addresses]) == (AddressScheme.IPv4, [("10.0.0.7", 8081)])
    gateway.advertised = ("::1", 8081)
    assert gateway.endpoints(None).scheme == AddressScheme.IPv6
