"""Share groups (KIP-932) through confluent-kafka's ShareConsumer and over raw frames: records shared
out among the members of a share group, each delivered to one member at a time and redelivered when
its holder goes away; reject and the delivery-count limit archive; a read_committed share group
never delivers a record of an aborted transaction; a gateway killed mid-fetch costs the consumer
nothing; each API's errors as Kafka answers them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

from app.errors import ErrorCode as E
from app.services import Broker, share_admin, share_configs
from app.services import share as share_service
from app.services import topics as topics_service
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.structs import decode_response
from tests.conftest import fresh_database, make_broker
from tests.kafka.conftest import GatewayProcess, RawConnection
from tests.kafka.test_acls import (
    Doors,
    O,
    R,
    doors,  # noqa: F401  (the fixture: a gateway that signs clients in and checks ACLs)
)
from tests.kafka.test_groups import _join
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCK_MS = 15_000  # the least share.record.lock.duration.ms Kafka allows (group.share.min.record.lock.duration.ms)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic(raw: RawConnection, partitions: int = 2) -> str:
    topic = _name("share-topic")
    created = raw.request(
        ApiKey.CreateTopics, 7, {"topics": [{"name": topic, "num_partitions": partitions, "replication_factor": 1}]}
    )
    assert created.topics[0].error_code == 0
    return topic


def _group(store: Broker, **configs: str) -> str:
    group = _name("share-group")
    share_configs.alter_group_configs(store, group, {"share.auto.offset.reset": "earliest", **configs})
    return group


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: int = 2) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % partitions)
    assert producer.flush(30) == 0


def _consumer(bootstrap: str, group: str, topic: str, **extra: Any) -> ShareConsumer:
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})
    consumer.subscribe([topic])
    return consumer


def _drain(
    consumers: list[ShareConsumer], until: Any, timeout: float = 30, ack: AcknowledgeType | None = None
) -> list[list[Any]]:
    """Polls each consumer in turn until ``until(got)`` (each consumer's messages so far); with
    ``ack`` each message is acknowledged so (explicit mode), else the next poll accepts it."""
    got: list[list[Any]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while not until(got):
        assert time.monotonic() < deadline, f"gave up with {[len(g) for g in got]} messages"
        for i, c in enumerate(consumers):
            for m in c.poll(0.2) or []:
                if m.error() is not None:
                    continue
                got[i].append(m)
                if ack is not None:
                    c.acknowledge(m, ack)
            if ack is not None:
                c.commit_async()
    for i, c in enumerate(consumers):
        if ack is not None:
            c.commit_sync(30)  # what was acknowledged, sent before the answer
        else:  # implicit mode: the next poll accepts what the last one delivered (and may deliver more)
            got[i] += [m for m in c.poll(0.1) or [] if m.error() is None]
    return got


def _values(got: list[list[Any]]) -> list[bytes]:
    return [m.value() for ms in got for m in ms]


def _count(n: int) -> Any:
    return lambda got: sum(len(ms) for ms in got) >= n


def _done(store: Broker, group: str, topic: str, partitions: int = 2) -> bool:
    """Every record of ``topic`` is done for the share group: each share partition's start offset
    is at the log's end."""
    ends = {s.partition: s.high_watermark for s in topics_service.describe_topic(store, topic)}
    described = share_admin.describe(store, group).partitions
    found = {(p.topic, p.partition): p.start_offset for p in described}
    return all(found.get((topic, p)) == ends[p] for p in range(partitions))


def _close(consumers: list[ShareConsumer]) -> None:
    """Closes them: each sends what it still has to acknowledge and leaves the group."""
    for c in consumers:
        c.close()
    consumers.clear()


@pytest.fixture
def closing() -> Iterator[list[ShareConsumer]]:
    consumers: list[ShareConsumer] = []
    yield consumers
    for c in consumers:
        c.close()


def test_members_share_the_topic_disjointly(gateway: GatewayProcess, raw: RawConnection, store: Broker, closing: list) -> None:
    topic, group = _topic(raw), _group(store)
    values = [f"v{i}".encode() for i in range(60)]
    _produce(gateway.bootstrap, topic, values)
    closing += [_consumer(gateway.bootstrap, group, topic) for _ in range(3)]
    got = _drain(closing, _count(len(values)))
    every = _values(got)
    assert sorted(every) == sorted(values) and len(every) == len(set(every))
    _close(closing)
    wait_until(lambda: _done(store, group, topic), 30, message="every record accepted")


_KILLED_CONSUMER = textwrap.dedent("""
    import sys
    from confluent_kafka import ShareConsumer
    bootstrap, group, topic, want = sys.argv[1:5]
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    got = []
    while len(got) < int(want):
        got += [m.value().decode() for m in c.poll(0.2) or [] if m.error() is None]
    print(" ".join(got), flush=True)
    sys.stdin.read()  # holds its records, acknowledging nothing, until killed
""")


def test_a_killed_consumers_records_go_to_the_others_after_the_lock_duration(
    gateway: GatewayProcess, raw: RawConnection, store: Broker, closing: list
) -> None:
    topic, group = _topic(raw), _group(store, **{"share.record.lock.duration.ms": str(LOCK_MS)})
    values = [f"k{i}".encode() for i in range(20)]
    _produce(gateway.bootstrap, topic, values)
    before_acquired = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CONSUMER, gateway.bootstrap, group, topic, "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        held = {v.encode() for v in proc.stdout.readline().decode().split()}
        assert held
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    closing += [_consumer(gateway.bootstrap, group, topic) for _ in range(2)]
    rest = _drain(closing, lambda got: set(_values(got)) >= set(values) - held)
    assert not set(_values(rest)) & held  # locked to the killed member meanwhile
    again = _drain(closing, lambda got: set(_values(got)) >= held, timeout=LOCK_MS / 1000 + 30)
    assert time.monotonic() - before_acquired >= LOCK_MS / 1000  # not before its lock lapsed
    redelivered = [m for ms in again for m in ms if m.value() in held]
    assert redelivered and all(m.delivery_count() == 2 for m in redelivered)
    _close(closing)
    wait_until(lambda: _done(store, group, topic), 30, message="every record accepted")


def test_reject_archives(gateway: GatewayProcess, raw: RawConnection, store: Broker, closing: list) -> None:
    topic, group = _topic(raw, partitions=1), _group(store)
    values = [f"r{i}".encode() for i in range(10)]
    _produce(gateway.bootstrap, topic, values, partitions=1)
    closing.append(_consumer(gateway.bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"}))
    got = _drain(closing, _count(len(values)), ack=AcknowledgeType.REJECT)
    assert sorted(_values(got)) == sorted(values)
    wait_until(lambda: _done(store, group, topic, 1), 30, message="the rejected records archived")
    # A later record is the next one delivered: the rejected ones are never again.
    _produce(gateway.bootstrap, topic, [b"after"], partitions=1)
    closing.append(_consumer(gateway.bootstrap, group, topic))
    assert _values(_drain(closing[1:], _count(1))) == [b"after"]


def test_the_delivery_count_limit_archives(gateway: GatewayProcess, raw: RawConnection, store: Broker, closing: list) -> None:
    topic, group = _topic(raw, partitions=1), _group(store, **{"share.delivery.count.limit": "2"})
    values = [f"d{i}".encode() for i in range(5)]
    _produce(gateway.bootstrap, topic, values, partitions=1)
    closing.append(_consumer(gateway.bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"}))
    got = _drain(closing, _count(2 * len(values)), ack=AcknowledgeType.RELEASE)
    assert sorted(_values(got)) == sorted(values * 2)  # each delivered twice, released each time
    wait_until(lambda: _done(store, group, topic, 1), 30, message="archived at the delivery-count limit")
    _produce(gateway.bootstrap, topic, [b"after"], partitions=1)
    assert [m.value() for m in _drain(closing, _count(1), ack=AcknowledgeType.ACCEPT)[0]] == [b"after"]


def test_read_committed_share_group_never_delivers_aborted_records(
    gateway: GatewayProcess, raw: RawConnection, store: Broker, closing: list
) -> None:
    topic, group = _topic(raw), _group(store, **{"share.isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": gateway.bootstrap, "transactional.id": _name("share-tx"), "linger.ms": 0})
    producer.init_transactions(30)
    committed, aborted = [], []
    for t in range(8):
        producer.begin_transaction()
        batch = [f"t{t}-{i}".encode() for i in range(4)]
        for i, value in enumerate(batch):
            producer.produce(topic, value, partition=i % 2)
        if t % 2:
            producer.abort_transaction(30)
            aborted += batch
        else:
            producer.commit_transaction(30)
            committed += batch
    closing += [_consumer(gateway.bootstrap, group, topic) for _ in range(2)]
    got = _drain(closing, _count(len(committed)))
    _close(closing)
    wait_until(lambda: _done(store, group, topic), 30, message="the aborted records archived, the markers passed")
    assert sorted(_values(got)) == sorted(committed)
    assert not set(_values(got)) & set(aborted)


def test_a_gateway_killed_mid_fetch_the_consumer_goes_on(
    pg_admin_url: str, template_db: str, tmp_path: Path, closing: list
) -> None:
    settings = {"TXLOG_KAFKA_NODE_LEASE_MS": "1500", "TXLOG_KAFKA_AUTO_CREATE_TOPICS": "true", "TXLOG_KAFKA_NUM_PARTITIONS": "2"}
    with fresh_database(pg_admin_url, template_db) as url:
        store = make_broker(url)
        gateways = [GatewayProcess(url, env=settings, log_path=tmp_path / f"node-{n}.log", node_id=n) for n in (0, 1)]
        try:
            for g in gateways:
                g.start()
            with gateways[0].connect() as raw:
                wait_until(lambda: len(raw.request(ApiKey.Metadata, 12, {"topics": []}).brokers) == 2, 30, message="both listed")
                topic = _topic(raw)
            group = _group(store, **{"share.record.lock.duration.ms": str(LOCK_MS)})
            first = [f"a{i}".encode() for i in range(20)]
            _produce(gateways[0].bootstrap, topic, first)
            closing.append(_consumer(",".join(g.bootstrap for g in gateways), group, topic))
            got = _drain(closing, _count(5))
            gateways[1].stop(signal.SIGKILL)
            second = [f"b{i}".encode() for i in range(20)]
            _produce(gateways[0].bootstrap, topic, second)
            # what the killed gateway handed out and heard no acknowledgement of comes again once its lock lapses
            _drain(closing, lambda more: set(_values(got) + _values(more)) >= set(first + second), timeout=LOCK_MS / 1000 + 30)
        finally:
            for c in closing:
                c.close()
            closing.clear()
            for g in gateways:
                g.stop()
            store.db.dispose()


# --- raw frames -----------------------------------------------------------------------------------


def _heartbeat(raw: RawConnection, group: str, member: str, epoch: int, topics: list[str] | None) -> Any:
    return raw.request(
        ApiKey.ShareGroupHeartbeat,
        1,
        {"group_id": group, "member_id": member, "member_epoch": epoch, "rack_id": None, "subscribed_topic_names": topics},
    )


def _fetch(
    raw: RawConnection, group: str, member: str, epoch: int, parts: list[tuple[uuid.UUID, int, list]], wait_ms: int = 0
) -> Any:
    return raw.request(
        ApiKey.ShareFetch,
        1,
        {
            "group_id": group,
            "member_id": member,
            "share_session_epoch": epoch,
            "max_wait_ms": wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "max_records": 100,
            "batch_size": 100,
            "topics": [
                {
                    "topic_id": t,
                    "partitions": [
                        {
                            "partition_index": p,
                            "acknowledgement_batches": [
                                {"first_offset": a, "last_offset": b, "acknowledge_types": [k]} for a, b, k in acks
                            ],
                        }
                    ],
                }
                for t, p, acks in parts
            ],
            "forgotten_topics_data": [],
        },
    )


def _acknowledge(
    raw: RawConnection, group: str, member: str, epoch: int, topic_id: uuid.UUID, first: int, last: int, kind: int
) -> Any:
    return raw.request(
        ApiKey.ShareAcknowledge,
        1,
        {
            "group_id": group,
            "member_id": member,
            "share_session_epoch": epoch,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "acknowledgement_batches": [
                                {"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}
                            ],
                        }
                    ],
                }
            ],
        },
    )


def _enter(raw: RawConnection, group: str, member: str, topic: str) -> None:
    """``member`` joins the share group (a ShareFetch or ShareAcknowledge needs a member)."""
    joined = _heartbeat(raw, group, member, 0, [topic])
    assert joined.error_code == 0, joined


def _topic_id(raw: RawConnection, topic: str) -> uuid.UUID:
    return raw.request(ApiKey.Metadata, 12, {"topics": [{"name": topic}]}).topics[0].topic_id


def test_heartbeat_joins_assigns_fences_and_leaves(raw: RawConnection) -> None:
    topic = _topic(raw)
    topic_id, group = _topic_id(raw, topic), _name("share-group")
    assert _heartbeat(raw, group, "", 0, [topic]).error_code == E.INVALID_REQUEST.kafka_code
    assert _heartbeat(raw, group, "m1", 0, None).error_code == E.INVALID_REQUEST.kafka_code
    assert _heartbeat(raw, group, "m1", 3, [topic]).error_code == E.UNKNOWN_MEMBER_ID.kafka_code
    joined = _heartbeat(raw, group, "m1", 0, [topic])
    assert (joined.error_code, joined.member_id, joined.member_epoch) == (0, "m1", 1)
    assert [(t.topic_id, sorted(t.partitions)) for t in joined.assignment.topic_partitions] == [(topic_id, [0, 1])]
    assert _heartbeat(raw, group, "m1", 5, None).error_code == E.FENCED_MEMBER_EPOCH.kafka_code
    second = _heartbeat(raw, group, "m2", 0, [topic])
    assert second.member_epoch == 2
    again = _heartbeat(raw, group, "m1", 1, None)
    assert (again.error_code, again.member_epoch) == (0, 2)
    described = raw.request(
        ApiKey.ShareGroupDescribe, 1, {"group_ids": [group, "no-such-share-group"], "include_authorized_operations": False}
    )
    found, missing = described.groups
    assert (found.error_code, found.group_state, found.group_epoch, sorted(m.member_id for m in found.members)) == (
        0,
        "Stable",
        2,
        ["m1", "m2"],
    )
    assert missing.error_code == E.GROUP_ID_NOT_FOUND.kafka_code
    left = _heartbeat(raw, group, "m1", -1, None)
    assert (left.error_code, left.member_epoch) == (0, -1)
    assert _heartbeat(raw, group, "m1", -1, None).error_code == E.UNKNOWN_MEMBER_ID.kafka_code


def test_share_sessions_and_acknowledgements(gateway: GatewayProcess, raw: RawConnection, store: Broker) -> None:
    topic = _topic(raw, partitions=1)
    topic_id, group, member = _topic_id(raw, topic), _group(store), "m-" + uuid.uuid4().hex
    _produce(gateway.bootstrap, topic, [b"x", b"y"], partitions=1)
    for m in (member, "m-other", "m-next"):
        _enter(raw, group, m, topic)
    assert _fetch(raw, group, member, 1, [(topic_id, 0, [])]).error_code == E.SHARE_SESSION_NOT_FOUND.kafka_code
    assert _fetch(raw, group, member, 0, [(topic_id, 0, [(0, 0, 1)])]).error_code == E.INVALID_REQUEST.kafka_code
    opened = _fetch(raw, group, member, 0, [(topic_id, 0, [])])
    assert opened.error_code == 0 and opened.acquisition_lock_timeout_ms == 30_000
    part = opened.responses[0].partitions[0]
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in part.acquired_records] == [(0, 1, 1)]
    assert _fetch(raw, group, member, 5, [(topic_id, 0, [])]).error_code == E.INVALID_SHARE_SESSION_EPOCH.kafka_code
    assert _acknowledge(raw, group, member, 0, topic_id, 0, 0, 1).error_code == E.INVALID_SHARE_SESSION_EPOCH.kafka_code
    # another member may not acknowledge what this one holds
    other = _fetch(raw, group, "m-other", 0, [])
    assert other.error_code == 0
    refused = _acknowledge(raw, group, "m-other", 1, topic_id, 0, 0, 1)
    assert refused.responses[0].partitions[0].error_code == E.INVALID_RECORD_STATE.kafka_code
    accepted = _acknowledge(raw, group, member, 1, topic_id, 0, 0, 1)
    assert accepted.error_code == 0 and accepted.responses[0].partitions[0].error_code == 0
    unknown = _fetch(raw, group, member, 2, [(uuid.uuid4(), 0, [])])
    codes = {(t.topic_id, p.partition_index): p.error_code for t in unknown.responses for p in t.partitions}
    assert E.UNKNOWN_TOPIC_ID.kafka_code in codes.values()
    # closing the session gives back what the member still holds: offset 1, to whoever fetches next,
    # its delivery not counted (Kafka's release of a leaving member's records decreases the count)
    closed = _acknowledge(raw, group, member, -1, topic_id, 0, 0, 1)
    assert closed.error_code == 0
    assert _acknowledge(raw, group, member, 4, topic_id, 1, 1, 1).error_code == E.SHARE_SESSION_NOT_FOUND.kafka_code
    again = _fetch(raw, group, "m-next", 0, [(topic_id, 0, [])])
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in again.responses[0].partitions[0].acquired_records] == [
        (1, 1, 1)
    ]


def test_a_topic_made_again_is_unknown_by_the_id_the_gateway_resolved_before(
    gateway: GatewayProcess, raw: RawConnection, store: Broker
) -> None:
    """The gateway keeps the names of the topic ids it resolved; a topic deleted and made again
    has a new id, and its old one is UNKNOWN_TOPIC_ID at once, acquiring and acknowledging."""
    topic = _topic(raw, partitions=1)
    old_id, group, member = _topic_id(raw, topic), _group(store), "m-" + uuid.uuid4().hex
    _produce(gateway.bootstrap, topic, [b"x"], partitions=1)
    _enter(raw, group, member, topic)
    opened = _fetch(raw, group, member, 0, [(old_id, 0, [])])
    assert [(a.first_offset, a.last_offset) for a in opened.responses[0].partitions[0].acquired_records] == [(0, 0)]
    topics_service.delete_topic(store, topic)
    topics_service.create_topic(store, topic, 1)
    _produce(gateway.bootstrap, topic, [b"y"], partitions=1)
    new_id = _topic_id(raw, topic)
    assert new_id != old_id
    stale = _fetch(raw, group, member, 1, [(old_id, 0, [(0, 0, 1)])])
    [part] = stale.responses[0].partitions
    assert (part.error_code, part.acknowledge_error_code) == (E.UNKNOWN_TOPIC_ID.kafka_code, E.UNKNOWN_TOPIC_ID.kafka_code)
    refused = _acknowledge(raw, group, member, 2, old_id, 0, 0, 1)
    assert refused.responses[0].partitions[0].error_code == E.UNKNOWN_TOPIC_ID.kafka_code
    fresh = _fetch(raw, group, member, 3, [(new_id, 0, [])])
    got = {
        t.topic_id: [(a.first_offset, a.last_offset) for p in t.partitions for a in p.acquired_records] for t in fresh.responses
    }
    assert got[new_id] == [(0, 0)]
    # An id never known: the partition's error and its acknowledgement's are both UNKNOWN_TOPIC_ID.
    unknown = _fetch(raw, group, member, 4, [(uuid.uuid4(), 0, [(0, 0, 1)])])
    [entry] = [p for t in unknown.responses if t.topic_id not in (old_id, new_id) for p in t.partitions]
    assert (entry.error_code, entry.acknowledge_error_code) == (E.UNKNOWN_TOPIC_ID.kafka_code, E.UNKNOWN_TOPIC_ID.kafka_code)


def test_an_idle_share_fetch_waits_for_records(gateway: GatewayProcess, raw: RawConnection, store: Broker) -> None:
    topic = _topic(raw, partitions=1)
    topic_id, group = _topic_id(raw, topic), _group(store)
    _enter(raw, group, "idle", topic)
    started = time.monotonic()
    empty = _fetch(raw, group, "idle", 0, [(topic_id, 0, [])], wait_ms=600)
    assert empty.responses[0].partitions[0].acquired_records == []
    assert time.monotonic() - started >= 0.5  # parked for its MaxWaitMs, not answered at once
    correlation = raw.send(
        ApiKey.ShareFetch,
        1,
        {
            "group_id": group,
            "member_id": "idle",
            "share_session_epoch": 1,
            "max_wait_ms": 20_000,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "max_records": 10,
            "batch_size": 10,
            "topics": [],
            "forgotten_topics_data": [],
        },
    )
    assert correlation is not None
    _produce(gateway.bootstrap, topic, [b"wake"], partitions=1)
    frame = raw.read_frame()
    assert frame is not None
    got, woken = decode_response(ApiKey.ShareFetch, 1, frame)
    assert got == correlation and time.monotonic() - started < 15  # woken by the append, long before its MaxWaitMs
    assert [(a.first_offset, a.last_offset) for a in woken.responses[0].partitions[0].acquired_records] == [(0, 0)]


def test_list_groups_shows_share_groups_and_delete_groups_deletes_an_empty_one(raw: RawConnection, store: Broker) -> None:
    topic, group = _topic(raw), _name("share-group")
    assert _heartbeat(raw, group, "m1", 0, [topic]).error_code == 0

    def listed(types: list[str], states: list[str] | None = None) -> list[tuple[str, str, str]]:
        answer = raw.request(ApiKey.ListGroups, 5, {"states_filter": states or [], "types_filter": types})
        return [(g.group_type, g.group_state, g.protocol_type) for g in answer.groups if g.group_id == group]

    assert listed(["share"]) == listed([]) == listed(["SHARE"], ["stable"]) == [("share", "Stable", "share")]
    assert listed(["classic"]) == listed([], ["Empty"]) == []
    deleted = raw.request(ApiKey.DeleteGroups, 2, {"groups_names": [group]}).results[0]
    assert deleted.error_code == E.NON_EMPTY_GROUP.kafka_code
    assert _heartbeat(raw, group, "m1", -1, None).error_code == 0
    assert listed(["share"]) == [("share", "Empty", "share")]
    assert raw.request(ApiKey.DeleteGroups, 2, {"groups_names": [group]}).results[0].error_code == 0
    assert listed([]) == []
    assert raw.request(ApiKey.ShareGroupDescribe, 1, {"group_ids": [group], "include_authorized_operations": False}).groups[
        0
    ].error_code == (E.GROUP_ID_NOT_FOUND.kafka_code)


def test_share_group_offsets_described_altered_and_deleted(gateway: GatewayProcess, raw: RawConnection, store: Broker) -> None:
    topic = _topic(raw, partitions=1)
    topic_id, group = _topic_id(raw, topic), _group(store)
    _produce(gateway.bootstrap, topic, [b"a", b"b", b"c"], partitions=1)
    _enter(raw, group, "m1", topic)
    opened = _fetch(raw, group, "m1", 0, [(topic_id, 0, [])])
    assert [(a.first_offset, a.last_offset) for a in opened.responses[0].partitions[0].acquired_records] == [(0, 2)]
    assert _acknowledge(raw, group, "m1", 1, topic_id, 0, 0, 1).responses[0].partitions[0].error_code == 0

    def described(topics: Any) -> Any:
        return raw.request(ApiKey.DescribeShareGroupOffsets, 0, {"groups": [{"group_id": group, "topics": topics}]}).groups[0]

    every = described(None)
    assert [
        (t.topic_name, t.topic_id, [(p.partition_index, p.start_offset, p.error_code) for p in t.partitions])
        for t in every.topics
    ] == [(topic, topic_id, [(0, 1, 0)])]
    asked = described([{"topic_name": topic, "partitions": [0, 7]}, {"topic_name": "no-such-topic", "partitions": [0]}])
    assert [[(p.partition_index, p.start_offset, p.error_code) for p in t.partitions] for t in asked.topics] == [
        [(0, 1, 0), (7, -1, E.UNKNOWN_TOPIC_OR_PARTITION.kafka_code)],
        [(0, -1, E.UNKNOWN_TOPIC_OR_PARTITION.kafka_code)],
    ]
    # with a member in the group, neither alter nor delete
    alter = {"group_id": group, "topics": [{"topic_name": topic, "partitions": [{"partition_index": 0, "start_offset": 0}]}]}
    assert raw.request(ApiKey.AlterShareGroupOffsets, 0, alter).error_code == E.NON_EMPTY_GROUP.kafka_code
    delete = {"group_id": group, "topics": [{"topic_name": topic}, {"topic_name": "no-such-topic"}]}
    assert raw.request(ApiKey.DeleteShareGroupOffsets, 0, delete).error_code == E.NON_EMPTY_GROUP.kafka_code
    assert _heartbeat(raw, group, "m1", -1, None).error_code == 0  # leaving gives back offsets 1 and 2
    altered = raw.request(ApiKey.AlterShareGroupOffsets, 0, alter)
    assert (altered.error_code, [[p.error_code for p in t.partitions] for t in altered.responses]) == (0, [[0]])
    assert [p.start_offset for t in described(None).topics for p in t.partitions] == [0]
    _enter(raw, group, "m2", topic)
    again = _fetch(raw, group, "m2", 0, [(topic_id, 0, [])])
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in again.responses[0].partitions[0].acquired_records] == [
        (0, 2, 1)
    ]
    assert _acknowledge(raw, group, "m2", -1, topic_id, 0, 2, 1).error_code == 0
    assert _heartbeat(raw, group, "m2", -1, None).error_code == 0
    deleted = raw.request(ApiKey.DeleteShareGroupOffsets, 0, delete)
    assert [(r.topic_name, r.error_code) for r in deleted.responses] == [
        (topic, 0),
        ("no-such-topic", E.UNKNOWN_TOPIC_OR_PARTITION.kafka_code),
    ]
    assert described(None).topics == []


def test_group_configs_through_describe_and_incremental_alter_configs(
    gateway: GatewayProcess, raw: RawConnection, store: Broker
) -> None:
    group = _name("share-group")

    def alter(*ops: tuple[str, int, str | None], validate_only: bool = False) -> tuple[int, str | None]:
        answer = raw.request(
            ApiKey.IncrementalAlterConfigs,
            1,
            {
                "resources": [
                    {
                        "resource_type": 32,
                        "resource_name": group,
                        "configs": [{"name": n, "config_operation": o, "value": v} for n, o, v in ops],
                    }
                ],
                "validate_only": validate_only,
            },
        ).responses[0]
        return answer.error_code, answer.error_message

    def described() -> dict[str, tuple[str, int]]:
        result = raw.request(
            ApiKey.DescribeConfigs,
            4,
            {
                "resources": [{"resource_type": 32, "resource_name": group, "configuration_keys": None}],
                "include_synonyms": False,
                "include_documentation": False,
            },
        ).results[0]
        assert result.error_code == 0
        return {c.name: (c.value, c.config_source) for c in result.configs}  # 5 DEFAULT_CONFIG, 8 DYNAMIC_GROUP_CONFIG

    assert described()["share.record.lock.duration.ms"] == ("30000", 5)
    assert alter(("share.record.lock.duration.ms", 0, "15000"), ("share.isolation.level", 0, "read_committed")) == (0, None)
    assert alter(("share.delivery.count.limit", 0, "3"), validate_only=True) == (0, None)
    code, message = alter(("share.delivery.count.limit", 0, "1"))
    assert code == E.INVALID_CONFIG.kafka_code and message and "share.delivery.count.limit" in message
    assert alter(("share.no.such.config", 0, "1"))[0] == E.INVALID_CONFIG.kafka_code
    assert alter(("share.isolation.level", 2, "x"))[0] == E.INVALID_CONFIG.kafka_code  # APPEND: not a list
    got = described()
    assert got["share.record.lock.duration.ms"] == ("15000", 8)
    assert got["share.isolation.level"] == ("read_committed", 8)
    assert got["share.delivery.count.limit"] == ("5", 5)
    assert set(got) >= {"share.session.timeout.ms", "share.heartbeat.interval.ms", "share.auto.offset.reset"}
    assert share_configs.group_config(store, group).delivery.record_lock_duration_ms == 15_000
    assert alter(("share.record.lock.duration.ms", 1, None)) == (0, None)
    assert described()["share.record.lock.duration.ms"] == ("30000", 5)


def test_alter_configs_replaces_a_share_groups_configs(raw: RawConnection, store: Broker) -> None:
    """AlterConfigs (the whole-set call) of a GROUP resource, as Kafka 4.x's controller serves it:
    the configs given are the group's, every other back to its default; a bad one changes nothing."""
    group = _name("share-group")
    share_configs.alter_group_configs(
        store, group, {"share.record.lock.duration.ms": "20000", "share.isolation.level": "read_committed"}
    )

    def replace(configs: dict[str, str | None], validate_only: bool = False) -> tuple[int, str | None]:
        answer = raw.request(
            ApiKey.AlterConfigs,
            2,
            {
                "resources": [
                    {
                        "resource_type": 32,
                        "resource_name": group,
                        "configs": [{"name": n, "value": v} for n, v in configs.items()],
                    }
                ],
                "validate_only": validate_only,
            },
        ).responses[0]
        assert (answer.resource_type, answer.resource_name) == (32, group)
        return answer.error_code, answer.error_message

    before = {"share.record.lock.duration.ms": "20000", "share.isolation.level": "read_committed"}
    assert replace({"share.delivery.count.limit": "3"}, validate_only=True) == (0, None)
    assert share_configs.group_configs_set(store, group) == before
    code, message = replace({"share.delivery.count.limit": "1", "share.isolation.level": "read_uncommitted"})
    assert code == E.INVALID_CONFIG.kafka_code and message and "share.delivery.count.limit" in message
    assert replace({"share.no.such.config": "1"})[0] == E.INVALID_CONFIG.kafka_code
    assert replace({"share.delivery.count.limit": None})[0] == E.INVALID_CONFIG.kafka_code
    assert share_configs.group_configs_set(store, group) == before  # nothing changed by a refused call
    assert replace({"share.delivery.count.limit": "3", "share.auto.offset.reset": "earliest"}) == (0, None)
    assert share_configs.group_configs_set(store, group) == {
        "share.delivery.count.limit": "3",
        "share.auto.offset.reset": "earliest",
    }
    config = share_configs.group_config(store, group)
    assert (config.delivery.record_lock_duration_ms, config.isolation_level) == (30_000, "read_uncommitted")
    assert replace({}) == (0, None)
    assert share_configs.group_configs_set(store, group) == {}


def _fetch_body(group: str, member: str, epoch: int, parts: list[tuple[uuid.UUID, int]], **fields: int) -> dict:
    return {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": 500,
        "batch_size": 500,
        **fields,
        "topics": [{"topic_id": t, "partitions": [{"partition_index": p, "acknowledgement_batches": []}]} for t, p in parts],
        "forgotten_topics_data": [],
    }


def _acquired(answer: Any) -> dict[int, list[tuple[int, int, int]]]:
    return {
        p.partition_index: [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
        for t in answer.responses
        for p in t.partitions
    }


def test_share_fetch_honours_max_records_batch_size_and_max_bytes(
    gateway: GatewayProcess, raw: RawConnection, store: Broker
) -> None:
    topic = _topic(raw, partitions=2)
    topic_id, group = _topic_id(raw, topic), _group(store)
    _produce(gateway.bootstrap, topic, [bytes([65 + i]) * 1000 for i in range(20)], partitions=2)  # 10 a partition
    _enter(raw, group, "m1", topic)
    # MaxRecords caps what is acquired over the request; BatchSize cuts it into AcquiredRecords
    first = raw.request(ApiKey.ShareFetch, 1, _fetch_body(group, "m1", 0, [(topic_id, 0)], max_records=5, batch_size=2))
    assert first.error_code == 0
    assert _acquired(first) == {0: [(0, 1, 1), (2, 3, 1), (4, 4, 1)]}
    assert len(first.responses[0].partitions[0].records) > 0
    # MaxBytes is split evenly over the partitions fetched: 4,500 bytes gives each partition room
    # for two records of 1,000 bytes, a record past its share left for the next fetch
    second = raw.request(ApiKey.ShareFetch, 1, _fetch_body(group, "m1", 1, [(topic_id, 1)], max_bytes=4_500))
    assert second.error_code == 0
    assert _acquired(second) == {0: [(5, 6, 1)], 1: [(0, 1, 1)]}
    # a MaxBytes smaller than one record still gives one record on each partition (KIP-74)
    third = raw.request(ApiKey.ShareFetch, 1, _fetch_body(group, "m1", 2, [], max_bytes=10))
    assert _acquired(third) == {0: [(7, 7, 1)], 1: [(2, 2, 1)]}


def test_share_fetch_waits_for_min_bytes_or_its_max_wait(gateway: GatewayProcess, raw: RawConnection, store: Broker) -> None:
    topic = _topic(raw, partitions=1)
    topic_id, group = _topic_id(raw, topic), _group(store)
    _enter(raw, group, "m1", topic)
    _produce(gateway.bootstrap, topic, [b"a" * 300], partitions=1)
    # MinBytes not reached within MaxWaitMs: the answer gives what it acquired
    short = raw.request(ApiKey.ShareFetch, 1, _fetch_body(group, "m1", 0, [(topic_id, 0)], min_bytes=1_000, max_wait_ms=300))
    assert _acquired(short) == {0: [(0, 0, 1)]}
    # parked for MinBytes: the answer comes once enough has been appended, with all of it
    _produce(gateway.bootstrap, topic, [b"b" * 300], partitions=1)
    correlation = raw.send(ApiKey.ShareFetch, 1, _fetch_body(group, "m1", 1, [], min_bytes=1_000, max_wait_ms=50_000))
    _produce(gateway.bootstrap, topic, [b"c" * 300, b"d" * 300, b"e" * 300], partitions=1)
    frame = raw.read_frame()
    assert frame is not None
    got, answer = decode_response(ApiKey.ShareFetch, 1, frame)
    assert got == correlation and answer.error_code == 0
    offsets = [(o, count) for first, last, count in _acquired(answer)[0] for o in range(first, last + 1)]
    assert offsets == [(1, 1), (2, 1), (3, 1), (4, 1)]  # 1,200 bytes: the first record and the three appended after


def test_share_fetch_and_acknowledge_of_a_member_not_in_the_group_are_refused(
    gateway: GatewayProcess, raw: RawConnection, store: Broker
) -> None:
    """Kafka answers a request whose share session is not held SHARE_SESSION_NOT_FOUND, and a
    member's share sessions end with it: a member that never joined, left or was fenced is
    refused so, whatever the epoch, and nothing is acquired or acknowledged."""
    topic = _topic(raw, partitions=1)
    topic_id, group = _topic_id(raw, topic), _group(store)
    _produce(gateway.bootstrap, topic, [b"x", b"y"], partitions=1)
    not_found = E.SHARE_SESSION_NOT_FOUND.kafka_code
    assert _fetch(raw, group, "stranger", 0, [(topic_id, 0, [])]).error_code == not_found
    assert _acknowledge(raw, group, "stranger", 1, topic_id, 0, 0, 1).error_code == not_found
    assert all(p.in_flight == () for p in share_admin.describe(store, group).partitions)
    _enter(raw, group, "m1", topic)
    opened = _fetch(raw, group, "m1", 0, [(topic_id, 0, [])])
    assert opened.error_code == 0 and _acquired(opened) == {0: [(0, 1, 1)]}
    assert _heartbeat(raw, group, "m1", -1, None).error_code == 0  # leaves: its records are given back
    assert _fetch(raw, group, "m1", 1, [(topic_id, 0, [])]).error_code == not_found
    assert _acknowledge(raw, group, "m1", 1, topic_id, 0, 0, 1).error_code == not_found
    assert _fetch(raw, group, "m1", -1, [(topic_id, 0, [(0, 0, 1)])]).error_code == not_found
    # joined again, it opens a new session: the old one went with its membership
    _enter(raw, group, "m1", topic)
    assert _fetch(raw, group, "m1", 2, [(topic_id, 0, [])]).error_code == not_found
    again = _fetch(raw, group, "m1", 0, [(topic_id, 0, [])])
    assert again.error_code == 0 and _acquired(again) == {0: [(0, 1, 1)]}  # the leave did not count a delivery


def test_a_parked_share_fetch_wakes_when_another_members_records_come_back(start_gateway: Any, tmp_path: Path) -> None:
    """B's ShareFetch, parked for records, is answered with A's records once A's lock expires
    (not at the sweeper's round: this gateway's sweeps are ten minutes apart, and nothing appends
    or releases) and once a member holding records leaves."""
    g = start_gateway(kafka_auto_create_topics="true", transaction_abort_check_interval_ms="600000")
    store = make_broker(g.env["TXLOG_DATABASE_URL"])
    try:
        with g.connect() as raw:
            topic = _topic(raw, partitions=1)
            topic_id, group = _topic_id(raw, topic), _group(store)
            _produce(g.bootstrap, topic, [b"a0", b"a1"], partitions=1)
            _enter(raw, group, "b", topic)
            # A holds both records, for 4 seconds (an invisible time, as the HTTP API's acquire may set)
            held = share_service.acquire(store, group, "a", [(topic, 0)], lock_duration_ms=4_000)
            assert [(a.first_offset, a.last_offset) for a in held[0].acquired] == [(0, 1)]
            opened = raw.request(ApiKey.ShareFetch, 1, _fetch_body(group, "b", 0, [(topic_id, 0)]))
            assert _acquired(opened) == {0: []}
            correlation = raw.send(ApiKey.ShareFetch, 1, _fetch_body(group, "b", 1, [], max_wait_ms=55_000))
            frame = raw.read_frame()
            assert frame is not None
            got, woken = decode_response(ApiKey.ShareFetch, 1, frame)
            # answered with A's records, their second delivery: woken by A's lock deadline, before
            # its MaxWaitMs ended (a fetch that waits it out answers with nothing)
            assert got == correlation and _acquired(woken) == {0: [(0, 1, 2)]}
            assert share_service.acknowledge(store, group, "b", {(topic, 0): [_accept(0, 1)]})[0].error is None

            # a member leaving gives its records back at once: the parked fetch takes them
            _produce(g.bootstrap, topic, [b"c2"], partitions=1)
            _enter(raw, group, "c", topic)
            with g.connect() as other:
                taken = other.request(ApiKey.ShareFetch, 1, _fetch_body(group, "c", 0, [(topic_id, 0)]))
                assert _acquired(taken) == {0: [(2, 2, 1)]}
                correlation = raw.send(ApiKey.ShareFetch, 1, _fetch_body(group, "b", 2, [], max_wait_ms=55_000))
                assert _heartbeat(other, group, "c", -1, None).error_code == 0
            frame = raw.read_frame()
            assert frame is not None
            got, woken = decode_response(ApiKey.ShareFetch, 1, frame)
            assert got == correlation and _acquired(woken) == {0: [(2, 2, 1)]}
    finally:
        store.db.dispose()


def _accept(first: int, last: int) -> Any:
    from app.domain.share_partition import AcknowledgementBatch

    return AcknowledgementBatch(first, last, (1,))


def test_a_classic_groups_id_is_not_a_share_group(raw: RawConnection) -> None:
    topic, group = _topic(raw), _name("classic-group")
    _join(raw, group)
    answer = _heartbeat(raw, group, "m1", 0, [topic])
    assert (answer.error_code, answer.error_message) == (E.GROUP_ID_NOT_FOUND.kafka_code, f"Group {group} is not a share group.")


def test_share_apis_need_kafkas_acls(doors: Doors) -> None:  # noqa: F811
    """ShareGroupHeartbeat: Read on the group, Describe on each topic; ShareFetch and
    ShareAcknowledge: Read on the group (the request's error) and Read on each topic (the
    partition's); ShareGroupDescribe: Describe on the group and on each topic it names (the group's
    error); AlterConfigs of the group: AlterConfigs on it."""
    who, token = doors.principal("sharer")
    topic, other = doors.topic("share-acl"), doors.topic("share-acl-other")
    group = _name("share-acl-group")
    doors.grant(who, R.TOPIC, topic, O.READ)
    doors.grant(who, R.TOPIC, other, O.DESCRIBE)
    with doors.signed_in(who, token) as conn:
        # the topics' grants reach the gateway with its next ACL snapshot: Metadata shows their ids then
        topic_id = wait_until(lambda: _topic_id(conn, topic), 10, 0.1, "Read on the topic to apply")
        other_id = wait_until(lambda: _topic_id(conn, other), 10, 0.1, "Describe on the other topic to apply")
        assert _heartbeat(conn, group, "m1", 0, [topic]).error_code == E.GROUP_AUTHORIZATION_FAILED.kafka_code
        assert _fetch(conn, group, "m1", 0, [(topic_id, 0, [])]).error_code == E.GROUP_AUTHORIZATION_FAILED.kafka_code
        assert _acknowledge(conn, group, "m1", 1, topic_id, 0, 0, 1).error_code == E.GROUP_AUTHORIZATION_FAILED.kafka_code
        described = conn.request(ApiKey.ShareGroupDescribe, 1, {"group_ids": [group], "include_authorized_operations": False})
        assert described.groups[0].error_code == E.GROUP_AUTHORIZATION_FAILED.kafka_code
        whole_set = {
            "resources": [
                {"resource_type": 32, "resource_name": group, "configs": [{"name": "share.delivery.count.limit", "value": "3"}]}
            ],
            "validate_only": False,
        }
        altered = conn.request(ApiKey.AlterConfigs, 2, whole_set).responses[0]
        assert altered.error_code == E.GROUP_AUTHORIZATION_FAILED.kafka_code  # AlterConfigs on the group, as Kafka
        doors.grant(who, R.GROUP, group, O.READ)
        wait_until(lambda: _heartbeat(conn, group, "m1", 0, [topic]).error_code == 0, 10, 0.1, "Read on the group to apply")
        refused = _heartbeat(conn, group, "m2", 0, [topic, f"never-{uuid.uuid4().hex[:6]}"])
        assert (refused.error_code, refused.error_message) == (E.TOPIC_AUTHORIZATION_FAILED.kafka_code, None)
        assert _heartbeat(conn, group, "m3", 0, [other]).error_code == 0  # Describe is enough to subscribe
        fetched = _fetch(conn, group, "m1", 0, [(topic_id, 0, []), (other_id, 0, [])])
        codes = {t.topic_id: t.partitions[0].error_code for t in fetched.responses}
        assert (fetched.error_code, codes) == (0, {topic_id: 0, other_id: E.TOPIC_AUTHORIZATION_FAILED.kafka_code})
        assert (
            conn.request(ApiKey.ShareGroupDescribe, 1, {"group_ids": [group], "include_authorized_operations": False})
            .groups[0]
            .error_code
            == 0
        )
    # a caller allowed to Describe the group but not one of the topics it names is not shown the group
    viewer, viewer_token = doors.principal("share-viewer")
    doors.grant(viewer, R.GROUP, group, O.DESCRIBE)
    doors.grant(viewer, R.TOPIC, topic, O.DESCRIBE)
    with doors.signed_in(viewer, viewer_token) as conn:
        wait_until(lambda: _topic_id(conn, topic), 10, 0.1, "Describe on the topic to apply")
        hidden = conn.request(ApiKey.ShareGroupDescribe, 1, {"group_ids": [group], "include_authorized_operations": False})
        assert (hidden.groups[0].error_code, hidden.groups[0].error_message, hidden.groups[0].members) == (
            E.TOPIC_AUTHORIZATION_FAILED.kafka_code,
            "The group has described topic(s) that the client is not authorized to describe.",
            [],
        )
