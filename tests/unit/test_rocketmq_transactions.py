"""The RocketMQ gateway's translation of FIFO and transactional messages, without a server: a
message group as the record's key, a transactional message's own immunity before its first
check-back, a stored record back as the message a check-back carries, the live producers'
topics (the producer groups a gateway can check), and the domain's first check with an immunity
of the message's own."""

from __future__ import annotations

import asyncio

import pytest

from api.rocketmq import messages
from api.rocketmq.clients import Clients
from api.rocketmq.status import RocketMQError
from app.domain import half_messages as hm
from app.wire.rocketmq.protocol import ClientType, Code, MessageType, definition


def _message(message_type: int = MessageType.NORMAL, **system: object) -> object:
    message = definition.Message(topic=definition.Resource(name="orders"), body=b"body")
    message.system_properties.message_id = "01ABC"
    message.system_properties.message_type = message_type
    for name, value in system.items():
        setattr(message.system_properties, name, value)
    return message


def test_a_fifo_messages_group_is_its_records_key() -> None:
    out = messages.translate(_message(MessageType.FIFO, message_group="customer-7"), 1024)
    assert out.record.key == b"customer-7" and out.message_group == "customer-7"
    assert messages.translate(_message(), 1024).record.key is None
    with pytest.raises(RocketMQError) as raised:
        messages.translate(_message(MessageType.FIFO, message_group="  "), 1024)
    assert raised.value.code == Code.ILLEGAL_MESSAGE_GROUP


def test_a_transactional_messages_own_immunity() -> None:
    message = _message(MessageType.TRANSACTION)
    assert messages.check_immunity_ms(message) is None
    message.user_properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] = "3"  # type: ignore[attr-defined]
    assert messages.check_immunity_ms(message) == 3000
    # the property passes through as a header, as a proxy passes it to the broker
    assert ("CHECK_IMMUNITY_TIME_IN_SECONDS", b"3") in messages.translate(message, 1024).record.headers
    message.user_properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] = "-1"  # type: ignore[attr-defined]
    assert messages.check_immunity_ms(message) is None  # the group's, as the broker reads -1
    message.system_properties.orphaned_transaction_recovery_duration.FromSeconds(10)  # type: ignore[attr-defined]
    assert messages.check_immunity_ms(message) == 10_000  # the protocol's field first
    for bad in ("soon", "3601"):
        other = _message(MessageType.TRANSACTION)
        other.user_properties["CHECK_IMMUNITY_TIME_IN_SECONDS"] = bad  # type: ignore[attr-defined]
        with pytest.raises(RocketMQError) as raised:
            messages.check_immunity_ms(other)
        assert raised.value.code == Code.BAD_REQUEST


def test_a_record_goes_back_as_the_message_it_was() -> None:
    sent = _message(MessageType.TRANSACTION, tag="paid")
    sent.system_properties.keys.extend(["order-1", "customer-7"])  # type: ignore[attr-defined]
    sent.user_properties["region"] = "eu-west"  # type: ignore[attr-defined]
    sent.system_properties.born_timestamp.FromMilliseconds(1_700_000_000_123)  # type: ignore[attr-defined]
    record = messages.translate(sent, 1024).record
    back = messages.as_message("orders", record, MessageType.TRANSACTION)
    props = back.system_properties
    assert (back.topic.name, back.body, props.message_id, props.tag) == ("orders", b"body", "01ABC", "paid")
    assert list(props.keys) == ["order-1", "customer-7"]
    assert dict(back.user_properties) == {"region": "eu-west"}
    assert props.message_type == MessageType.TRANSACTION
    assert props.born_timestamp.ToMilliseconds() == 1_700_000_000_123
    # a check-back's message carries its body's digest, as a proxy's does: the Node.js client
    # cannot decode a message without one
    assert (props.body_digest.type, props.body_digest.checksum) == (definition.DigestType.CRC32, "DBA80BB2")
    fifo = messages.translate(_message(MessageType.FIFO, message_group="g1"), 1024).record
    assert messages.as_message("orders", fifo, MessageType.FIFO).system_properties.message_group == "g1"


def test_the_producer_groups_a_gateway_can_check_are_its_live_producers_topics() -> None:
    async def scenario() -> None:
        clients = Clients()
        settings = definition.Settings(client_type=ClientType.PRODUCER)
        settings.publishing.topics.add(name="orders")
        clients.settings("producer@1", settings)
        assert clients.published_topics() == set()  # no Telemetry stream: nothing to push on
        stream = clients.open_stream("producer@1")
        assert clients.published_topics() == {"orders"}
        consumer = definition.Settings(client_type=ClientType.SIMPLE_CONSUMER)
        clients.settings("consumer@1", consumer)
        clients.open_stream("consumer@1")
        assert clients.published_topics() == {"orders"}
        clients.close_stream("producer@1", stream)
        assert clients.published_topics() == set()

    asyncio.run(scenario())


def test_a_message_may_shorten_or_lengthen_its_wait_before_the_first_check() -> None:
    group = hm.ProducerGroup("orders")
    assert hm.first_check_at(1_000, group) == 1_000 + hm.DEFAULT_CHECK_IMMUNITY_MS
    assert hm.first_check_at(1_000, group, 0) == 1_000
    assert hm.first_check_at(1_000, group, 60_000) == 61_000
