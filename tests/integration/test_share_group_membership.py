"""Share groups' membership in PostgreSQL: a heartbeat loads, decides and persists under the group
row's lock, so two brokers (processes) serve one group; a member whose session ends is fenced by the
next heartbeat of its group or by the sweeper, and its acquired records are given back; the views
show members, lock holders and delivery counts."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.domain import share_groups as sg
from app.domain.records import NewRecord
from app.errors import ErrorCode, TxlogError
from app.services import produce as produce_service
from app.services import share, share_admin, share_configs, share_groups, sweeper, topics
from app.services.produce import ProduceRequest
from tests.conftest import make_broker

G = "membership"


def _join(broker, member: str, *names: str) -> sg.HeartbeatAnswer:  # type: ignore[no-untyped-def]
    return share_groups.heartbeat(broker, sg.HeartbeatRequest(G, member, 0, None, list(names), "client", "host"))


def _beat(broker, member: str, epoch: int) -> sg.HeartbeatAnswer:  # type: ignore[no-untyped-def]
    return share_groups.heartbeat(broker, sg.HeartbeatRequest(G, member, epoch))


@pytest.fixture
def topic(clocked_broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(clocked_broker, "jobs", 2)
    share_configs.alter_group_configs(clocked_broker, G, {"share.auto.offset.reset": "earliest"})
    return "jobs"


def test_two_brokers_serve_one_group(clocked_broker, clock, db_url, topic) -> None:  # type: ignore[no-untyped-def]
    other = make_broker(db_url, clock)
    try:
        first = _join(clocked_broker, "m1", topic)
        assert (first.member_epoch, first.assignment is not None) == (1, True)
        second = _join(other, "m2", topic)
        assert second.member_epoch == 2
        again = _beat(clocked_broker, "m1", 1)
        assert again.member_epoch == 2 and again.assignment is not None
        assignments = [again.assignment, second.assignment]
        assert sorted(p for a in assignments for ps in a.values() for p in ps) == [0, 1]  # one partition each
        [described] = share_groups.describe(other, [G])
        assert described.group is not None and sorted(described.group.members) == ["m1", "m2"]
        assert (described.group.members["m2"].client_id, described.group.members["m2"].client_host) == ("client", "host")
    finally:
        other.db.dispose()


def test_an_expired_member_is_fenced_and_its_records_given_back(clocked_broker, clock, topic) -> None:  # type: ignore[no-untyped-def]
    b = clocked_broker
    produce_service.produce(b, topic, 0, ProduceRequest([NewRecord(None, f"v{i}".encode()) for i in range(3)]))
    _join(b, "m1", topic)
    got = share.acquire(b, G, "m1", [(topic, 0)])
    assert [a.last_offset for p in got for a in p.acquired] == [2]
    with b.db.read() as conn:
        held = conn.execute(
            text("SELECT lock_holder, state, delivery_count, records FROM txlog.share_in_flight_records WHERE group_id = :g"),
            {"g": G},
        ).all()
        members = conn.execute(
            text("SELECT member_id, acquired_records FROM txlog.share_group_members WHERE group_id = :g"), {"g": G}
        ).all()
        groups = conn.execute(text("SELECT state, members FROM txlog.share_groups WHERE group_id = :g"), {"g": G}).all()
    assert [tuple(r) for r in held] == [("m1", "Acquired", 1, 3)]
    assert [tuple(r) for r in members] == [("m1", 3)] and [tuple(r) for r in groups] == [("Stable", 1)]

    clock.advance(sg.SESSION_TIMEOUT_MS)
    report = sweeper.sweep(b)
    assert report.share_members_fenced == 1
    [described] = share_groups.describe(b, [G])
    assert described.group is not None and described.group.members == {}
    [state] = [p for p in share_admin.describe(b, G).partitions if p.partition == 0]
    assert state.counts["AVAILABLE"] == 3 and state.counts["ACQUIRED"] == 0
    with pytest.raises(TxlogError) as err:
        _beat(b, "m1", 1)
    assert err.value.code is ErrorCode.UNKNOWN_MEMBER_ID


def test_the_next_heartbeat_fences_an_expired_member(clocked_broker, clock, topic) -> None:  # type: ignore[no-untyped-def]
    b = clocked_broker
    produce_service.produce(b, topic, 1, ProduceRequest([NewRecord(None, b"x")]))
    _join(b, "m1", topic)
    share.acquire(b, G, "m1", [(topic, 1)])
    clock.advance(sg.SESSION_TIMEOUT_MS - 1)
    _join(b, "m2", topic)  # m1 still in its session
    clock.advance(1)
    answer = _beat(b, "m2", 2)
    assert answer.member_epoch == 3  # m1 fenced: the group epoch moved
    [described] = share_groups.describe(b, [G])
    assert described.group is not None and sorted(described.group.members) == ["m2"]
    [state] = [p for p in share_admin.describe(b, G).partitions if p.partition == 1]
    assert state.counts["AVAILABLE"] == 1
    assert share_groups.list_groups(b) == [(G, sg.STABLE)]
