"""What a RocketMQ consumer receives, without a server: receipt handles (and their refusal when
malformed), tag filters, a record as the Message a proxy streams, and a consumer's Settings."""

from __future__ import annotations

import base64
import json
import zlib

import pytest

from api.rocketmq import settings
from api.rocketmq.receiving import (
    ReceiptHandle,
    TagFilter,
    acquisition_member,
    dead_lettered,
    max_attempts,
    message_id_of,
    message_of,
)
from api.rocketmq.status import RocketMQError
from app.domain.log import StoredRecord
from app.wire.rocketmq.protocol import ClientType, Code, definition


def _record(offset: int = 7, value: bytes | None = b"body", headers: dict[str, bytes | None] | None = None) -> StoredRecord:
    headers = headers or {}
    return StoredRecord(
        offset,
        None,
        value,
        list(headers) or None,
        list(headers.values()) or None,
        1_700_000_000_123,
        None,
        None,
        None,
        False,
        None,
        0,
        None,
        False,
    )


def test_a_receipt_handle_round_trips() -> None:
    handle = ReceiptHandle("orders", 2, 41, 3, "client@1/abc")
    assert ReceiptHandle.decode(handle.encode()) == handle


def _encoded(fields: object) -> str:
    return "txlog1." + base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "txlog1.",
        "txlog1.!!!",
        _encoded({"topic": "orders"}),
        _encoded(["orders", 0, 1, 1]),
        _encoded(["orders", -1, 1, 1, "m"]),
        _encoded(["orders", 0, 1, True, "m"]),
        _encoded(["", 0, 1, 1, "m"]),
        _encoded(["orders", 0, 1, 1, ""]),
        _encoded(["orders", "0", 1, 1, "m"]),
    ],
)
def test_a_malformed_receipt_handle_is_refused_with_invalid_receipt_handle(text: str) -> None:
    with pytest.raises(RocketMQError) as refused:
        ReceiptHandle.decode(text)
    assert refused.value.code == Code.INVALID_RECEIPT_HANDLE


def test_each_receive_acquires_as_an_acquisition_of_its_own() -> None:
    a, b = acquisition_member("client@1"), acquisition_member("client@1")
    assert a != b and a.startswith("client@1/") and b.startswith("client@1/")


def _filter(expression: str, kind: int = definition.FilterType.TAG) -> TagFilter:
    return TagFilter.of(definition.FilterExpression(type=kind, expression=expression))


def test_tag_filters_match_as_rocketmq_matches_tags() -> None:
    tagged = {t: _record(headers={"TAGS": t.encode()}) for t in ("a", "b", "c")}
    untagged = _record()
    for every in ("", "*", " * "):
        assert all(_filter(every).matches(r) for r in [*tagged.values(), untagged])
    some = _filter("a || c")
    assert [t for t, r in tagged.items() if some.matches(r)] == ["a", "c"]
    assert not some.matches(untagged)  # a message without a tag matches "*" only


@pytest.mark.parametrize(
    ("expression", "kind", "code"),
    [("a || ", 1, Code.ILLEGAL_FILTER_EXPRESSION), ("a || *", 1, Code.ILLEGAL_FILTER_EXPRESSION), ("a > 1", 2, Code.UNSUPPORTED)],
)
def test_bad_or_unserved_filter_expressions_are_refused(expression: str, kind: int, code: int) -> None:
    with pytest.raises(RocketMQError) as refused:
        _filter(expression, kind)
    assert refused.value.code == code


def test_a_record_becomes_the_message_a_proxy_streams() -> None:
    record = _record(headers={"TAGS": b"created", "KEYS": b"k1 k2", "UNIQ_KEY": b"01ABC", "region": b"eu", "empty": None})
    message = message_of("orders", 2, record, 3, "handle", 30_000, "127.0.0.1:8081")
    props = message.system_properties
    assert (message.topic.name, message.body) == ("orders", b"body")
    assert (props.message_id, props.tag, list(props.keys)) == ("01ABC", "created", ["k1", "k2"])
    assert (props.queue_id, props.queue_offset, props.delivery_attempt, props.receipt_handle) == (2, 7, 3, "handle")
    assert props.born_timestamp.ToMilliseconds() == 1_700_000_000_123
    assert props.invisible_duration.ToMilliseconds() == 30_000
    assert props.body_digest.checksum == format(zlib.crc32(b"body") & 0xFFFFFFFF, "08X")
    assert dict(message.user_properties) == {"region": "eu", "empty": ""}


def test_a_record_without_a_message_id_gets_one_of_its_place() -> None:
    record = _record(value=None)
    assert message_id_of("orders", 0, record) == message_id_of("orders", 0, record) != message_id_of("orders", 1, record)
    assert message_of("orders", 0, record, 1, "h", 1_000, "h:1").body == b""


def test_a_consumers_settings_are_answered_with_its_groups_delivery_limit() -> None:
    sent = definition.Settings(client_type=ClientType.SIMPLE_CONSUMER)
    sent.subscription.group.name = "GID_orders"
    answer = settings.answer(sent, 1024, 5)
    assert answer.backoff_policy.max_attempts == 5
    assert answer.subscription.receive_batch_size == 32
    assert answer.subscription.long_polling_timeout.ToMilliseconds() == 20_000
    assert answer.subscription.group.name == "GID_orders"
    assert not answer.HasField("publishing")
    untouched = settings.answer(sent, 1024)  # the group's limit unknown (the database away)
    assert not untouched.HasField("backoff_policy")


def test_the_maximum_attempts_leave_the_share_groups_last_acquisition_to_the_dead_letter_topic() -> None:
    assert [max_attempts(limit) for limit in (1, 2, 3, 5, 17)] == [1, 1, 2, 4, 16]
    # Limit 1: the only acquisition is the one attempt (archived at its lock's end, no copy).
    assert not dead_lettered(1, 1)
    # Limit 2: one attempt, the second acquisition dead-letters.
    assert not dead_lettered(1, 2) and dead_lettered(2, 2)
    assert not dead_lettered(4, 5) and dead_lettered(5, 5)
