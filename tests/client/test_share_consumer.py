"""The client's ShareConsumer against a real ``txlog serve``: members of one share group get disjoint
records that together are the topic's, reject archives, release redelivers counted, implicit and
explicit acknowledgement, and a consumer that stops without closing gives its records back when its
locks expire."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.client.logs import create_topic
from txlog import KafkaError, KafkaException, Producer, ShareConsumer, TopicPartition


def _group(url: str) -> str:
    group = f"sg-{uuid.uuid4().hex[:8]}"
    r = httpx.patch(
        f"{url}/v1/share-groups/{group}/configs", json={"configs": {"share.auto.offset.reset": "earliest"}}, timeout=10
    )
    assert r.status_code == 200, r.text
    return group


def _produce(url: str, topic: str, values: list[bytes], partitions: int = 1) -> None:
    p = Producer({"url": url})
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % partitions)
    assert p.flush(30) == 0
    p.close()


def _in_flight(url: str, group: str) -> list[dict]:
    r = httpx.get(f"{url}/v1/share-groups/{group}", timeout=10)
    assert r.status_code == 200, r.text
    return [dict(r, topic=p["topic"], partition=p["partition"]) for p in r.json()["partitions"] for r in p["in_flight"]]


def _take(c: ShareConsumer, n: int, timeout: float = 20) -> list:
    got: list = []
    for _ in range(50):
        got += c.poll(timeout)
        if len(got) >= n:
            break
    return got


def test_two_consumers_get_disjoint_records_that_together_are_the_topics(server, topic_name):
    create_topic(server.url, topic_name, 3)
    group = _group(server.url)
    values = [f"v{i}".encode() for i in range(60)]
    _produce(server.url, topic_name, values, partitions=3)
    first = ShareConsumer(server.url, group, [topic_name], max_records=7)
    second = ShareConsumer(server.url, group, [topic_name], max_records=7)
    assert first.member_id != second.member_id
    got: dict[str, list] = {"first": [], "second": []}
    while len(got["first"]) + len(got["second"]) < len(values):
        before = len(got["first"]) + len(got["second"])
        got["first"] += first.poll(2)
        got["second"] += second.poll(2)
        assert len(got["first"]) + len(got["second"]) > before
    keys = {name: {(m.partition(), m.offset()) for m in ms} for name, ms in got.items()}
    assert got["first"] and got["second"]
    assert not keys["first"] & keys["second"]
    assert sorted(m.value() for ms in got.values() for m in ms) == sorted(values)
    assert all(m.delivery_count() == 1 for ms in got.values() for m in ms)
    first.close()
    second.close()
    # Implicit acknowledgement: every record of the last polls accepted on close; none in flight.
    assert all(r["state"] in ("Acknowledged",) for r in _in_flight(server.url, group))
    with ShareConsumer(server.url, group, [topic_name]) as third:
        assert third.poll(0.5) == []


def test_reject_archives_and_release_redelivers_counted(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"later", b"bad", b"done"])
    c = ShareConsumer(server.url, group, [topic_name], acknowledgement_mode="explicit")
    later, bad, done = _take(c, 3)
    c.acknowledge(later, type="release")
    c.acknowledge(bad, type="reject")
    c.acknowledge(done, "accept")
    with pytest.raises(KafkaException) as twice:
        c.acknowledge(done)
    assert twice.value.args[0].code() == KafkaError._STATE
    results = c.commit()
    assert list(results.values()) == [None]

    [again] = _take(c, 1)
    assert (again.offset(), again.value(), again.delivery_count()) == (0, b"later", 2)
    states = {(r["first_offset"], r["last_offset"]): (r["state"], r["delivery_count"]) for r in _in_flight(server.url, group)}
    assert states == {(0, 0): ("Acquired", 2), (1, 1): ("Archived", 1), (2, 2): ("Acknowledged", 1)}
    c.acknowledge(again)
    c.close()
    with ShareConsumer(server.url, group, [topic_name]) as other:
        assert other.poll(0.5) == []  # the rejected record is never delivered again


def test_explicit_mode_refuses_a_poll_before_every_record_is_acknowledged(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"a", b"b"])
    c = ShareConsumer({"url": server.url, "group.id": group, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic_name])
    a, b = _take(c, 2)
    c.acknowledge(a)
    with pytest.raises(KafkaException) as refused:
        c.poll(0)
    assert refused.value.args[0].code() == KafkaError._STATE
    c.acknowledge(b, "accept")
    assert c.poll(0.2) == []
    c.close()


def test_implicit_mode_accepts_what_was_not_acknowledged_at_the_next_poll(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"a", b"b", b"c"])
    seen: list = []
    c = ShareConsumer(
        server.url, group, [topic_name], on_acknowledge=lambda tp, err, offsets: seen.append((tp.partition, err, offsets))
    )
    _, b, _ = _take(c, 3)
    c.acknowledge(b, "release")
    assert c.poll(5)[0].value() == b"b"  # a and c accepted, b back with its second delivery
    assert seen == [(0, None, {"accept": [0, 2], "release": [1]})]
    c.close()
    assert seen[-1] == (0, None, {"accept": [1]})
    assert [r["state"] for r in _in_flight(server.url, group)] in ([], ["Acknowledged"])


def test_iteration_gives_records_with_their_delivery_count(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"x", b"y"])
    with ShareConsumer(server.url, group, [topic_name]) as c:
        got = []
        for m in c:
            got.append((m.value(), m.delivery_count()))
            if len(got) == 2:
                break
    assert got == [(b"x", 1), (b"y", 1)]


def test_a_consumer_that_stops_without_closing_has_its_records_redelivered_after_the_lock(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    r = httpx.patch(
        f"{server.url}/v1/share-groups/{group}/configs", json={"configs": {"share.record.lock.duration.ms": "15000"}}, timeout=10
    )
    assert r.status_code == 200, r.text
    _produce(server.url, topic_name, [b"one", b"two"])
    gone = ShareConsumer(server.url, group, [topic_name])
    assert [m.value() for m in _take(gone, 2)] == [b"one", b"two"]
    # ``gone`` is never used again nor closed: its locks run out and the group gets the records back.
    other = ShareConsumer(server.url, group, [topic_name], wait_ms=5000)
    got = _take(other, 2, timeout=40)
    assert [(m.value(), m.delivery_count()) for m in got] == [(b"one", 2), (b"two", 2)]
    # Its acknowledgements, late, are refused: the records are another member's now.
    [(tp, err)] = gone.commit().items()
    assert (tp.topic, tp.partition) == (topic_name, 0)
    assert err is not None and err.code() == KafkaError.INVALID_RECORD_STATE
    other.close()


def test_settings_are_checked(server):
    with pytest.raises(KafkaException) as no_group:
        ShareConsumer(server.url)
    assert no_group.value.args[0].code() == KafkaError._INVALID_ARG
    with pytest.raises(KafkaException):
        ShareConsumer(server.url, "g", acknowledgement_mode="sometimes")
    c = ShareConsumer(server.url, "g")
    with pytest.raises(KafkaException) as unsubscribed:
        c.poll(0)
    assert unsubscribed.value.args[0].code() == KafkaError._STATE
    c.close()


def test_renew_extends_a_lock_and_the_record_still_needs_its_acknowledgement(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"slow"])
    c = ShareConsumer(server.url, group, [topic_name], acknowledgement_mode="explicit")
    [slow] = _take(c, 1)
    [before] = _in_flight(server.url, group)
    c.renew(slow)
    [after] = _in_flight(server.url, group)
    assert (after["state"], after["member_id"]) == ("Acquired", c.member_id)
    assert after["lock_deadline_ms"] > before["lock_deadline_ms"]
    with pytest.raises(KafkaException):
        c.poll(0)  # explicit mode: renewed is not acknowledged
    c.acknowledge(slow, "accept")
    assert c.commit() == {TopicPartition(topic_name, 0): None}
    assert [r["state"] for r in _in_flight(server.url, group)] in ([], ["Acknowledged"])
    c.close()


def test_a_subscription_to_several_topics_acquires_from_them_all(server, topic_name):
    other = f"{topic_name}-b"
    create_topic(server.url, topic_name, 2)
    create_topic(server.url, other, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"a0", b"a1", b"a2", b"a3"], partitions=2)
    _produce(server.url, other, [b"b0", b"b1"])
    with ShareConsumer(server.url, group, [topic_name, other], max_records=3) as c:
        assert c.subscription() == [topic_name, other]
        got = _take(c, 6)
    assert sorted(m.value() for m in got) == [b"a0", b"a1", b"a2", b"a3", b"b0", b"b1"]
    assert {m.topic() for m in got} == {topic_name, other}


def test_an_unknown_topic_is_kafkas_error(server, topic_name):
    c = ShareConsumer(server.url, _group(server.url), [f"{topic_name}-missing"])
    with pytest.raises(KafkaException) as missing:
        c.poll(1)
    assert missing.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    c.close()


def test_leaving_the_with_block_on_an_exception_releases_what_was_not_acknowledged(server, topic_name):
    create_topic(server.url, topic_name, 1)
    group = _group(server.url)
    _produce(server.url, topic_name, [b"ok", b"boom"])
    with pytest.raises(ValueError), ShareConsumer(server.url, group, [topic_name]) as c:
        ok, boom = _take(c, 2)
        c.acknowledge(ok)
        raise ValueError(boom.value())
    with ShareConsumer(server.url, group, [topic_name]) as again:
        assert [(m.value(), m.delivery_count()) for m in _take(again, 1)] == [(b"boom", 2)]
