"""What a RocketMQ consumer receives, over the share groups' delivery state (KIP-932): receipt
handles, tag filters and records as RocketMQ messages.

- A consumer group is the txlog share group of the same name; a message queue is a partition.
- Each ReceiveMessage acquires as a member of its own (``acquisition_member``: the client id and
  a fresh suffix), so a receipt handle names one acquisition: the handle of an earlier delivery
  of the same message — to this client or another — no longer holds its lock and is refused.
- A receipt handle carries what AckMessage, ChangeInvisibleDuration and
  ForwardMessageToDeadLetterQueue need (``ReceiptHandle``): the topic, partition, offset,
  delivery count and the acquiring member. Anything else is refused INVALID_RECEIPT_HANDLE, as a
  proxy refuses a handle it cannot decode.
- Tag filters (``TagFilter``): ``*`` (or blank) every message, ``a || b`` those whose tag (the
  record's ``TAGS`` header) is one of them; a message without a tag matches ``*`` only, as
  RocketMQ's FilterUtils.isTagMatched has it. SQL92 filters are not served.
- The maximum delivery attempts (``max_attempts``): a proxy sends a message popped for a
  delivery beyond its group's maximum attempts to the dead-letter queue instead of delivering it.
  The share group archives a record once its delivery count reaches share.delivery.count.limit,
  so the attempts told to clients are one fewer: the limit's last acquisition is the one that
  dead-letters (``dead_lettered``).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass
from typing import Any

from api.rocketmq.messages import MESSAGE_ID_HEADER, TAG_HEADER, as_message
from api.rocketmq.status import RocketMQError
from app.domain.log import StoredRecord
from app.domain.records import NewRecord
from app.errors import ErrorCode
from app.wire.rocketmq.protocol import Code, MessageType, definition

HANDLE_PREFIX = "txlog1."
# Where tag expressions are split (RocketMQ's SubscriptionData.SUB_ALL and "||").
SUB_ALL = "*"
TAG_SEPARATOR = "||"
# The namespace of message ids made for records that carry none (a Kafka client's, HTTP's):
# the same record has the same id at every delivery.
_RECORD_IDS = uuid.UUID("6f1c2a52-8d1e-4a33-9f3e-5b0a7c1d2e4f")
# The share groups' refusals of an acknowledgement that mean its receipt handle no longer holds the
# lock (expired, acknowledged, delivered again since): a proxy's expired handle.
EXPIRED_HANDLE_ERRORS = (ErrorCode.INVALID_RECORD_STATE, ErrorCode.INVALID_REQUEST, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


@dataclass(frozen=True)
class ReceiptHandle:
    """One delivery of one record to one acquisition."""

    topic: str
    partition: int
    offset: int
    delivery_count: int
    member_id: str

    def encode(self) -> str:
        fields = [self.topic, self.partition, self.offset, self.delivery_count, self.member_id]
        return HANDLE_PREFIX + base64.urlsafe_b64encode(json.dumps(fields, separators=(",", ":")).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """The handle ``text`` encodes; INVALID_RECEIPT_HANDLE when it is not one of ours."""
        if not text.startswith(HANDLE_PREFIX):
            raise RocketMQError(Code.INVALID_RECEIPT_HANDLE, "the receipt handle is malformed")
        try:
            fields = json.loads(base64.urlsafe_b64decode(text[len(HANDLE_PREFIX) :].encode()))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise RocketMQError(Code.INVALID_RECEIPT_HANDLE, "the receipt handle is malformed") from None
        if (
            not isinstance(fields, list)
            or len(fields) != 5
            or not isinstance(fields[0], str)
            or not isinstance(fields[4], str)
            or not all(type(f) is int and f >= 0 for f in fields[1:4])
            or not fields[0]
            or not fields[4]
        ):
            raise RocketMQError(Code.INVALID_RECEIPT_HANDLE, "the receipt handle is malformed")
        return cls(fields[0], fields[1], fields[2], fields[3], fields[4])


def max_attempts(delivery_count_limit: int) -> int:
    """The maximum delivery attempts of a group whose share.delivery.count.limit is
    ``delivery_count_limit``: one fewer, leaving the limit's last acquisition to copy the message to
    the dead-letter topic. At limit 1 the share group allows no acquisition beyond the first: one
    attempt, and the message is archived at its lock's end without a copy."""
    return max(1, delivery_count_limit - 1)


def dead_lettered(delivery_count: int, delivery_count_limit: int) -> bool:
    """Whether a record acquired for its ``delivery_count``-th time goes to the dead-letter topic
    instead of a consumer: a delivery beyond the maximum attempts told to clients."""
    return delivery_count > max_attempts(delivery_count_limit)


def acquisition_member(client_id: str) -> str:
    """The share-group member one ReceiveMessage acquires as."""
    return f"{client_id}/{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class TagFilter:
    """A TAG filter expression: ``tags`` None for every message."""

    tags: frozenset[str] | None

    @classmethod
    def of(cls, expression: Any) -> TagFilter:
        """The filter of a request's FilterExpression (unset: every message)."""
        if expression.type == definition.FilterType.SQL:
            raise RocketMQError(Code.UNSUPPORTED, "SQL92 filter expressions are not served (TAG expressions are)")
        text = expression.expression.strip()
        if not text or text == SUB_ALL:
            return cls(None)
        tags = frozenset(t.strip() for t in text.split(TAG_SEPARATOR))
        if "" in tags or SUB_ALL in tags:
            raise RocketMQError(Code.ILLEGAL_FILTER_EXPRESSION, f"illegal tag expression {expression.expression!r}")
        return cls(tags)

    def matches(self, record: StoredRecord) -> bool:
        if self.tags is None:
            return True
        tag = _header(record, TAG_HEADER)
        return tag is not None and tag.decode(errors="replace") in self.tags


def _header(record: StoredRecord, name: str) -> bytes | None:
    found = None
    for key, value in zip(record.header_keys or (), record.header_values or ()):
        if key == name:
            found = value
    return found


def message_id_of(topic: str, partition: int, record: StoredRecord) -> str:
    """The message id a producer gave (``UNIQ_KEY``), else one made from the record's place."""
    given = _header(record, MESSAGE_ID_HEADER)
    if given:
        return given.decode(errors="replace")
    return uuid.uuid5(_RECORD_IDS, f"{topic}-{partition}-{record.offset}").hex.upper()


def message_of(
    topic: str, partition: int, record: StoredRecord, delivery_count: int, handle: str, invisible_ms: int, host: str
) -> Any:
    """A record as the Message a proxy streams: ``messages.as_message`` (the body, tag, keys,
    message id, user properties and body digest from the record), its id made from its place when a
    producer gave none; the queue its partition, the queue offset its offset, the delivery attempt
    its delivery count."""
    headers = tuple(zip(record.header_keys or (), record.header_values or ()))
    body = record.value or b""
    message = as_message(topic, NewRecord(record.key, body, headers, record.timestamp_ms), MessageType.NORMAL)
    props = message.system_properties
    props.message_id = message_id_of(topic, partition, record)
    props.store_timestamp.FromMilliseconds(record.timestamp_ms)
    props.born_host = host
    props.store_host = host
    props.queue_id = partition
    props.queue_offset = record.offset
    props.receipt_handle = handle
    props.invisible_duration.FromMilliseconds(invisible_ms)
    props.delivery_attempt = delivery_count
    return message
