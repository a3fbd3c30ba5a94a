"""A RocketMQ message as a record of the log, so that every other way in reads it.

- body → the record's value (a GZIP body is inflated first, at most one byte past the log's
  value limit, so that the produce path refuses it by that limit and no bomb is inflated whole);
- tag, keys and the message id → headers named as RocketMQ names those properties in a stored
  message (``TAGS``; ``KEYS``, the keys joined by a space; ``UNIQ_KEY``, the id the client made),
  so a Kafka consumer, the HTTP API, SQL and Spark find them where a RocketMQ user would;
- user properties → headers of their own names (UTF-8 values); the names RocketMQ reserves for
  its own properties are refused, ILLEGAL_MESSAGE_PROPERTY_KEY, as a RocketMQ proxy refuses them;
- born timestamp → the record's timestamp (Kafka's CreateTime: the producer's clock);
- the record's key is the message group of a FIFO message (UTF-8), so Kafka's murmur2
  partitioner keeps a group on one partition, in the order sent, as a RocketMQ queue keeps it;
  null otherwise: RocketMQ's keys index a message, they do not place it (the gateway spreads
  other messages over the queues in turn, as the proxy does);
- a transactional message's own wait before its first check-back: the CHECK_IMMUNITY_TIME_IN_SECONDS
  user property (kept as a header, as the broker keeps the property), or the protocol's
  orphaned_transaction_recovery_duration (which the proxy turns into that property).

``as_message`` is the way back, for what the gateway sends a client: a record as RocketMQ's
message (a check-back's half message).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from api.rocketmq.status import RocketMQError
from app.domain.records import NewRecord
from app.wire.rocketmq.protocol import Code, Encoding, MessageType, definition

TAG_HEADER = "TAGS"
KEYS_HEADER = "KEYS"
MESSAGE_ID_HEADER = "UNIQ_KEY"
KEY_SEPARATOR = " "  # RocketMQ's MessageConst.KEY_SEPARATOR
CHECK_IMMUNITY_PROPERTY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
# The proxy's maxTransactionRecoverySecond: the longest a producer may ask a half message to wait.
MAX_TRANSACTION_RECOVERY_S = 3_600
# The proxy's maxDelayTimeMills (one day): the furthest a DELAY message's delivery time may be.
MAX_DELAY_MS = 86_400_000

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
    deliver_at_ms: int | None = None  # a DELAY message's delivery timestamp


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
    group = props.message_group if props.HasField("message_group") else None
    if group is not None and (not group.strip() or not group.isprintable()):
        raise RocketMQError(Code.ILLEGAL_MESSAGE_GROUP, f"illegal message group {group!r}: blank, or with a control character")
    key = group.encode() if group is not None else None
    record = NewRecord(key, _body(message, max_value_bytes), tuple(headers), timestamp_ms or None)
    deliver_at_ms = None
    if props.message_type == MessageType.DELAY and props.HasField("delivery_timestamp"):
        deliver_at_ms = props.delivery_timestamp.seconds * 1000 + props.delivery_timestamp.nanos // 1_000_000
    return Outgoing(topic, props.message_id, props.message_type, record, group, deliver_at_ms)


def check_delivery_time(deliver_at_ms: int, now_ms: int) -> None:
    """A DELAY message may wait at most ``MAX_DELAY_MS``, as the proxy's validateDelayTime has it."""
    if deliver_at_ms - now_ms > MAX_DELAY_MS:
        raise RocketMQError(
            Code.ILLEGAL_DELIVERY_TIME,
            f"the delivery time is {deliver_at_ms - now_ms} ms away; a message may be delayed {MAX_DELAY_MS} ms at most",
        )


def check_immunity_ms(message: Any) -> int | None:
    """A transactional message's own wait before its first check-back, in ms (None: its
    group's). The protocol's orphaned_transaction_recovery_duration, else the
    CHECK_IMMUNITY_TIME_IN_SECONDS property (whole seconds; -1 means the default, as the broker
    reads it)."""
    if message.system_properties.HasField("orphaned_transaction_recovery_duration"):
        seconds = message.system_properties.orphaned_transaction_recovery_duration.seconds
    elif CHECK_IMMUNITY_PROPERTY in message.user_properties:
        text = message.user_properties[CHECK_IMMUNITY_PROPERTY].strip()
        try:
            seconds = int(text)
        except ValueError:
            raise RocketMQError(Code.BAD_REQUEST, f"{CHECK_IMMUNITY_PROPERTY} must be whole seconds, not {text!r}") from None
        if seconds == -1:
            return None
    else:
        return None
    if not 0 <= seconds <= MAX_TRANSACTION_RECOVERY_S:
        raise RocketMQError(
            Code.BAD_REQUEST, f"the transaction recovery time must be 0 to {MAX_TRANSACTION_RECOVERY_S} seconds, not {seconds}"
        )
    return seconds * 1000


def as_message(topic: str, record: NewRecord, message_type: int) -> Any:
    """A record as RocketMQ's Message: its value the body, the headers this module writes back in
    their fields (tag, keys, message id), every other header but RocketMQ's reserved names a user
    property, the record's key the message group of a FIFO message, its timestamp the born
    timestamp, its value's CRC32 the body digest."""
    message = definition.Message(topic=definition.Resource(name=topic), body=record.value or b"")
    props = message.system_properties
    props.message_type = message_type
    props.body_encoding = Encoding.IDENTITY
    # A proxy gives every message its body's digest, and clients read it unguarded (the Node.js
    # client cannot decode a message without one, not even a check-back's).
    props.body_digest.type = definition.DigestType.CRC32
    props.body_digest.checksum = format(zlib.crc32(message.body) & 0xFFFFFFFF, "08X")
    for name, value in record.headers:
        text = (value or b"").decode("utf-8", "replace")
        if name == TAG_HEADER:
            props.tag = text
        elif name == KEYS_HEADER:
            props.keys.extend(k for k in text.split(KEY_SEPARATOR) if k)
        elif name == MESSAGE_ID_HEADER:
            props.message_id = text
        elif name not in RESERVED_PROPERTIES:
            message.user_properties[name] = text
    if message_type == MessageType.FIFO and record.key is not None:
        props.message_group = record.key.decode("utf-8", "replace")
    if record.timestamp_ms is not None:
        props.born_timestamp.FromMilliseconds(record.timestamp_ms)
    return message


def message_type_name(message_type: int) -> str:
    """``FIFO``, ``DELAY``, …; a number the protocol does not name, as the number."""
    return str(MessageType.Name(message_type)) if message_type in MessageType.values() else str(message_type)
