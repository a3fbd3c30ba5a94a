"""Consumer groups of the next-generation protocol (KIP-848, ``app.domain.groups.consumer_group``):
ConsumerGroupHeartbeat's joins, reconciliation (revoke first, then assign what is released), leaves,
static members, fencing and timeouts, the uniform and range assignors and the offset checks, by
example; and a hypothesis model of members joining, heartbeating, revoking late or never, leaving
and going silent, checking after every step that no partition is ever owned by two members, that
epochs only move as Kafka moves them, and that a group left alone settles on its target."""

from __future__ import annotations

import uuid
from typing import Any, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from app.domain.groups import assignors, consumer_group_describe
from app.domain.groups import consumer_group as cg
from app.domain.groups.consumer_group import ConsumerGroup, ConsumerGroupConfig, HeartbeatRequest
from app.domain.groups.subscriptions import member_topics
from app.domain.share_groups import Assignment, TopicMetadata
from app.errors import ErrorCode, TxlogError
from app.wire.kafka.messages import ApiKey
from app.wire.kafka.requests import RequestHeader, decode_request
from app.wire.kafka.structs import decode_response, encode_request, encode_response

T1 = TopicMetadata("t1", uuid.UUID(int=1), 4)
T2 = TopicMetadata("t2", uuid.UUID(int=2), 2)
TOPICS = {"t1": T1, "t2": T2}
CONFIG = ConsumerGroupConfig(session_timeout_ms=10_000, heartbeat_interval_ms=1_000)


def beat(
    group: ConsumerGroup | None,
    member: str,
    epoch: int,
    topics: list[str] | None = None,
    owned: Assignment | None = None,
    now: int = 0,
    topic_map: Mapping[str, TopicMetadata] = TOPICS,
    **kw: Any,
) -> cg.HeartbeatOutcome:
    if epoch == 0:
        kw.setdefault("rebalance_timeout_ms", 5_000)
        owned = {} if owned is None else owned
    request = HeartbeatRequest("g", member, epoch, subscribed_topic_names=topics, owned=owned, client_id="c", **kw)
    return cg.heartbeat(group, request, topic_map, now, CONFIG)


def refused(code: ErrorCode, *args: Any, **kw: Any) -> str:
    with pytest.raises(TxlogError) as caught:
        beat(*args, **kw)
    assert caught.value.code is code, caught.value
    return caught.value.message


def parts(assignment: Assignment | None) -> set[tuple[int, int]]:
    return {(t.int, p) for t, ps in (assignment or {}).items() for p in ps}


def test_a_first_member_joins_and_is_given_every_partition() -> None:
    out = beat(None, "m1", 0, ["t1"], now=1_000)
    assert (out.group.group_epoch, out.group.assignment_epoch, out.group.state) == (1, 1, cg.STABLE)
    assert out.answer.member_epoch == 1 and out.answer.heartbeat_interval_ms == 1_000
    assert parts(out.answer.assignment) == {(1, p) for p in range(4)}
    assert out.group.members["m1"].session_deadline_ms == 11_000


def test_a_second_member_waits_for_the_first_to_revoke() -> None:
    group = beat(None, "m1", 0, ["t1"]).group
    out = beat(group, "m2", 0, ["t1"])
    group = out.group
    # m2 is at the new epoch but owns nothing yet: m1 still holds everything
    assert out.answer.member_epoch == 2 and parts(out.answer.assignment) == set()
    assert group.members["m2"].state == cg.UNRELEASED and group.state == cg.RECONCILING
    # m1 is asked to give up two partitions, keeping its epoch
    out = beat(group, "m1", 1, owned={T1.topic_id: frozenset(range(4))}, now=100)
    group = out.group
    assert out.answer.member_epoch == 1 and len(parts(out.answer.assignment)) == 2
    m1 = group.members["m1"]
    assert m1.state == cg.UNREVOKED and m1.rebalance_deadline_ms == 5_100
    # until it says it owns no more than that, nothing moves
    assert beat(group, "m1", 1, owned={T1.topic_id: frozenset(range(4))}).group.members["m1"].state == cg.UNREVOKED
    kept = group.members["m1"].assignment
    out = beat(group, "m1", 1, owned=kept)
    group = out.group
    assert out.answer.member_epoch == 2 and group.members["m1"].state == cg.MEMBER_STABLE
    out = beat(group, "m2", 2, owned={})
    group = out.group
    assert parts(out.answer.assignment) == {(1, p) for p in range(4)} - parts(kept)
    assert group.state == cg.STABLE


def test_a_member_that_does_not_revoke_in_time_is_fenced() -> None:
    group = beat(None, "m1", 0, ["t1"]).group
    group = beat(group, "m2", 0, ["t1"]).group
    group = beat(group, "m1", 1, owned={T1.topic_id: frozenset(range(4))}, now=100).group
    assert cg.expired_members(group, 5_099) == []
    assert cg.expired_members(group, 5_100) == ["m1"]
    group = cg.remove_member(group, "m1", TOPICS)
    out = beat(group, "m2", 2, owned={})
    assert out.answer.member_epoch == 3 and parts(out.answer.assignment) == {(1, p) for p in range(4)}


def test_epochs_fenced_and_the_previous_one_forgiven_with_a_subset() -> None:
    group = beat(None, "m1", 0, ["t1"]).group
    group = beat(group, "m2", 0, ["t2"]).group
    out = beat(group, "m1", 1, owned=group.members["m1"].assignment)
    group = out.group
    assert out.answer.member_epoch == 2
    assert "greater member epoch (3)" in refused(ErrorCode.FENCED_MEMBER_EPOCH, group, "m1", 3, owned={})
    # the answer that moved m1 to 2 was lost: epoch 1 again, owning what it owns, is accepted
    assert beat(group, "m1", 1, owned=group.members["m1"].assignment).answer.member_epoch == 2
    assert "smaller member epoch (1)" in refused(ErrorCode.FENCED_MEMBER_EPOCH, group, "m1", 1, owned=None)
    refused(ErrorCode.UNKNOWN_MEMBER_ID, group, "nobody", 2, owned={})
    # a known member rejoining with 0 starts over
    out = beat(group, "m1", 0, ["t1"])
    assert out.answer.member_epoch == out.group.group_epoch == 4


def test_requests_kafka_refuses() -> None:
    refused(ErrorCode.INVALID_REQUEST, None, " ", 0, ["t1"])
    refused(ErrorCode.INVALID_REQUEST, None, "m1", 0, None)
    refused(ErrorCode.INVALID_REQUEST, None, "m1", 0, ["t1"], owned={T1.topic_id: frozenset({0})})
    refused(ErrorCode.INVALID_REQUEST, None, "m1", -2)
    refused(ErrorCode.INVALID_REQUEST, None, "m1", -3)
    refused(ErrorCode.UNSUPPORTED_ASSIGNOR, None, "m1", 0, ["t1"], server_assignor="sticky")
    refused(ErrorCode.UNKNOWN_MEMBER_ID, None, "m1", 3, owned={})
    refused(ErrorCode.GROUP_ID_NOT_FOUND, None, "m1", -1)
    for pattern in ("t(", r"\p{L}+", "(?=t)t1", r"(t)\1", "[[:alpha:]]+"):
        message = refused(ErrorCode.INVALID_REGULAR_EXPRESSION, None, "m1", 0, None, subscribed_topic_regex=pattern)
        assert pattern in message


def test_a_regex_subscription_takes_the_topics_it_matches_whole() -> None:
    out = beat(None, "m1", 0, None, subscribed_topic_regex="t.", topic_map={"t1": T1})
    assert parts(out.answer.assignment) == {(1, p) for p in range(4)}
    assert cg.topics_needed(out.group) is None
    # a topic created later: the group epoch moves, and the member gets it
    out = beat(out.group, "m1", 1, owned=out.group.members["m1"].assignment, topic_map=TOPICS)
    assert out.group.group_epoch == 2 and parts(out.answer.assignment) == {(1, p) for p in range(4)} | {(2, 0), (2, 1)}
    assert member_topics(out.group.members["m1"], ["t1", "t12", "xt1"]) == {"t1"}


def test_a_regex_group_reads_every_topic_only_when_the_catalogue_moved() -> None:
    """While the topic catalogue stays at the version the group matched its expressions at, a
    heartbeat reads the topics the group knows (and those named), not every topic; a catalogue
    that moved, or an expression the group has not matched yet, reads every topic."""
    request = HeartbeatRequest("g", "m1", 0, rebalance_timeout_ms=5_000, subscribed_topic_regex="t.", owned={})
    assert cg.topics_needed(None, request, 7) is None
    out = cg.heartbeat(None, request, {"t1": T1, "x": TopicMetadata("x", uuid.UUID(int=9), 1)}, 0, CONFIG)
    group = cg.matched_at(out.group, None, 7)
    assert group.topics_version == 7 and set(group.subscription_metadata) == {"t1"}
    again = HeartbeatRequest("g", "m1", 1, owned=group.members["m1"].assignment)
    assert cg.topics_needed(group, again, 7) == {"t1"}
    assert cg.matched_at(group, frozenset({"t1"}), 7) is group
    assert cg.topics_needed(group, again, 8) is None  # a topic created, deleted or grown since
    same = HeartbeatRequest("g", "m1", 1, subscribed_topic_regex="t.", owned=group.members["m1"].assignment)
    assert cg.topics_needed(group, same, 7) == {"t1"}
    other = HeartbeatRequest("g", "m1", 1, subscribed_topic_regex="x.*", owned=group.members["m1"].assignment)
    assert cg.topics_needed(group, other, 7) is None  # an expression not matched yet
    named = HeartbeatRequest("g", "m2", 0, rebalance_timeout_ms=5_000, subscribed_topic_names=["t2"], owned={})
    assert cg.topics_needed(group, named, 7) == {"t1", "t2"}
    newcomer = HeartbeatRequest("g", "m2", 0, rebalance_timeout_ms=5_000, subscribed_topic_regex="t.", owned={})
    assert cg.topics_needed(group, newcomer, 7) is None
    # without expressions the catalogue's version does not matter
    plain = beat(None, "m1", 0, ["t1"]).group
    assert cg.topics_needed(plain, None, None) == {"t1"} and cg.matched_at(plain, frozenset({"t1"}), 3) is plain


def test_leave_and_the_static_members_temporary_leave() -> None:
    group = beat(None, "m1", 0, ["t1"], instance_id="i1").group
    group = beat(group, "m2", 0, ["t1"]).group
    out = beat(group, "m1", -2, instance_id="i1")
    group = out.group
    assert out.answer.member_epoch == -2 and group.members["m1"].assignment  # kept
    assert group.group_epoch == 2
    # the instance comes back under a new id: it takes m1's place, assignment and epoch
    out = beat(group, "m1b", 0, ["t1"], instance_id="i1", now=10)
    group = out.group
    assert "m1" not in group.members and out.answer.member_epoch >= 1
    assert parts(out.answer.assignment) <= {(1, p) for p in range(4)}
    assert group.group_epoch == 2
    # while it is in, another member with that instance id is refused
    refused(ErrorCode.UNRELEASED_INSTANCE_ID, group, "m1c", 0, ["t1"], instance_id="i1")
    refused(ErrorCode.FENCED_INSTANCE_ID, group, "m1c", 1, owned={}, instance_id="i1")
    out = beat(group, "m2", -1)
    assert out.answer.member_epoch == -1 and "m2" not in out.group.members and out.group.group_epoch == 3


def test_a_silent_member_is_fenced_at_its_session_timeout() -> None:
    group = beat(None, "m1", 0, ["t1"], now=0).group
    assert cg.expired_members(group, 9_999) == []
    assert cg.expired_members(group, 10_000) == ["m1"]
    assert cg.next_deadline(group) == 10_000


def test_the_group_asks_for_the_assignor_most_members_ask_for() -> None:
    group = beat(None, "m1", 0, ["t1", "t2"], server_assignor="range").group
    group = beat(group, "m2", 0, ["t1", "t2"], server_assignor="range").group
    assert group.assignor == assignors.RANGE
    target = group.target_assignment
    assert parts(target["m1"]) == {(1, 0), (1, 1), (2, 0)} and parts(target["m2"]) == {(1, 2), (1, 3), (2, 1)}


def test_offset_commits_fenced_by_member_and_assignment_epochs() -> None:
    group = beat(None, "m1", 0, ["t1"]).group
    cg.validate_offset_commit(group, "m1", 1, [("t1", 0)], False, 9)
    with pytest.raises(TxlogError) as caught:
        cg.validate_offset_commit(group, "m1", 1, [("t1", 0)], False, 8)
    assert caught.value.code is ErrorCode.UNSUPPORTED_VERSION
    cg.validate_offset_commit(group, "m1", 1, [("t1", 0)], True, 3)  # TxnOffsetCommit: any version
    for member, epoch, code in (("m2", 1, ErrorCode.UNKNOWN_MEMBER_ID), ("m1", 2, ErrorCode.STALE_MEMBER_EPOCH)):
        with pytest.raises(TxlogError) as caught:
            cg.validate_offset_commit(group, member, epoch, [("t1", 0)], False, 9)
        assert caught.value.code is code
    # m2 joins: m1 revokes two partitions and moves to epoch 3 (after a bump for t2's subscription)
    group = beat(group, "m2", 0, ["t1"]).group
    group = beat(group, "m1", 1, owned={T1.topic_id: frozenset(range(4))}).group
    group = beat(group, "m1", 1, owned=group.members["m1"].assignment).group
    m1 = group.members["m1"]
    assert m1.member_epoch == 2
    kept = sorted(m1.assignment[T1.topic_id])
    # a commit made at epoch 1 of a partition m1 has owned since then is still good (KIP-1251)
    cg.validate_offset_commit(group, "m1", 1, [("t1", kept[0])], False, 9)
    revoked = next(p for p in range(4) if p not in kept)
    with pytest.raises(TxlogError) as caught:
        cg.validate_offset_commit(group, "m1", 1, [("t1", revoked)], False, 9)
    assert caught.value.code is ErrorCode.STALE_MEMBER_EPOCH
    # an empty group takes commits from anyone with no epoch
    cg.validate_offset_commit(ConsumerGroup("g"), "", -1, [("t1", 0)], False, 9)
    cg.validate_offset_fetch(group, None, -1)
    with pytest.raises(TxlogError):
        cg.validate_offset_fetch(group, "m1", 1)


def test_the_answer_and_the_description_encode() -> None:
    out = beat(None, "m1", 0, ["t1"], instance_id="i")
    group, answer = out.group, out.answer
    assert beat(group, "m1", 1, owned=group.members["m1"].assignment).answer.assignment is None  # unchanged
    for version in (0, 1):
        framed = encode_response(RequestHeader(ApiKey.ConsumerGroupHeartbeat, version, 1, None), answer.body())
        _, decoded = decode_response(ApiKey.ConsumerGroupHeartbeat, version, bytes(framed[4:]))
        assert decoded.member_epoch == 1
        assert {t.topic_id: set(t.partitions) for t in decoded.assignment.topic_partitions} == {T1.topic_id: set(range(4))}
        described = consumer_group_describe.describe(group, version)
        framed = encode_response(RequestHeader(ApiKey.ConsumerGroupDescribe, version, 1, None), {"groups": [described]})
        _, decoded = decode_response(ApiKey.ConsumerGroupDescribe, version, bytes(framed[4:]))
        [member] = decoded.groups[0].members
        assert (member.instance_id, member.member_epoch) == ("i", 1)
        assert [(t.topic_name, t.partitions) for t in member.target_assignment.topic_partitions] == [("t1", [0, 1, 2, 3])]
    body = {
        "group_id": "g",
        "member_id": "m",
        "member_epoch": 0,
        "rebalance_timeout_ms": 300_000,
        "subscribed_topic_regex": "^t.*",
        "topic_partitions": [],
    }
    decoded = decode_request(encode_request(ApiKey.ConsumerGroupHeartbeat, 1, body)[4:])
    assert decoded.body.subscribed_topic_regex == "^t.*" and decoded.body.rebalance_timeout_ms == 300_000


# -- the assignors ---------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, TopicMetadata], dict[str, Assignment]]:
    topics = {
        f"t{i}": TopicMetadata(f"t{i}", uuid.UUID(int=i + 1), draw(st.integers(1, 6))) for i in range(draw(st.integers(1, 3)))
    }
    members = [f"m{i}" for i in range(draw(st.integers(1, 6)))]
    subscriptions = {m: draw(st.lists(st.sampled_from(sorted(topics) + ["gone"]), min_size=1, unique=True)) for m in members}
    current: dict[str, Assignment] = {}
    for m in members:
        current[m] = {
            t.topic_id: frozenset(draw(st.lists(st.integers(0, 7), max_size=4))) for t in topics.values() if draw(st.booleans())
        }
    return subscriptions, topics, current


@settings(max_examples=300, deadline=None)
@given(cases(), st.sampled_from(assignors.ASSIGNORS))
def test_assignment_properties(case: Any, name: str) -> None:
    subscriptions, topics, current = case
    target = assignors.assign(name, subscriptions, topics, current)
    assert set(target) == set(subscriptions)
    owners: dict[tuple[uuid.UUID, int], str] = {}
    for member, assignment in target.items():
        names = {topics[n].topic_id for n in subscriptions[member] if n in topics}
        for t, ps in assignment.items():
            assert t in names
            for p in ps:
                assert (t, p) not in owners
                owners[(t, p)] = member
    every = {
        (t.topic_id, p) for n, t in topics.items() for p in range(t.partitions) if any(n in s for s in subscriptions.values())
    }
    assert set(owners) == every
    counts = [sum(len(ps) for ps in a.values()) for a in target.values()]
    if name == assignors.UNIFORM and all(set(s) == set(subscriptions["m0"]) for s in subscriptions.values()):
        assert max(counts) - min(counts) <= 1
    assert assignors.assign(name, subscriptions, topics, current) == target  # deterministic


def test_uniform_keeps_what_a_member_held_where_that_keeps_the_balance() -> None:
    subscriptions = {"a": ["t1"], "b": ["t1"]}
    first = assignors.assign_uniform(subscriptions, TOPICS, {})
    third = assignors.assign_uniform({**subscriptions, "c": ["t1"]}, TOPICS, first)
    for m in ("a", "b"):
        assert len(parts(first[m]) - parts(third[m])) <= 1


# -- the model -------------------------------------------------------------------------------------

MEMBERS = ["m1", "m2", "m3", "m4"]
SUBSCRIPTIONS = [["t1"], ["t2"], ["t1", "t2"]]


class ConsumerGroupModel(RuleBasedStateMachine):
    """Clients that do what librdkafka does with each answer: take the assignment given (revoking
    what it no longer lists), and send what they own at every heartbeat (or nothing, sometimes)."""

    def __init__(self) -> None:
        super().__init__()
        self.group: ConsumerGroup | None = None
        self.now = 0
        self.clients: dict[str, tuple[int, Assignment]] = {}  # member -> (epoch, owned) as the client sees them
        self.epochs_seen: dict[str, int] = {}

    def _apply(self, member: str, out: cg.HeartbeatOutcome) -> None:
        old = self.group
        self.group = out.group
        assert self.group.group_epoch >= (old.group_epoch if old else 0)
        assert self.group.assignment_epoch >= (old.assignment_epoch if old else 0)
        _, owned = self.clients.get(member, (0, {}))
        new_owned = out.answer.assignment if out.answer.assignment is not None else owned
        self.clients[member] = (out.answer.member_epoch, new_owned)

    @rule(member=st.sampled_from(MEMBERS), topics=st.sampled_from(SUBSCRIPTIONS), assignor=st.sampled_from(assignors.ASSIGNORS))
    def join(self, member: str, topics: list[str], assignor: str) -> None:
        if member in self.clients:
            return
        self._apply(member, beat(self.group, member, 0, topics, now=self.now, server_assignor=assignor))

    @precondition(lambda self: bool(self.clients))
    @rule(data=st.data(), says_owned=st.booleans())
    def heartbeat(self, data: st.DataObject, says_owned: bool) -> None:
        member = data.draw(st.sampled_from(sorted(self.clients)))
        epoch, owned = self.clients[member]
        try:
            out = beat(self.group, member, epoch, owned=owned if says_owned else None, now=self.now)
        except TxlogError as exc:
            # fenced or gone (session or rebalance timeout): the client starts over
            assert exc.code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH)
            assert self.group is None or member not in self.group.members or says_owned is False
            del self.clients[member]
            return
        self._apply(member, out)

    @precondition(lambda self: bool(self.clients))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(sorted(self.clients)))
        del self.clients[member]
        if self.group is not None and member in self.group.members:
            self.group = beat(self.group, member, -1).group

    @rule(ms=st.sampled_from([100, 2_000, 6_000, 11_000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        if self.group is not None:
            for member in cg.expired_members(self.group, self.now):
                self.group = cg.remove_member(self.group, member, TOPICS)

    @rule()
    def everyone_settles(self) -> None:
        """Every client heartbeats, saying what it owns, until nothing moves: the group is Stable,
        each member owning exactly its target."""
        for _ in range(4 * len(MEMBERS)):
            for member in sorted(self.clients):
                if self.group is None or member not in self.group.members:
                    del self.clients[member]
                    continue
                epoch, owned = self.clients[member]
                self._apply(member, beat(self.group, member, epoch, owned=owned, now=self.now))
        if self.group is not None and self.group.members:
            assert self.group.state == cg.STABLE
            for m in self.group.members.values():
                assert dict(m.assignment) == {t: ps for t, ps in self.group.target_assignment[m.member_id].items() if ps}

    @invariant()
    def nothing_is_owned_twice(self) -> None:
        if self.group is None:
            return
        seen: set[tuple[uuid.UUID, int]] = set()
        for m in self.group.members.values():
            holds = m.holds()
            assert not holds & seen
            seen |= holds
            assert m.member_epoch <= self.group.assignment_epoch <= self.group.group_epoch
            assert (m.state == cg.UNREVOKED) == bool(m.pending_revocation)

    @invariant()
    def the_clients_own_no_more_than_the_group_says(self) -> None:
        if self.group is None:
            return
        for member, (_, owned) in self.clients.items():
            m = self.group.members.get(member)
            if m is not None:
                assert parts(owned) <= parts(m.assignment) | parts(m.pending_revocation)


TestConsumerGroupModel = ConsumerGroupModel.TestCase
TestConsumerGroupModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
