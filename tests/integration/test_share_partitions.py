"""Share groups' delivery state on a real PostgreSQL, through the services: members acquire disjoint
records, acknowledgements after a lock expired are refused, the delivery-count limit and rejects
archive, releases redeliver, read_committed never delivers aborted or open transactions' records
nor control records, the start offset advances, and two threads acquiring one share partition
never hold the same record."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from app.domain.records import NewRecord
from app.domain.share_partition import AcknowledgementBatch, AcknowledgeType, RecordState
from app.errors import ErrorCode, TxlogError
from app.services import produce as produce_service
from app.services import share, share_admin, share_configs, share_locks, sweeper, topics
from app.services.produce import ProduceRequest
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer

G = "workers"
LOCK_MS = 30_000


def plain(broker, topic: str, *values: str, partition: int = 0) -> None:  # type: ignore[no-untyped-def]
    produce_service.produce(broker, topic, partition, ProduceRequest([NewRecord(None, v.encode()) for v in values]))


def offsets_of(got: list[share.ShareFetchPartition]) -> list[int]:
    return [r.offset for p in got for r in p.records]


def values_of(got: list[share.ShareFetchPartition]) -> list[str]:
    return [bytes(r.value).decode() for p in got for r in p.records]


def ack(broker, member: str, topic: str, first: int, last: int, kind: AcknowledgeType, partition: int = 0):  # type: ignore[no-untyped-def]
    [answer] = share.acknowledge(broker, G, member, {(topic, partition): [AcknowledgementBatch(first, last, (int(kind),))]})
    return answer


def partition_state(broker, topic: str, partition: int = 0) -> share_admin.SharePartitionDescription:  # type: ignore[no-untyped-def]
    [found] = [p for p in share_admin.describe(broker, G).partitions if (p.topic, p.partition) == (topic, partition)]
    return found


@pytest.fixture
def topic(clocked_broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(clocked_broker, "q", 1)
    share_configs.alter_group_configs(clocked_broker, G, {"share.auto.offset.reset": "earliest"})
    return "q"


def test_two_members_acquire_disjoint_records_that_together_are_the_log(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, *[f"v{i}" for i in range(10)])
    first = share.acquire(b, G, "m1", [(topic, 0)], max_records=4)
    second = share.acquire(b, G, "m2", [(topic, 0)], max_records=100)
    assert offsets_of(first) == [0, 1, 2, 3]
    assert offsets_of(second) == list(range(4, 10))
    assert first[0].delivery_counts == (1, 1, 1, 1)
    assert share.acquire(b, G, "m3", [(topic, 0)])[0].records == ()
    holders = {(r.first_offset, r.last_offset): r.member_id for r in partition_state(b, topic).in_flight}
    assert holders == {(0, 3): "m1", (4, 9): "m2"}


def test_the_default_reset_is_latest(clocked_broker):
    b = clocked_broker
    topics.create_topic(b, "late", 1)
    plain(b, "late", "old-1", "old-2")
    assert share.acquire(b, "fresh", "m", [("late", 0)])[0].records == ()
    plain(b, "late", "new")
    assert values_of(share.acquire(b, "fresh", "m", [("late", 0)])) == ["new"]


def test_accept_advances_the_start_offset(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "a", "b", "c")
    share.acquire(b, G, "m", [(topic, 0)])
    assert ack(b, "m", topic, 0, 1, AcknowledgeType.ACCEPT).error is None
    state = partition_state(b, topic)
    assert (state.start_offset, state.end_offset) == (2, 3)
    assert [(r.first_offset, r.state) for r in state.in_flight] == [(2, RecordState.ACQUIRED)]
    ack(b, "m", topic, 2, 2, AcknowledgeType.ACCEPT)
    state = partition_state(b, topic)
    assert (state.start_offset, state.in_flight) == (3, ())


def test_acknowledging_after_the_lock_expired_is_refused_and_another_member_gets_the_record(clocked_broker, clock, topic):
    b = clocked_broker
    plain(b, topic, "slow")
    share.acquire(b, G, "m1", [(topic, 0)])
    clock.advance(LOCK_MS)
    refused = ack(b, "m1", topic, 0, 0, AcknowledgeType.ACCEPT)
    assert refused.error is not None and refused.error.code is ErrorCode.INVALID_RECORD_STATE
    again = share.acquire(b, G, "m2", [(topic, 0)])
    assert offsets_of(again) == [0] and again[0].delivery_counts == (2,)
    late = ack(b, "m1", topic, 0, 0, AcknowledgeType.ACCEPT)
    assert late.error is not None and late.error.code is ErrorCode.INVALID_RECORD_STATE
    assert ack(b, "m2", topic, 0, 0, AcknowledgeType.ACCEPT).error is None


def test_a_member_cannot_acknowledge_another_members_records(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "x")
    share.acquire(b, G, "m1", [(topic, 0)])
    refused = ack(b, "m2", topic, 0, 0, AcknowledgeType.ACCEPT)
    assert refused.error is not None and refused.error.code is ErrorCode.INVALID_RECORD_STATE


def test_release_redelivers_with_delivery_count_two(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "r")
    share.acquire(b, G, "m1", [(topic, 0)])
    assert ack(b, "m1", topic, 0, 0, AcknowledgeType.RELEASE).error is None
    again = share.acquire(b, G, "m2", [(topic, 0)])
    assert values_of(again) == ["r"] and again[0].delivery_counts == (2,)


def test_reject_archives(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "poison", "fine")
    share.acquire(b, G, "m", [(topic, 0)])
    assert ack(b, "m", topic, 0, 0, AcknowledgeType.REJECT).error is None
    assert ack(b, "m", topic, 1, 1, AcknowledgeType.RELEASE).error is None
    assert values_of(share.acquire(b, G, "m", [(topic, 0)])) == ["fine"]
    assert partition_state(b, topic).start_offset == 1  # the rejected record is done: archived


def test_the_delivery_count_limit_archives(clocked_broker, clock, topic):
    b = clocked_broker
    share_configs.alter_group_configs(b, G, {"share.delivery.count.limit": "2"})
    plain(b, topic, "cursed")
    share.acquire(b, G, "m", [(topic, 0)])
    ack(b, "m", topic, 0, 0, AcknowledgeType.RELEASE)
    second = share.acquire(b, G, "m", [(topic, 0)])
    assert second[0].delivery_counts == (2,)
    clock.advance(LOCK_MS)  # the last delivery's lock expires: archived, never delivered again
    assert share.acquire(b, G, "m", [(topic, 0)])[0].records == ()
    state = partition_state(b, topic)
    assert (state.start_offset, state.in_flight) == (1, ())


def test_an_expired_lock_returns_the_record_through_the_sweeper(clocked_broker, clock, topic):
    b = clocked_broker
    plain(b, topic, "a", "b")
    share.acquire(b, G, "gone", [(topic, 0)])
    clock.advance(LOCK_MS - 1)
    assert share_locks.expire_due(b).released == 0
    clock.advance(1)
    report = sweeper.sweep(b, budget_s=5)
    assert report.share_records_released == 2
    assert [(r.state, r.member_id, r.delivery_count) for r in partition_state(b, topic).in_flight] == [
        (RecordState.AVAILABLE, None, 1)
    ]
    again = share.acquire(b, G, "alive", [(topic, 0)])
    assert offsets_of(again) == [0, 1] and again[0].delivery_counts == (2, 2)


def test_a_member_leaving_gives_its_records_back(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "a", "b", "c")
    share.acquire(b, G, "leaver", [(topic, 0)], max_records=2)
    share.acquire(b, G, "stayer", [(topic, 0)])
    assert share_locks.release_member(b, G, "leaver") == 2
    assert offsets_of(share.acquire(b, G, "stayer", [(topic, 0)])) == [0, 1]


def test_read_committed_never_delivers_aborted_or_open_transactions_nor_control_records(clocked_broker, topic):
    b = clocked_broker
    share_configs.alter_group_configs(b, G, {"share.isolation.level": "read_committed"})
    plain(b, topic, "a")  # 0
    aborted = Producer(b, "tx-a")
    aborted.send(topic, 0, "x1", "x2")  # 1, 2
    aborted.end("abort")  # 3: ABORT marker
    plain(b, topic, "b")  # 4
    open_txn = Producer(b, "tx-o")
    open_txn.send(topic, 0, "y")  # 5, open
    plain(b, topic, "c")  # 6: above the last stable offset while 5 is open

    got = share.acquire(b, G, "m", [(topic, 0)])
    assert values_of(got) == ["a", "b"]
    assert [(a.first_offset, a.last_offset) for a in got[0].acquired] == [(0, 0), (4, 4)]
    assert share.acquire(b, G, "m", [(topic, 0)])[0].records == ()
    open_txn.end("commit")  # 7: COMMIT marker
    got = share.acquire(b, G, "m", [(topic, 0)])
    assert values_of(got) == ["y", "c"]
    assert all(r.control_type is None for r in got[0].records)
    refused = ack(b, "m", topic, 0, 6, AcknowledgeType.ACCEPT)  # 1-3 were never acquired: archived
    assert refused.error is not None and refused.error.code is ErrorCode.INVALID_RECORD_STATE
    for first, last in [(0, 0), (4, 4), (5, 6)]:
        assert ack(b, "m", topic, first, last, AcknowledgeType.ACCEPT).error is None
    assert partition_state(b, topic).start_offset == 8  # aborted records and markers archived, never delivered

    # read_uncommitted delivers the aborted transaction's records (as Kafka's), never a marker.
    uncommitted = share.acquire(b, "dirty", "m", [(topic, 0)], isolation_level="read_uncommitted")
    assert values_of(uncommitted) == []  # latest by default for a group without configs
    share_admin.alter_offsets(b, "dirty", [(topic, 0, 0)])
    uncommitted = share.acquire(b, "dirty", "m", [(topic, 0)], isolation_level="read_uncommitted")
    assert values_of(uncommitted) == ["a", "x1", "x2", "b", "y", "c"]


def test_acknowledging_a_partition_never_read_is_unknown(clocked_broker, topic):
    answer = ack(clocked_broker, "m", topic, 0, 0, AcknowledgeType.ACCEPT)
    assert answer.error is not None and answer.error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_unknown_partitions_answer_per_partition(clocked_broker, topic):
    plain(clocked_broker, topic, "a")
    got = share.acquire(clocked_broker, G, "m", [("nope", 0), (topic, 0)])
    assert got[0].error is not None and got[0].error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert values_of(got[1:]) == ["a"]


def test_alter_and_delete_offsets_start_over(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "a", "b", "c")
    share.acquire(b, G, "m", [(topic, 0)])
    [result] = share_admin.alter_offsets(b, G, [(topic, 0, 2)])
    assert result.error is None
    state = partition_state(b, topic)
    assert (state.start_offset, state.end_offset, state.state_epoch, state.in_flight) == (2, 2, 1, ())
    assert values_of(share.acquire(b, G, "m", [(topic, 0)])) == ["c"]
    assert share_admin.delete_offsets(b, G, [(topic, 0)]) == [(topic, 0)]
    assert share_admin.describe(b, G).partitions == ()
    assert values_of(share.acquire(b, G, "m", [(topic, 0)])) == ["a", "b", "c"]  # earliest again


def test_configs_are_validated_as_kafka_validates_them(clocked_broker):
    with pytest.raises(TxlogError) as err:
        share_configs.alter_group_configs(clocked_broker, G, {"share.delivery.count.limit": "1"})
    assert err.value.code is ErrorCode.INVALID_CONFIG
    with pytest.raises(TxlogError):
        share_configs.alter_group_configs(clocked_broker, G, {"share.isolation.level": "dirty"})
    assert share_configs.alter_group_configs(clocked_broker, G, {"share.isolation.level": "READ_COMMITTED"}) == {
        "share.isolation.level": "read_committed"
    }
    assert share_configs.alter_group_configs(clocked_broker, G, {"share.isolation.level": None}) == {}


def test_reading_a_share_partition_is_a_range_scan_of_its_window(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, *[str(i) for i in range(50)])
    share.acquire(b, G, "m", [(topic, 0)])
    with b.db.transaction() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                text(
                    "EXPLAIN SELECT first_offset FROM txlog.share_in_flight "
                    "WHERE group_id = 'workers' AND topic = 'q' AND partition = 0 AND first_offset >= 10 ORDER BY first_offset"
                )
            )
        )
    assert "share_in_flight_pkey" in plan, plan


def test_two_threads_acquiring_one_share_partition_never_hold_the_same_record(clocked_broker, clock, db_url, topic):
    total = 300
    plain(clocked_broker, topic, *[str(i) for i in range(total)])
    held: dict[str, list[int]] = {"m1": [], "m2": []}
    # Each member served by a process of its own: its own broker, its own connections.
    brokers = {name: make_broker(db_url, clock) for name in held}
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def member(name: str) -> None:
        try:
            start.wait()
            while True:
                got = share.acquire(brokers[name], G, name, [(topic, 0)], max_records=7)
                if got[0].error is not None:
                    assert got[0].error.code.retriable, got[0].error  # a lock wait past its limit
                    continue
                if not got[0].records:
                    return
                held[name] += offsets_of(got)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=member, args=(n,)) for n in held]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for broker in brokers.values():
        broker.db.dispose()
    assert not failures, failures
    assert not set(held["m1"]) & set(held["m2"])
    assert sorted(held["m1"] + held["m2"]) == list(range(total))


def test_renew_extends_the_lock_from_now(clocked_broker, clock, topic):
    b = clocked_broker
    plain(b, topic, "long job")
    share.acquire(b, G, "m", [(topic, 0)])
    clock.advance(LOCK_MS - 1)
    assert ack(b, "m", topic, 0, 0, AcknowledgeType.RENEW).error is None
    clock.advance(LOCK_MS - 1)  # past the first deadline, before the renewed one
    assert share_locks.expire_due(b).released == 0
    assert share.acquire(b, G, "other", [(topic, 0)])[0].records == ()
    assert ack(b, "m", topic, 0, 0, AcknowledgeType.ACCEPT).error is None


def test_a_reset_by_duration_starts_at_the_first_record_that_recent(clocked_broker):
    b = clocked_broker
    topics.create_topic(b, "timed", 1)
    now = b.now()
    produce_service.produce(
        b,
        "timed",
        0,
        ProduceRequest([NewRecord(None, b"old", (), now - 7_200_000), NewRecord(None, b"recent", (), now - 60_000)]),
    )
    share_configs.alter_group_configs(b, "hourly", {"share.auto.offset.reset": "by_duration:PT1H"})
    assert values_of(share.acquire(b, "hourly", "m", [("timed", 0)])) == ["recent"]


def test_the_least_lock_duration_is_the_brokers_setting(db_url):  # type: ignore[no-untyped-def]
    strict, lenient = make_broker(db_url), make_broker(db_url, share_min_record_lock_duration_ms=2_000)
    try:
        with pytest.raises(TxlogError) as err:
            share_configs.alter_group_configs(strict, "short-locks", {"share.record.lock.duration.ms": "2000"})
        assert err.value.code is ErrorCode.INVALID_CONFIG
        assert share_configs.alter_group_configs(lenient, "short-locks", {"share.record.lock.duration.ms": "2000"}) == {
            "share.record.lock.duration.ms": "2000"
        }
        assert share_configs.group_config(strict, "short-locks").delivery.record_lock_duration_ms == 2_000
    finally:
        strict.db.dispose()
        lenient.db.dispose()


def test_a_late_acknowledgement_of_a_record_another_member_accepted_is_refused(clocked_broker, clock, topic):  # type: ignore[no-untyped-def]
    """The slow member's lock expired; the record went to another member, who accepted it, and the
    start offset passed it. The slow member's acknowledgement must not be answered as taken: its
    outcome was never its to decide (the share-group fault test found it answered so)."""
    b = clocked_broker
    plain(b, topic, "job")
    assert values_of(share.acquire(b, G, "slow", [(topic, 0)])) == ["job"]
    clock.advance(LOCK_MS)
    assert values_of(share.acquire(b, G, "fast", [(topic, 0)])) == ["job"]
    assert ack(b, "fast", topic, 0, 0, AcknowledgeType.ACCEPT).error is None
    assert partition_state(b, topic).start_offset == 1
    for kind in (AcknowledgeType.ACCEPT, AcknowledgeType.REJECT, AcknowledgeType.RELEASE):
        late = ack(b, "slow", topic, 0, 0, kind)
        assert late.error is not None and late.error.code is ErrorCode.INVALID_RECORD_STATE, late
    assert partition_state(b, topic).start_offset == 1


def batch(first: int, last: int, kind: AcknowledgeType) -> list[AcknowledgementBatch]:
    return [AcknowledgementBatch(first, last, (int(kind),))]


def test_a_fetch_applies_its_acknowledgements_then_acquires_from_the_state_they_left(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "a", "b", "c", "d")
    assert offsets_of(share.acquire(b, G, "m1", [(topic, 0)], max_records=2)) == [0, 1]
    acked, got = share.fetch(
        b, G, "m1", [(topic, 0)], {(topic, 0): batch(0, 0, AcknowledgeType.ACCEPT) + batch(1, 1, AcknowledgeType.RELEASE)}
    )
    assert [(a.topic, a.partition, a.error) for a in acked] == [(topic, 0, None)]
    assert acked[0].outcome is not None
    # The record released is acquired again by the same fetch, its delivery counted.
    assert offsets_of(got) == [1, 2, 3] and got[0].delivery_counts == (2, 1, 1)
    assert got[0].record_lock_duration_ms == LOCK_MS
    state = partition_state(b, topic)
    assert state.start_offset == 1 and state.counts["ACQUIRED"] == 3


def test_a_refused_acknowledgement_changes_nothing_and_the_fetch_still_acquires(clocked_broker, clock, topic):
    b = clocked_broker
    plain(b, topic, "a")
    share.acquire(b, G, "m1", [(topic, 0)])
    clock.advance(LOCK_MS)
    # m1's lock expired: its late acceptance is refused, and m2's fetch, carrying it in m1's
    # stead, is refused too — while the acquisition in the same transaction takes the record.
    acked, got = share.fetch(b, G, "m2", [(topic, 0)], {(topic, 0): batch(0, 0, AcknowledgeType.ACCEPT)})
    assert acked[0].error is not None and acked[0].error.code is ErrorCode.INVALID_RECORD_STATE
    assert offsets_of(got) == [0] and got[0].delivery_counts == (2,)
    late = ack(b, "m1", topic, 0, 0, AcknowledgeType.ACCEPT)
    assert late.error is not None and late.error.code is ErrorCode.INVALID_RECORD_STATE
    [held] = partition_state(b, topic).in_flight
    assert held.member_id == "m2" and held.state is RecordState.ACQUIRED


def test_acknowledgements_of_partitions_not_read_are_answered_in_their_order(clocked_broker, topic):
    b = clocked_broker
    topics.create_topic(b, "other", 1)
    plain(b, topic, "a")
    plain(b, "other", "x")
    share.acquire(b, G, "m1", [(topic, 0), ("other", 0)])
    acked, got = share.fetch(
        b,
        G,
        "m1",
        [(topic, 0)],
        {
            ("other", 0): batch(0, 0, AcknowledgeType.ACCEPT),
            (topic, 0): batch(0, 0, AcknowledgeType.ACCEPT),
            ("nope", 0): batch(0, 0, AcknowledgeType.ACCEPT),
        },
    )
    assert [(a.topic, a.error is None) for a in acked] == [("other", True), (topic, True), ("nope", False)]
    assert acked[2].error is not None and acked[2].error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert offsets_of(got) == []


def test_a_topic_made_again_is_unknown_by_its_old_id(clocked_broker, topic):
    b = clocked_broker
    plain(b, topic, "a")
    [old] = topics.topics_metadata(b, [topic])
    share.acquire(b, G, "m1", [(topic, 0)], max_records=1)
    topics.delete_topic(b, topic)
    topics.create_topic(b, topic, 1)
    plain(b, topic, "b")
    [new] = topics.topics_metadata(b, [topic])
    assert new.topic_id != old.topic_id
    acked, got = share.fetch(
        b, G, "m1", [(topic, 0)], {(topic, 0): batch(0, 0, AcknowledgeType.ACCEPT)}, topic_ids={topic: old.topic_id}
    )
    assert acked[0].error is not None and acked[0].error.code is ErrorCode.UNKNOWN_TOPIC_ID
    assert got[0].error is not None and got[0].error.code is ErrorCode.UNKNOWN_TOPIC_ID
    [refused] = share.acknowledge(b, G, "m1", {(topic, 0): batch(0, 0, AcknowledgeType.ACCEPT)}, topic_ids={topic: old.topic_id})
    assert refused.error is not None and refused.error.code is ErrorCode.UNKNOWN_TOPIC_ID
    _, got = share.fetch(b, G, "m1", [(topic, 0)], topic_ids={topic: new.topic_id})
    assert got[0].error is None and values_of(got) == ["b"]
