"""A RocketMQ message as a record of the log, so that every other way in reads it.

- body → the record's value (a GZIP body is inflated first, at most one byte past the log's
  value limit, so that the produce path refuses it by that limit and no bomb is inflated whole);
- tag, keys and the message id → headers named as RocketMQ names those properties in a stored
  message (``TAGS``; ``KEYS``, the keys joined by a space; ``UNIQ_KEY``, the id the client made),
  so a Kafka consumer, the HTTP API, SQL and Spark find them where a RocketMQ user would;
- user properties → headers of their own names (UTF-8 values); the names RocketMQ reserves for
  its own properties are refused, ILLEGAL_MESSAGE_PROPERTY_KEY, as a RocketMQ proxy refuses them;
- born timestamp → the record's timestamp (Kafka's CreateTime: the producer's clock);
- the record's key stays null: RocketMQ's keys index a message, they do not place it (the
  gateway spreads NORMAL messages over the queues in turn, as the proxy does). The message
  group of a FIFO message is what will place one.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from api.rocketmq.status import RocketMQError
from app.domain.records import NewRecord
from app.wire.rocketmq.protocol import Code, Encoding, MessageType

TAG_HEADER = "TAGS"
KEYS_HEADER = "KEYS"
MESSAGE_ID_HEADER = "UNIQ_KEY"
KEY_SEPARATOR = " "  # RocketMQ's MessageConst.KEY_SEPARATOR

# Property names RocketMQ keeps for itself (its MessageConst's system properties, those a client
# could collide with): a user property of one of these names is refused.
RESERVED_PROPERTIES = frozenset(
    {
        TAG_HEADER,
        KEYS_HEADER,
        MESSAGE_ID_HEADER,
        "DELAY",
        "WAIT",
        "TRAN_MSG",
        "PGROUP",
        "TRANSACTION_CHECK_TIMES",
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "__SHARDINGKEY",
        "__STARTDELIVERTIME",
        "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS",
        "RECONSUME_TIME",
        "MAX_RECONSUME_TIMES",
        "REAL_TOPIC",
        "REAL_QID",
        "RETRY_TOPIC",
        "ORIGIN_MESSAGE_ID",
        "MIN_OFFSET",
        "MAX_OFFSET",
        "TRACE_ON",
        "MSG_REGION",
        "CLUSTER",
    }
)


@dataclass(frozen=True)
class Outgoing:
    """One message of a SendMessage request, translated."""

    topic: str
    message_id: str
    message_type: int
    record: NewRecord
    message_group: str | None = None


def topic_of(resource: Any) -> str:
    """A topic's name from RocketMQ's Resource. Namespaces have no counterpart in txlog's topics:
    a namespaced resource is refused rather than mapped to a name no other way in would use."""
    if resource.resource_namespace:
        raise RocketMQError(Code.BAD_REQUEST, f"namespaces are not served (namespace {resource.resource_namespace!r})")
    if not resource.name:
        raise RocketMQError(Code.ILLEGAL_TOPIC, "the topic is blank")
    return str(resource.name)


def _body(message: Any, max_value_bytes: int) -> bytes:
    body = bytes(message.body)
    encoding = message.system_properties.body_encoding
    if encoding == Encoding.GZIP:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            body = inflater.decompress(body, max_value_bytes + 1)
        except zlib.error as exc:
            raise RocketMQError(Code.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {exc}") from None
    elif encoding not in (Encoding.IDENTITY, Encoding.ENCODING_UNSPECIFIED):
        raise RocketMQError(Code.UNSUPPORTED, f"body encoding {encoding} is not served (IDENTITY and GZIP are)")
    if not body:
        raise RocketMQError(Code.MESSAGE_BODY_EMPTY, "the message body is empty")
    return body


def translate(message: Any, max_value_bytes: int) -> Outgoing:
    """One message of a SendMessage request as the record the log will hold."""
    topic = topic_of(message.topic)
    props = message.system_properties
    if not props.message_id:
        raise RocketMQError(Code.ILLEGAL_MESSAGE_ID, "the message has no message id")
    headers: list[tuple[str, bytes | None]] = []
    if props.HasField("tag"):
        if not props.tag.strip() or "|" in props.tag:
            raise RocketMQError(Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {props.tag!r}: blank, or with '|'")
        headers.append((TAG_HEADER, props.tag.encode()))
    if props.keys:
        if any(not key.strip() for key in props.keys):
            raise RocketMQError(Code.ILLEGAL_MESSAGE_KEY, "a message key is blank")
        headers.append((KEYS_HEADER, KEY_SEPARATOR.join(props.keys).encode()))
    headers.append((MESSAGE_ID_HEADER, props.message_id.encode()))
    for name, value in sorted(message.user_properties.items()):
        if name in RESERVED_PROPERTIES:
            raise RocketMQError(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {name!r} is reserved by RocketMQ")
        headers.append((name, value.encode()))
    born = props.born_timestamp
    timestamp_ms = born.seconds * 1000 + born.nanos // 1_000_000 if props.HasField("born_timestamp") else None
    record = NewRecord(None, _body(message, max_value_bytes), tuple(headers), timestamp_ms or None)
    group = props.message_group if props.HasField("message_group") else None
    return Outgoing(topic, props.message_id, props.message_type, record, group)


def message_type_name(message_type: int) -> str:
    """``FIFO``, ``DELAY``, …; a number the protocol does not name, as the number."""
    return str(MessageType.Name(message_type)) if message_type in MessageType.values() else str(message_type)
