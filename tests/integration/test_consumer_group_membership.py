"""KIP-848 consumer groups in PostgreSQL: a heartbeat loads, decides and persists under the group
row's lock, so two brokers (processes) serve one group and neither holds its state; a member that
does not revoke within its rebalance timeout, or falls silent, is fenced by the sweeper."""

from __future__ import annotations

import pytest

from app.domain.groups import consumer_group as cg
from app.services import consumer_groups, sweeper, topics
from tests.conftest import make_broker

G = "modern"


def _join(broker, member: str, *names: str) -> cg.HeartbeatAnswer:  # type: ignore[no-untyped-def]
    request = cg.HeartbeatRequest(G, member, 0, rebalance_timeout_ms=5_000, subscribed_topic_names=list(names), owned={})
    return consumer_groups.heartbeat(broker, request)


def _beat(broker, member: str, epoch: int, owned) -> cg.HeartbeatAnswer:  # type: ignore[no-untyped-def]
    return consumer_groups.heartbeat(broker, cg.HeartbeatRequest(G, member, epoch, owned=owned))


@pytest.fixture
def topic(clocked_broker) -> str:  # type: ignore[no-untyped-def]
    topics.create_topic(clocked_broker, "orders", 2)
    return "orders"


def test_two_brokers_serve_one_group(clocked_broker, clock, db_url, topic) -> None:  # type: ignore[no-untyped-def]
    other = make_broker(db_url, clock)
    try:
        first = _join(clocked_broker, "m1", topic)
        assert first.member_epoch == 1 and first.assignment is not None
        owned = first.assignment
        second = _join(other, "m2", topic)
        assert second.member_epoch == 2 and second.assignment == {}  # nothing released yet
        revoking = _beat(other, "m1", 1, owned)  # the other broker asks m1 to give one up
        assert revoking.member_epoch == 1 and revoking.assignment is not None and len(revoking.assignment[next(iter(owned))]) == 1
        done = _beat(clocked_broker, "m1", 1, revoking.assignment)
        assert done.member_epoch == 2
        given = _beat(clocked_broker, "m2", 2, {})
        assert given.assignment is not None and len(next(iter(given.assignment.values()))) == 1
        [described] = consumer_groups.describe(other, [G])
        assert described.group is not None and described.group.state == cg.STABLE
        assert consumer_groups.list_groups(other) == [(G, cg.STABLE)]
    finally:
        other.db.dispose()


def test_the_sweeper_fences_a_member_that_does_not_revoke_and_one_gone_silent(clocked_broker, clock, topic) -> None:  # type: ignore[no-untyped-def]
    b = clocked_broker
    owned = _join(b, "m1", topic).assignment
    _join(b, "m2", topic)
    _beat(b, "m1", 1, owned)  # asked to revoke; it never does
    clock.advance(5_000)
    assert sweeper.sweep(b).consumer_members_fenced == 1
    [described] = consumer_groups.describe(b, [G])
    assert described.group is not None and sorted(described.group.members) == ["m2"]
    clock.advance(cg.SESSION_TIMEOUT_MS)
    assert sweeper.sweep(b).consumer_members_fenced == 1
    [described] = consumer_groups.describe(b, [G])
    assert described.group is not None and described.group.state == cg.EMPTY
    assert consumer_groups.delete_group(b, G)
