"""The client's Consumer against a real ``txlog serve``: read_committed and read_uncommitted,
starting from the committed offset (waiting while a transaction holds the group's offsets pending)
or from ``auto.offset.reset``, positions, seeks, commits, end-of-partition events."""

from __future__ import annotations

import uuid

import pytest

from tests.client.logs import create_topic
from txlog import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _produce(url: str, topic: str, values: list[bytes], partition: int = 0, **headers) -> None:  # type: ignore[no-untyped-def]
    p = Producer({"url": url, "enable.idempotence": True})
    for v in values:
        p.produce(topic, value=v, key=b"k", partition=partition, headers=headers or None)
    assert p.flush(30) == 0
    p.close()


def _drain(c: Consumer, n: int, timeout: float = 20) -> list:
    got = c.consume(n, timeout)
    assert all(m.error() is None for m in got), [m.error() for m in got]
    return got


def test_read_committed_sees_committed_transactions_only_and_read_uncommitted_sees_all(server, topic_name):
    create_topic(server.url, topic_name, 1)
    p = Producer({"url": server.url, "transactional.id": f"tid-{uuid.uuid4().hex[:8]}"})
    p.init_transactions()
    for outcome in ("commit", "abort", "commit"):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic_name, value=f"{outcome}-{i}".encode())
        p.commit_transaction() if outcome == "commit" else (p.flush(), p.abort_transaction())
    p.begin_transaction()
    p.produce(topic_name, value=b"open")
    p.flush()  # an open transaction: past the last stable offset

    committed = Consumer({"url": server.url, "isolation.level": "read_committed"})
    committed.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
    got = _drain(committed, 6)
    assert [m.value() for m in got] == [b"commit-0", b"commit-1", b"commit-2"] * 2
    assert committed.poll(0.5) is None  # nothing past the open transaction
    everything = Consumer({"url": server.url, "isolation.level": "read_uncommitted"})
    everything.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
    assert len(_drain(everything, 10)) == 10

    p.commit_transaction()
    p.close()
    assert [m.value() for m in _drain(committed, 1)] == [b"open"]
    committed.close()
    everything.close()


def test_records_round_trip_exactly(server, topic_name):
    create_topic(server.url, topic_name, 1)
    p = Producer({"url": server.url})
    p.produce(topic_name, value=bytes(range(256)), key=b"\x00", headers=[("a", b"\xff"), ("a", None)], timestamp=123)
    p.produce(topic_name, value=None, key=None)
    p.flush(30)
    p.close()
    c = Consumer({"url": server.url, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic_name, 0)])
    first, second = _drain(c, 2)
    c.close()
    assert (first.topic(), first.partition(), first.offset()) == (topic_name, 0, 0)
    assert first.value() == bytes(range(256)) and first.key() == b"\x00"
    assert first.headers() == [("a", b"\xff"), ("a", None)]
    assert first.timestamp() == (1, 123)
    assert second.value() is None and second.key() is None and second.headers() is None and len(second) == 0


def test_subscribe_commits_and_a_new_consumer_resumes_from_the_committed_offset(server, topic_name):
    create_topic(server.url, topic_name, 3)
    for partition in range(3):
        _produce(server.url, topic_name, [f"p{partition}-{i}".encode() for i in range(4)], partition)
    group = _group()
    assigned = []
    c = Consumer({"url": server.url, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic_name], on_assign=lambda consumer, parts: assigned.extend(parts))
    got = _drain(c, 6)
    assert sorted(tp.partition for tp in assigned) == [0, 1, 2]
    assert sorted(tp.partition for tp in c.assignment()) == [0, 1, 2]
    committed = c.commit(asynchronous=False)
    positions = {tp.partition: tp.offset for tp in c.position(c.assignment())}
    assert {tp.partition: tp.offset for tp in committed} == {p: o for p, o in positions.items() if o > 0}
    assert {tp.partition: tp.offset for tp in c.committed(c.assignment())} == {
        p: (o if o > 0 else OFFSET_INVALID) for p, o in positions.items()
    }
    c.close()

    again = Consumer({"url": server.url, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    again.subscribe([topic_name])
    rest = _drain(again, 12 - len(got))
    assert again.poll(0.3) is None
    again.close()
    seen = sorted(m.value() for m in got + rest)
    assert seen == sorted(f"p{p}-{i}".encode() for p in range(3) for i in range(4))


def test_auto_commit_on_close(server, topic_name):
    create_topic(server.url, topic_name, 1)
    _produce(server.url, topic_name, [b"a", b"b", b"c"])
    group = _group()
    with Consumer({"url": server.url, "group.id": group, "auto.offset.reset": "earliest"}) as c:
        c.subscribe([topic_name])
        assert [m.value() for m in _drain(c, 2)] == [b"a", b"b"]
    with Consumer({"url": server.url, "group.id": group, "auto.offset.reset": "earliest"}) as c:
        c.subscribe([topic_name])
        assert [m.value() for m in _drain(c, 1)] == [b"c"]


def test_auto_offset_reset_and_seek(server, topic_name):
    create_topic(server.url, topic_name, 1)
    _produce(server.url, topic_name, [b"0", b"1", b"2", b"3"])
    latest = Consumer({"url": server.url, "group.id": _group()})  # librdkafka's default: latest
    latest.assign([TopicPartition(topic_name, 0)])
    assert latest.poll(0.5) is None
    assert latest.position([TopicPartition(topic_name, 0)])[0].offset == 4
    _produce(server.url, topic_name, [b"4"])
    assert [m.value() for m in _drain(latest, 1)] == [b"4"]
    latest.seek(TopicPartition(topic_name, 0, 1))
    assert [m.value() for m in _drain(latest, 2)] == [b"1", b"2"]
    assert latest.position([TopicPartition(topic_name, 0)])[0].offset == 3
    latest.seek(TopicPartition(topic_name, 0, OFFSET_END))
    assert latest.poll(0.3) is None
    latest.seek(TopicPartition(topic_name, 0, OFFSET_BEGINNING))
    assert [m.value() for m in _drain(latest, 1)] == [b"0"]
    assert latest.get_watermark_offsets(TopicPartition(topic_name, 0)) == (0, 5)
    latest.close()

    strict = Consumer({"url": server.url, "group.id": _group(), "auto.offset.reset": "error"})
    strict.assign([TopicPartition(topic_name, 0)])
    event = strict.poll(5)
    assert event is not None and event.error().code() == KafkaError._AUTO_OFFSET_RESET
    strict.close()


def test_a_new_consumer_waits_for_offsets_pending_in_a_transaction(server, topic_name):
    """KIP-447: read_committed asks for stable offsets; while a transaction holds the group's
    offsets pending, the consumer keeps asking instead of starting from auto.offset.reset."""
    create_topic(server.url, topic_name, 1)
    _produce(server.url, topic_name, [str(i).encode() for i in range(10)])
    group = _group()
    p = Producer({"url": server.url, "transactional.id": f"tid-{uuid.uuid4().hex[:8]}"})
    p.init_transactions()
    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic_name, 0, 6)], group)

    c = Consumer({"url": server.url, "group.id": group, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic_name, 0)])
    assert c.poll(0.5) is None
    with pytest.raises(KafkaException) as info:
        c.committed([TopicPartition(topic_name, 0)], timeout=0.3)
    assert info.value.args[0].retriable()
    p.commit_transaction()
    p.close()
    assert [m.value() for m in _drain(c, 1)] == [b"6"]
    assert c.committed([TopicPartition(topic_name, 0)])[0].offset == 6
    c.close()


def test_partition_eof_events(server, topic_name):
    create_topic(server.url, topic_name, 1)
    _produce(server.url, topic_name, [b"x"])
    c = Consumer({"url": server.url, "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic_name, 0)])
    first = c.poll(10)
    assert first is not None and first.value() == b"x"
    eof = c.poll(10)
    assert eof is not None and eof.error().code() == KafkaError._PARTITION_EOF and eof.offset() == 1
    assert c.poll(0.3) is None  # reported once
    c.close()


def test_consumer_group_metadata_and_group_less_calls(server, topic_name):
    c = Consumer({"url": server.url})
    with pytest.raises(KafkaException):
        c.consumer_group_metadata()
    c.close()
    with pytest.raises(RuntimeError):
        c.poll(0)
    g = Consumer({"url": server.url, "group.id": "some-group"})
    assert g.consumer_group_metadata().group_id == "some-group"
    g.close()
