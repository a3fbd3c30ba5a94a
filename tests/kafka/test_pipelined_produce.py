"""A connection's Produce requests for distinct partitions are appended while the ones before them
are (``api.kafka.server``, ``in_flight.PIPELINED_PRODUCE``), their answers still in the order they came: raw
frames sent back to back, as librdkafka sends up to five with idempotence."""

from __future__ import annotations

import struct
import uuid

import pytest
from sqlalchemy import text

from app.services import Broker, topics
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.structs import decode_response, encode_request
from tests.kafka.conftest import RawConnection
from tests.kafka.test_transactions import NONE, OUT_OF_ORDER_SEQUENCE_NUMBER, batch, init_producer_id, values
from tests.support import wait_until


@pytest.fixture
def topic(store: Broker) -> str:
    name = f"pipe-{uuid.uuid4().hex[:10]}"
    topics.create_topic(store, name, 4)
    return name


def send_produce(raw: RawConnection, topic: str, partition: int, data: bytes) -> int:
    body = {
        "acks": -1,
        "timeout_ms": 60_000,  # longer than any wait below: a request waiting on a lock does not time out
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}],
    }
    return raw.send(ApiKey.Produce, 9, body)


def read_produce(raw: RawConnection) -> tuple[int, int, int]:
    """(correlation id, error code, base offset) of the next answer, a one-partition Produce's."""
    frame = raw.read_frame()
    assert frame is not None, "the gateway closed the connection instead of answering"
    correlation_id, answer = decode_response(ApiKey.Produce, 9, frame)
    part = answer.responses[0].partition_responses[0]
    return correlation_id, part.error_code, part.base_offset


def stored(store: Broker, topic: str) -> dict[int, list[bytes]]:
    with store.db.engine.connect() as conn:
        rows = conn.execute(
            text('SELECT partition, value FROM txlog.log_records WHERE topic = :t ORDER BY partition, "offset"'), {"t": topic}
        ).all()
    found: dict[int, list[bytes]] = {}
    for partition, value in rows:
        found.setdefault(partition, []).append(bytes(value))
    return found


def test_a_partition_is_appended_while_another_partitions_request_before_it_waits(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    """Partition 0's append waits for its row lock, held here; the request after it, for partition
    1, commits meanwhile, but its answer leaves only after partition 0's."""
    _, pid, epoch = init_producer_id(raw, None)
    with store.db.engine.connect() as holder:
        holder.execute(text("SELECT 1 FROM txlog.partitions WHERE topic = :t AND partition = 0 FOR UPDATE"), {"t": topic})
        first = send_produce(raw, topic, 0, batch(pid, epoch, 0, [b"p0-0"]))
        second = send_produce(raw, topic, 1, batch(pid, epoch, 0, [b"p1-0"]))
        wait_until(lambda: stored(store, topic).get(1), 20, 0.02, "partition 1 appended while partition 0 waits")
        assert 0 not in stored(store, topic)
        holder.rollback()
    assert read_produce(raw) == (first, NONE, 0)
    assert read_produce(raw) == (second, NONE, 0)
    assert stored(store, topic) == {0: [b"p0-0"], 1: [b"p1-0"]}


def test_back_to_back_requests_are_answered_in_order_with_each_partitions_sequence_kept(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    """Eleven requests sent before any answer is read: the same partition twice in a row (the
    second waits for the first), a Metadata request among them (answered in its turn), a retried
    batch (the offsets of the first time) and a gap in a sequence (OUT_OF_ORDER_SEQUENCE_NUMBER)."""
    _, pid, epoch = init_producer_id(raw, None)
    sent: list[tuple[int, str, int, int]] = []  # correlation id, kind, error, base offset expected
    for seq in range(2):
        for partition in range(4):
            items = values(f"p{partition}-s{seq}", 3)
            sent.append((send_produce(raw, topic, partition, batch(pid, epoch, 3 * seq, items)), "produce", NONE, 3 * seq))
        if seq == 0:
            sent.append(
                (
                    raw.send(ApiKey.Metadata, 9, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}),
                    "metadata",
                    0,
                    0,
                )
            )
    retried = send_produce(raw, topic, 2, batch(pid, epoch, 3, values("p2-s1", 3)))
    gap = send_produce(raw, topic, 3, batch(pid, epoch, 9, [b"late"]))
    for correlation_id, kind, error, offset in sent:
        if kind == "metadata":
            frame = raw.read_frame()
            assert frame is not None
            got, _ = decode_response(ApiKey.Metadata, 9, frame)
            assert got == correlation_id
        else:
            assert read_produce(raw) == (correlation_id, error, offset)
    assert read_produce(raw) == (retried, NONE, 3)
    got, error, _ = read_produce(raw)
    assert (got, error) == (gap, OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert stored(store, topic) == {p: values(f"p{p}-s0", 3) + values(f"p{p}-s1", 3) for p in range(4)}


def test_a_malformed_request_behind_appends_closes_the_connection_after_their_answers(
    raw: RawConnection, store: Broker, topic: str
) -> None:
    _, pid, epoch = init_producer_id(raw, None)
    first = send_produce(raw, topic, 0, batch(pid, epoch, 0, [b"a"]))
    second = send_produce(raw, topic, 1, batch(pid, epoch, 0, [b"b"]))
    body = {
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 2, "records": b"x" * 64}]}],
    }
    frame = encode_request(ApiKey.Produce, 9, body, 99, "raw-test")[4:]
    cut = frame[: len(frame) - 40]  # the records' bytes run past the end of the frame
    raw.send_bytes(struct.pack(">i", len(cut)) + cut)
    assert read_produce(raw) == (first, NONE, 0)
    assert read_produce(raw) == (second, NONE, 0)
    assert raw.read_frame() is None
    assert stored(store, topic) == {0: [b"a"], 1: [b"b"]}
