"""Share-group membership and assignment (``app.domain.share_groups``): ShareGroupHeartbeat's joins,
heartbeats, leaves and fencing as Kafka 4.2's coordinator runs them, and the simple assignor, by
example and as hypothesis properties."""

from __future__ import annotations

import random
import uuid
from typing import Any, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain import share_groups as sg
from app.domain.share_groups import HeartbeatRequest, ShareGroup, ShareGroupConfig, TopicMetadata
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.requests import RequestHeader
from app.wire.kafka.structs import decode_response, encode_response

T1 = TopicMetadata("t1", uuid.UUID(int=1), 2)
T2 = TopicMetadata("t2", uuid.UUID(int=2), 1)
TOPICS = {"t1": T1, "t2": T2}


def beat(
    group: ShareGroup | None, member: str, epoch: int, topics: list[str] | None = None, now: int = 0, **kw: Any
) -> sg.HeartbeatOutcome:
    request = HeartbeatRequest("g", member, epoch, subscribed_topic_names=topics, client_id="c", client_host="/127.0.0.1", **kw)
    return sg.heartbeat(group, request, TOPICS, now)


def refused(
    code: ErrorCode, group: ShareGroup | None, member: str, epoch: int, topics: list[str] | None = None, **kw: Any
) -> str:
    with pytest.raises(TxlogError) as caught:
        beat(group, member, epoch, topics, **kw)
    assert caught.value.code is code
    return caught.value.message


# -- the heartbeat ---------------------------------------------------------------------------------


def test_a_first_member_joins_and_is_given_every_partition() -> None:
    out = beat(None, "m1", 0, ["t1"], now=1_000)
    group, answer = out.group, out.answer
    assert (group.group_epoch, group.assignment_epoch, group.state) == (1, 1, sg.STABLE)
    assert answer == sg.HeartbeatAnswer("m1", 1, sg.HEARTBEAT_INTERVAL_MS, {T1.topic_id: frozenset({0, 1})})
    member = group.members["m1"]
    assert (member.member_epoch, member.previous_member_epoch, member.subscribed_topic_names) == (1, 0, frozenset({"t1"}))
    assert member.session_deadline_ms == 1_000 + sg.SESSION_TIMEOUT_MS
    assert (member.client_id, member.client_host) == ("c", "/127.0.0.1")
    assert group.subscription_metadata == {"t1": T1}


def test_a_second_member_bumps_the_group_and_the_first_takes_its_new_share_at_its_next_heartbeat() -> None:
    group = beat(None, "m1", 0, ["t1"]).group
    out = beat(group, "m2", 0, ["t1"])
    group = out.group
    assert (group.group_epoch, group.assignment_epoch) == (2, 2)
    assert out.answer.member_epoch == 2 and out.answer.assignment is not None and len(out.answer.assignment[T1.topic_id]) == 1
    assert group.members["m1"].member_epoch == 1  # not yet told

    out = beat(group, "m1", 1)
    assert out.answer.member_epoch == 2
    assert out.answer.assignment is not None  # its assignment changed: it is sent
    mine, theirs = out.answer.assignment[T1.topic_id], group.target_assignment["m2"][T1.topic_id]
    assert mine | theirs == {0, 1} and not mine & theirs
    group = out.group

    out = beat(group, "m1", 2)
    assert (out.answer.member_epoch, out.answer.assignment) == (2, None)  # nothing changed: nothing sent
    assert out.group.group_epoch == 2


def test_an_answer_lost_is_forgiven_once() -> None:
    group = beat(beat(None, "m1", 0, ["t1"]).group, "m2", 0, ["t1"]).group
    group = beat(group, "m1", 1).group  # m1: epoch 2, previous 1
    out = beat(group, "m1", 1)  # the answer that moved it to 2 was lost
    assert out.answer.member_epoch == 2
    message = refused(ErrorCode.FENCED_MEMBER_EPOCH, group, "m1", 3)
    assert "greater member epoch (3)" in message
    group = beat(group, "m3", 0, ["t1"]).group
    group = beat(group, "m1", 2).group  # m1: epoch 3, previous 2
    assert "smaller member epoch (1)" in refused(ErrorCode.FENCED_MEMBER_EPOCH, group, "m1", 1)


def test_requests_kafka_refuses() -> None:
    assert refused(ErrorCode.INVALID_REQUEST, None, "", 0, ["t1"]) == "MemberId can't be empty."
    assert refused(ErrorCode.INVALID_REQUEST, None, "  ", 0, ["t1"]) == "MemberId can't be empty."
    with pytest.raises(TxlogError, match=r"GroupId can't be empty\."):
        sg.heartbeat(None, HeartbeatRequest(" ", "m", 0, subscribed_topic_names=["t1"]), TOPICS, 0)
    assert refused(ErrorCode.INVALID_REQUEST, None, "m", 0, ["t1"], rack_id="") == "RackId can't be empty."
    assert refused(ErrorCode.INVALID_REQUEST, None, "m", 0, None) == "SubscribedTopicNames must be set in first request."
    assert refused(ErrorCode.INVALID_REQUEST, None, "m", 0, []) == "SubscribedTopicNames must be set in first request."
    assert refused(ErrorCode.INVALID_REQUEST, None, "m", -2, ["t1"]) == "MemberEpoch is invalid."
    group = beat(None, "m1", 0, ["t1"]).group
    assert refused(ErrorCode.UNKNOWN_MEMBER_ID, group, "m9", 1) == "Member m9 is not a member of group g."
    assert refused(ErrorCode.UNKNOWN_MEMBER_ID, None, "m9", 4) == "Member m9 is not a member of group g."


def test_a_full_group_refuses_a_new_member_but_not_its_own() -> None:
    config = ShareGroupConfig(max_size=1)
    group = sg.heartbeat(None, HeartbeatRequest("g", "m1", 0, subscribed_topic_names=["t1"]), TOPICS, 0, config).group
    with pytest.raises(TxlogError) as caught:
        sg.heartbeat(group, HeartbeatRequest("g", "m2", 0, subscribed_topic_names=["t1"]), TOPICS, 0, config)
    assert caught.value.code is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert caught.value.message == "The share group has reached its maximum capacity of 1 members."
    assert sg.heartbeat(group, HeartbeatRequest("g", "m1", 1), TOPICS, 0, config).answer.member_epoch == 1


def test_a_leave_removes_the_member_and_bumps_the_group() -> None:
    group = beat(beat(None, "m1", 0, ["t1"]).group, "m2", 0, ["t1"]).group
    group = beat(group, "m1", 1).group  # m1 down to one partition at epoch 2
    assert len(group.members["m1"].assignment[T1.topic_id]) == 1
    out = beat(group, "m2", -1)
    assert out.answer == sg.HeartbeatAnswer("m2", -1, 0, None)
    assert set(out.group.members) == {"m1"} and "m2" not in out.group.target_assignment
    assert out.group.group_epoch == 3
    out = beat(out.group, "m1", 2)  # the next heartbeat recomputes: m1 holds everything again
    assert out.answer.member_epoch == 3 and out.answer.assignment == {T1.topic_id: frozenset({0, 1})}
    assert refused(ErrorCode.UNKNOWN_MEMBER_ID, out.group, "m2", -1) == "Member m2 is not a member of group g."
    assert refused(ErrorCode.GROUP_ID_NOT_FOUND, None, "m2", -1) == "Group g not found."
    emptied = beat(out.group, "m1", -1).group
    assert emptied.state == sg.EMPTY and emptied.subscription_metadata == {}


def test_a_silent_member_is_fenced_at_its_session_timeout() -> None:
    group = beat(beat(None, "m1", 0, ["t1"], now=0).group, "m2", 0, ["t1"], now=10_000).group
    assert sg.expired_members(group, sg.SESSION_TIMEOUT_MS - 1) == []
    assert sg.expired_members(group, sg.SESSION_TIMEOUT_MS) == ["m1"]
    group = beat(group, "m2", 2, now=40_000).group  # heartbeats push the deadline on
    assert sg.expired_members(group, 40_000 + sg.SESSION_TIMEOUT_MS) == ["m1", "m2"]
    fenced = sg.fence(group, "m1", TOPICS)
    assert set(fenced.members) == {"m2"} and fenced.group_epoch == group.group_epoch + 1


def test_subscriptions_and_topics_changing() -> None:
    group = beat(None, "m1", 0, ["t1", "later"]).group  # a topic that does not exist yet is left out
    assert group.subscription_metadata == {"t1": T1}
    assert sg.topics_needed(group) == {"t1", "later"}
    later = TopicMetadata("later", uuid.UUID(int=3), 3)
    out = sg.heartbeat(group, HeartbeatRequest("g", "m1", 1), {**TOPICS, "later": later}, 0)
    assert out.group.group_epoch == 2  # its creation bumps the group
    assert out.answer.assignment == {T1.topic_id: frozenset({0, 1}), later.topic_id: frozenset({0, 1, 2})}
    grown = TopicMetadata("t1", T1.topic_id, 4)  # partitions added
    out = sg.heartbeat(out.group, HeartbeatRequest("g", "m1", 2), {"t1": grown, "later": later}, 0)
    assert (
        out.group.group_epoch == 3 and out.answer.assignment is not None and out.answer.assignment[T1.topic_id] == set(range(4))
    )
    out = sg.heartbeat(out.group, HeartbeatRequest("g", "m1", 3, subscribed_topic_names=["t2"], rack_id="r1"), TOPICS, 0)
    assert out.answer.assignment == {T2.topic_id: frozenset({0})}
    assert out.group.members["m1"].rack_id == "r1"
    assert sg.topics_needed(out.group, HeartbeatRequest("g", "m1", 4, subscribed_topic_names=["t1"])) == {"t1"}


def test_a_description_names_the_topics_of_every_subscription_and_assignment() -> None:
    assert sg.described_topics(ShareGroup("g")) == frozenset()
    group = beat(beat(None, "m1", 0, ["t1"]).group, "m2", 0, ["t1", "t2"]).group
    assert sg.described_topics(group) == frozenset({"t1", "t2"})


def test_the_answer_and_the_description_encode() -> None:
    group = beat(beat(None, "m1", 0, ["t1", "t2"]).group, "m2", 0, ["t1"]).group
    answer = beat(group, "m1", 1).answer
    framed = encode_response(RequestHeader(ApiKey.ShareGroupHeartbeat, 1, 1, None), answer.body())
    _, decoded = decode_response(ApiKey.ShareGroupHeartbeat, 1, bytes(framed[4:]))
    assert decoded.member_epoch == 2
    assert {t.topic_id: set(t.partitions) for t in decoded.assignment.topic_partitions} == answer.assignment
    described = sg.describe(group)
    assert (described["group_state"], described["assignor_name"], described["group_epoch"]) == ("Stable", "simple", 2)
    framed = encode_response(RequestHeader(ApiKey.ShareGroupDescribe, 1, 1, None), {"groups": [described]})
    _, decoded = decode_response(ApiKey.ShareGroupDescribe, 1, bytes(framed[4:]))
    m2 = next(m for m in decoded.groups[0].members if m.member_id == "m2")
    assert [(t.topic_name, t.partitions) for t in m2.assignment.topic_partitions] == [
        ("t1", sorted(group.members["m2"].assignment[T1.topic_id]))
    ]


# -- the simple assignor -------------------------------------------------------------------------


def counts(assignment: Mapping[str, sg.Assignment]) -> dict[str, int]:
    return {m: sum(len(p) for p in a.values()) for m, a in assignment.items()}


def test_more_members_than_partitions_share_each_partition() -> None:
    one = {"t2": T2}
    assert sg.assign({"a": ["t2"], "b": ["t2"], "c": ["t2"]}, one, {}) == {m: {T2.topic_id: frozenset({0})} for m in "abc"}
    two = {"t1": T1}  # 3 members over 2 partitions: each partition shared by 2, 4 assignments as 2, 1, 1
    out = sg.assign({"a": ["t1"], "b": ["t1"], "c": ["t1"]}, two, {})
    assert counts(out) == {"a": 2, "b": 1, "c": 1}
    assert all(sum(p in a[T1.topic_id] for a in out.values()) == 2 for p in (0, 1))


def test_fewer_members_than_partitions_split_them() -> None:
    t = TopicMetadata("t", uuid.UUID(int=9), 5)
    out = sg.assign({"a": ["t"], "b": ["t"]}, {"t": t}, {})
    assert sorted(counts(out).values()) == [2, 3]
    assert out["a"][t.topic_id] | out["b"][t.topic_id] == set(range(5))


def test_homogeneous_balance_is_over_all_topics_heterogeneous_topic_by_topic() -> None:
    one_each = {"x": TopicMetadata("x", uuid.UUID(int=10), 1), "y": TopicMetadata("y", uuid.UUID(int=11), 1)}
    same = sg.assign({"a": ["x", "y"], "b": ["x", "y"]}, one_each, {})
    assert counts(same) == {"a": 1, "b": 1}  # two partitions, two members: one each
    # M1 on t1, M2 on t2, M3 on both: M3 shares each topic with the one other subscriber
    out = sg.assign({"m1": ["t1"], "m2": ["t2"], "m3": ["t1", "t2"]}, TOPICS, {})
    assert out["m1"] == {T1.topic_id: frozenset({0})} or out["m1"] == {T1.topic_id: frozenset({1})}
    assert out["m3"][T1.topic_id] == {0, 1} - out["m1"][T1.topic_id]
    assert out["m2"] == {T2.topic_id: frozenset({0})} and out["m3"][T2.topic_id] == {0}


def test_the_previous_assignment_is_kept_where_it_keeps_the_balance() -> None:
    t = TopicMetadata("t", uuid.UUID(int=9), 6)
    before = sg.assign({"a": ["t"], "b": ["t"]}, {"t": t}, {})
    after = sg.assign({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": t}, before)
    assert sorted(counts(after).values()) == [2, 2, 2]
    assert after["a"][t.topic_id] <= before["a"][t.topic_id] and after["b"][t.topic_id] <= before["b"][t.topic_id]


def test_unsubscribed_deleted_and_vanished_partitions_are_dropped() -> None:
    ghost = uuid.UUID(int=99)
    previous = {"a": {T1.topic_id: frozenset({0, 1, 7}), ghost: frozenset({0})}, "gone": {T1.topic_id: frozenset({0})}}
    out = sg.assign({"a": ["t2"]}, TOPICS, previous)
    assert out == {"a": {T2.topic_id: frozenset({0})}}
    assert sg.assign({}, TOPICS, previous) == {}
    assert sg.assign({"a": ["nope"], "b": ["nope"]}, TOPICS, {}) == {"a": {}, "b": {}}


def test_a_members_share_is_kafkas_to_the_last_rounding() -> None:
    assert sg.desired_counts(1, 5, 2) == [3, 2]
    assert sg.desired_counts(2, 2, 3) == [2, 1, 1]
    # 29 partitions over 7 members: Kafka's doubles make 29/7 * 7 = 29.000000000000004, so its last
    # member's share rounds up one more (30 wanted for 29 partitions: one member stays a partition short)
    assert sg.desired_counts(1, 29, 7) == [5, 4, 4, 4, 4, 4, 5]


@st.composite
def groups(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, TopicMetadata], dict[str, dict[uuid.UUID, frozenset[int]]]]:
    n_topics = draw(st.integers(1, 4))
    topics = {f"t{i}": TopicMetadata(f"t{i}", uuid.UUID(int=i + 1), draw(st.integers(1, 9))) for i in range(n_topics)}
    names = [*topics, "missing"]
    members = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=12, unique=True))
    homogeneous = draw(st.booleans())
    common = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    subscriptions = {
        m: common if homogeneous else draw(st.lists(st.sampled_from(names), min_size=1, unique=True)) for m in members
    }
    previous: dict[str, dict[uuid.UUID, frozenset[int]]] = {}
    for m in draw(st.lists(st.sampled_from(members), unique=True)):  # some members had partitions, perhaps any
        previous[m] = {
            t.topic_id: frozenset(draw(st.lists(st.integers(0, t.partitions + 1), max_size=4)))
            for t in draw(st.lists(st.sampled_from(list(topics.values())), unique_by=lambda t: t.name, max_size=3))
        }
    return subscriptions, topics, previous


@settings(max_examples=400, deadline=None)
@given(case=groups(), fresh=st.booleans())
def test_assignment_properties(case: Any, fresh: bool) -> None:
    subscriptions, topics, previous = case
    if fresh:
        previous = {}
    out = sg.assign(subscriptions, topics, previous)
    assert set(out) == set(subscriptions)
    # deterministic, whatever the order the caller lists members and topics in
    members = list(subscriptions)
    random.Random(0).shuffle(members)
    assert (
        sg.assign({m: list(reversed(subscriptions[m])) for m in members}, dict(reversed(list(topics.items()))), previous) == out
    )
    homogeneous = len({frozenset(s) for s in subscriptions.values()}) == 1
    if homogeneous:
        partitions = [
            (t.topic_id, p) for name, t in topics.items() if name in subscriptions[members[0]] for p in range(t.partitions)
        ]
        sharing = -(-len(members) // len(partitions)) if partitions else 0
    for name, topic in topics.items():
        subscribers = [m for m in subscriptions if name in subscriptions[m]]
        for m in out:  # only subscribers hold a topic's partitions, and only partitions that exist
            assert topic.topic_id not in out[m] or m in subscribers
            assert all(0 <= p < topic.partitions for p in out[m].get(topic.topic_id, ()))
        if not subscribers:
            continue
        limit = sharing if homogeneous else -(-len(subscribers) // topic.partitions)
        for p in range(topic.partitions):  # every partition assigned, shared no more than the balance allows
            holders = sum(p in out[m].get(topic.topic_id, ()) for m in subscribers)
            assert 1 <= holders <= limit
    # balanced as Kafka's: nobody above its share; from scratch, shares differ by one at most
    if homogeneous and partitions:
        share = dict(zip(sorted(subscriptions), sg.desired_counts(sharing, len(partitions), len(members))))
        assert all(counts(out)[m] <= share[m] for m in out)
        if fresh:
            assert max(counts(out).values()) - min(counts(out).values()) <= 1
    elif not homogeneous and fresh:
        for name, topic in topics.items():
            subscribers = sorted(m for m in subscriptions if name in subscriptions[m])
            if subscribers:
                held = [len(out[m].get(topic.topic_id, ())) for m in subscribers]
                assert max(held) - min(held) <= 1


def test_a_member_is_in_the_group_until_its_session_ends() -> None:
    assert sg.in_group(1_000, 999)
    assert not sg.in_group(1_000, 1_000)  # the deadline itself ends it, as the sweeper fences it then
    assert not sg.in_group(None, 0)  # never joined, left, or fenced and gone
    assert sg.session_expired(1_000, 1_000) and not sg.session_expired(1_001, 1_000)
