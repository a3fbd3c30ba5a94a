"""The classic consumer-group coordinator: the pure state machine (app.domain.groups) transition by
transition and error by error, its asyncio driver (app.services.group_coordinator), and the wire
handlers (api.kafka.handlers.groups) for every version of their requests."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable

import pytest

from app.config import Settings
from app.domain.groups import coordinator, describe
from app.domain.groups.state import (
    VALID_PREVIOUS,
    AnswerJoin,
    AnswerSync,
    ArmTimer,
    CancelTimer,
    Group,
    GroupConfig,
    GroupState,
    JoinedMember,
    JoinRequest,
    JoinResult,
    LeaveAnswer,
    LeftMember,
    Outcome,
    Park,
    Protocols,
    SyncRequest,
    SyncResult,
    Timer,
    TimerKind,
    Waiting,
    check_transition,
    timers,
)
from app.errors import ErrorCode, TxlogError
from app.services.group_coordinator import GroupCoordinator

S = GroupState
E = ErrorCode
T0 = 1_700_000_000_000
DELAY = 100  # group.initial.rebalance.delay.ms in these tests
CONFIG = GroupConfig(min_session_timeout_ms=1_000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=DELAY)
NO_DELAY = GroupConfig(min_session_timeout_ms=1_000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=0)
RANGE = (("range", b"range-meta"),)
SESSION = 10_000
REBALANCE = 20_000
PARKED = "parked"


class Sim:
    """One group driven through the pure functions the way the driver drives them: a clock, the
    armed timers (fired in deadline order by ``advance``), the parked requests and their answers.
    After every outcome it checks that the armed timers are those the state wants and that exactly
    the members' waiting requests are parked (no client is ever left without an answer)."""

    def __init__(self, config: GroupConfig = CONFIG, group_id: str = "g") -> None:
        self.config = config
        self.group_id = group_id
        self.now = T0
        self.group: Group | None = None
        self.timers: dict[Timer, int] = {}
        self.parked: set[tuple[Waiting, str]] = set()
        self.answers: dict[tuple[Waiting, str], JoinResult | SyncResult] = {}
        self.outcomes: list[Outcome] = []
        self.last_parked: tuple[Waiting, str] | None = None  # the key the last parked caller waits under
        self._unique = itertools.count(1)

    def apply(self, outcome: Outcome) -> Any:
        self.outcomes.append(outcome)
        caller = None
        for e in outcome.effects:
            if isinstance(e, Park):
                assert (e.waiting, e.member_id) not in self.parked, "parked twice without an answer"
                self.parked.add((e.waiting, e.member_id))
                caller = (e.waiting, e.member_id)
            elif isinstance(e, AnswerJoin):
                self.parked.remove((Waiting.JOIN, e.member_id))
                self.answers[(Waiting.JOIN, e.member_id)] = e.result
            elif isinstance(e, AnswerSync):
                self.parked.remove((Waiting.SYNC, e.member_id))
                self.answers[(Waiting.SYNC, e.member_id)] = e.result
            elif isinstance(e, ArmTimer):
                self.timers[e.timer] = e.deadline_ms
            elif isinstance(e, CancelTimer):
                del self.timers[e.timer]
        self.group = outcome.group
        assert self.timers == timers(self.group)
        members = self.group.members.values() if self.group else ()
        assert self.parked == {(m.waiting, m.member_id) for m in members if m.waiting is not None}
        self.last_parked = caller
        if caller is None:
            return outcome.reply
        if caller in self.parked:
            return PARKED
        return self.answers.pop(caller)

    # --- requests ---

    def join(
        self,
        member_id: str = "",
        *,
        instance: str | None = None,
        protocols: Protocols = RANGE,
        session: int = SESSION,
        rebalance: int = REBALANCE,
        protocol_type: str = "consumer",
        v4: bool = True,
        skip: bool = False,
        client_id: str = "c",
        group_id: str | None = None,
    ) -> Any:
        r = JoinRequest(member_id, instance, session, rebalance, protocol_type, protocols, client_id, "10.0.0.1", v4, skip)
        gid = self.group_id if group_id is None else group_id
        return self.apply(coordinator.join(self.group, gid, r, str(next(self._unique)), self.now, self.config))

    def new_member(self, **kw: Any) -> tuple[str, Any]:
        """The v4 round trip: MEMBER_ID_REQUIRED, then the join with the given id."""
        first = self.join("", **kw)
        assert first.error is E.MEMBER_ID_REQUIRED and first.member_id
        return first.member_id, self.join(first.member_id, **kw)

    def sync(
        self,
        member_id: str,
        generation: int | None = None,
        assignments: tuple[tuple[str, bytes], ...] = (),
        *,
        instance: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> Any:
        gen = self.group.generation_id if generation is None and self.group else (generation or 0)
        r = SyncRequest(gen, member_id, instance, protocol_type, protocol_name, assignments)
        return self.apply(coordinator.sync(self.group, r, self.now, self.config))

    def heartbeat(self, member_id: str, generation: int | None = None, instance: str | None = None) -> Any:
        gen = self.group.generation_id if generation is None and self.group else (generation or 0)
        return self.apply(coordinator.heartbeat(self.group, gen, member_id, instance, self.now))

    def leave(self, *pairs: tuple[str, str | None]) -> Any:
        return self.apply(coordinator.leave(self.group, pairs, self.now, self.config))

    def commit(self, member_id: str, generation: int, instance: str | None = None, transactional: bool = False) -> Any:
        return self.apply(coordinator.offset_commit(self.group, generation, member_id, instance, transactional, self.now))

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while True:
            due = sorted((d, t.kind.value, t.member_id, t) for t, d in self.timers.items() if d <= target)
            if not due:
                break
            deadline, _, _, timer = due[0]
            self.now = max(self.now, deadline)
            del self.timers[timer]
            self.apply(coordinator.on_timer(self.group, timer, self.now, self.config))
        self.now = target

    def wait(self, ms: int, *alive: str, every: int = SESSION // 2) -> None:
        """Time passes while these members keep heartbeating, as live clients do during a long
        rebalance (a heartbeat answered REBALANCE_IN_PROGRESS still counts)."""
        end = self.now + ms
        while self.now < end:
            self.advance(min(every, end - self.now))
            for mid in alive:
                if self.group is not None and mid in self.group.members:
                    self.heartbeat(mid, instance=self.group.members[mid].group_instance_id)

    def take(self, member_id: str, waiting: Waiting = Waiting.JOIN) -> Any:
        return self.answers.pop((waiting, member_id))

    # --- shapes ---

    @property
    def g(self) -> Group:
        assert self.group is not None
        return self.group

    def joined(self, n: int, **kw: Any) -> list[str]:
        """n new members join within the initial delay; the join phase ends. Leader first."""
        ids = []
        for _ in range(n):
            mid, result = self.new_member(**kw)
            if result is not PARKED:  # no initial delay: answered at once
                self.answers[(Waiting.JOIN, mid)] = result
            ids.append(mid)
        self.advance(2 * max(self.config.initial_rebalance_delay_ms, 1))
        assert self.g.state is S.COMPLETING_REBALANCE
        leader = self.g.leader_id
        assert leader is not None
        return [leader] + [m for m in ids if m != leader]

    def stable(self, n: int, **kw: Any) -> list[str]:
        """A Stable group of n members; the leader assigns b"A:<member id>" to each."""
        ids = self.joined(n, **kw)
        for mid in ids:
            self.take(mid)
        for mid in ids[1:]:
            assert self.sync(mid) is PARKED
        result = self.sync(ids[0], assignments=tuple((m, b"A:" + m.encode()) for m in ids))
        assert result.error is None and result.assignment == b"A:" + ids[0].encode()
        for mid in ids[1:]:
            assert self.take(mid, Waiting.SYNC).assignment == b"A:" + mid.encode()
        assert self.g.state is S.STABLE
        return ids

    def static_stable(self, instances: list[str], **kw: Any) -> dict[str, str]:
        """A Stable group of static members: instance id → member id."""
        by_instance = {}
        for inst in instances:
            assert self.join("", instance=inst, **kw) is PARKED
            by_instance[inst] = next(m.member_id for m in self.g.members.values() if m.group_instance_id == inst)
        self.advance(2 * DELAY)
        ids = list(by_instance.values())
        for mid in ids:
            self.take(mid)
        leader = self.g.leader_id
        for mid in ids:
            if mid != leader:
                self.sync(mid, instance=self.g.members[mid].group_instance_id)
        self.sync(
            leader, assignments=tuple((m, b"A:" + m.encode()) for m in ids), instance=self.g.members[leader].group_instance_id
        )
        for mid in ids:
            if mid != leader:
                self.take(mid, Waiting.SYNC)
        assert self.g.state is S.STABLE
        return by_instance


# --- the state table ----------------------------------------------------------------------------------


def test_the_valid_previous_states_are_kafkas():
    assert {
        S.EMPTY: {None, S.PREPARING_REBALANCE},
        S.PREPARING_REBALANCE: {S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE},
        S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE},
        S.STABLE: {S.COMPLETING_REBALANCE},
        S.DEAD: {S.EMPTY, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE, S.DEAD},
    } == VALID_PREVIOUS
    assert [s.value for s in S] == ["Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"]


@pytest.mark.parametrize("to_state", list(S))
@pytest.mark.parametrize("from_state", [None, *S])
def test_check_transition_allows_exactly_the_table(from_state, to_state):
    if from_state in VALID_PREVIOUS[to_state]:
        check_transition(from_state, to_state)
    else:
        with pytest.raises(TxlogError) as info:
            check_transition(from_state, to_state)
        assert info.value.code is E.UNKNOWN_SERVER_ERROR


# --- JoinGroup ----------------------------------------------------------------------------------------


def _stable_two(sim: Sim) -> list[str]:
    return sim.stable(2)


def _static_pair(sim: Sim) -> list[str]:
    return list(sim.static_stable(["i-1", "i-2"]).values())


JOIN_REFUSALS: list[tuple[str, Callable[[Sim], Any], dict[str, Any], ErrorCode]] = [
    ("empty group id", lambda s: None, {"group_id": ""}, E.INVALID_GROUP_ID),
    ("session below the minimum", lambda s: None, {"session": 999}, E.INVALID_SESSION_TIMEOUT),
    ("session above the maximum", lambda s: None, {"session": 60_001}, E.INVALID_SESSION_TIMEOUT),
    ("a member id for an unknown group", lambda s: None, {"member_id": "c-9"}, E.UNKNOWN_MEMBER_ID),
    ("no protocol type", lambda s: None, {"protocol_type": ""}, E.INCONSISTENT_GROUP_PROTOCOL),
    ("no protocols", lambda s: None, {"protocols": ()}, E.INCONSISTENT_GROUP_PROTOCOL),
    ("another protocol type", _stable_two, {"protocol_type": "connect"}, E.INCONSISTENT_GROUP_PROTOCOL),
    ("no protocol in common", _stable_two, {"protocols": (("rr", b""),)}, E.INCONSISTENT_GROUP_PROTOCOL),
    ("an unknown member id", _stable_two, {"member_id": "c-99"}, E.UNKNOWN_MEMBER_ID),
    ("an unknown instance id with a member id", _static_pair, {"member_id": "i-1-1", "instance": "i-9"}, E.UNKNOWN_MEMBER_ID),
    (
        "a known instance id with another member id",
        _static_pair,
        {"member_id": "i-1-old", "instance": "i-1"},
        E.FENCED_INSTANCE_ID,
    ),
]


@pytest.mark.parametrize("name,setup,request_kw,expected", JOIN_REFUSALS, ids=[c[0] for c in JOIN_REFUSALS])
def test_join_refusals(name, setup, request_kw, expected):
    sim = Sim()
    setup(sim)
    before = sim.group
    result = sim.join(**request_kw)
    assert isinstance(result, JoinResult)
    assert result.error is expected
    assert result.member_id == request_kw.get("member_id", "")
    assert (result.generation_id, result.leader_id, result.members) == (-1, "", ())
    assert sim.group == before  # nothing changed, and a refused first join creates no group


def test_a_dynamic_member_first_gets_its_id_then_joins_with_it():
    sim = Sim()
    first = sim.join("", client_id="consumer-1")
    assert first.error is E.MEMBER_ID_REQUIRED
    assert first.member_id == "consumer-1-1"  # client id, a dash, the unique part
    assert sim.g.state is S.EMPTY and sim.g.pending_members == {"consumer-1-1": T0 + SESSION}
    assert sim.timers == {Timer(TimerKind.SESSION, "consumer-1-1"): T0 + SESSION}
    assert sim.join("consumer-1-1") is PARKED
    assert sim.g.state is S.PREPARING_REBALANCE and not sim.g.pending_members
    assert sim.g.members["consumer-1-1"].waiting is Waiting.JOIN


def test_join_v3_joins_at_once_without_the_round_trip():
    sim = Sim()
    assert sim.join("", v4=False) is PARKED
    assert list(sim.g.members) == ["c-1"]


def test_a_pending_member_id_not_used_within_the_session_timeout_expires():
    sim = Sim()
    mid = sim.join("").member_id
    sim.advance(SESSION)
    assert sim.group is not None and not sim.g.pending_members
    assert sim.join(mid).error is E.UNKNOWN_MEMBER_ID


def test_a_pending_member_holds_the_join_phase_until_it_joins_or_expires():
    sim = Sim(NO_DELAY)
    a = sim.stable(1)[0]
    pending = sim.join("").member_id  # got its id; not yet joined
    assert sim.join(a) is PARKED  # the leader rejoins: rebalance
    assert sim.g.state is S.PREPARING_REBALANCE
    sim.join(pending)
    result = sim.take(a)
    assert result.error is None and result.generation_id == 2
    assert {m.member_id for m in result.members} == {a, pending}


def test_the_initial_delay_waits_for_more_members_and_extends_once_per_new_member():
    sim = Sim()
    a, _ = sim.new_member()
    assert sim.timers[Timer(TimerKind.JOIN)] == T0 + DELAY
    sim.now += 40
    b, _ = sim.new_member()
    assert sim.g.new_member_added
    sim.advance(DELAY - 40)  # the first delay ends; a member arrived meanwhile: once more
    assert sim.g.state is S.PREPARING_REBALANCE and sim.timers[Timer(TimerKind.JOIN)] == T0 + 2 * DELAY
    sim.advance(DELAY)
    assert sim.g.state is S.COMPLETING_REBALANCE and sim.g.generation_id == 1
    assert {sim.take(a).generation_id, sim.take(b).generation_id} == {1}


def test_the_initial_delay_ends_without_new_members():
    sim = Sim()
    a, _ = sim.new_member()
    sim.advance(DELAY - 1)
    assert sim.g.state is S.PREPARING_REBALANCE
    sim.advance(1)
    assert sim.take(a).generation_id == 1


def test_the_initial_delay_never_exceeds_the_rebalance_timeout():
    sim = Sim()
    a, _ = sim.new_member(rebalance=150)
    for _ in range(3):  # members keep arriving
        sim.new_member(rebalance=150)
        sim.advance(50)
    assert sim.g.state is S.COMPLETING_REBALANCE
    assert sim.now - T0 == 150  # 100 + min(100, 150 - 100)
    assert sim.take(a).generation_id == 1


def test_without_an_initial_delay_a_lone_member_joins_at_once():
    sim = Sim(NO_DELAY)
    mid, result = sim.new_member()
    assert result.error is None and result.generation_id == 1 and result.leader_id == mid
    assert [m.member_id for m in result.members] == [mid]
    assert sim.g.state is S.COMPLETING_REBALANCE


def test_an_empty_group_at_a_later_generation_delays_once_without_extending():
    sim = Sim()
    ids = sim.stable(1)
    sim.leave((ids[0], None))
    assert sim.g.state is S.EMPTY and sim.g.generation_id == 2
    a, _ = sim.new_member()
    sim.advance(50)
    sim.new_member()
    sim.advance(50)
    assert sim.g.state is S.COMPLETING_REBALANCE and sim.g.generation_id == 3
    assert sim.take(a).generation_id == 3


def test_one_generation_per_join_phase_not_per_join():
    sim = Sim()
    ids = sim.joined(3)
    assert sim.g.generation_id == 1
    results = [sim.take(m) for m in ids]
    assert {r.generation_id for r in results} == {1}
    assert {r.leader_id for r in results} == {ids[0]}
    leader, *followers = results
    assert [m.member_id for m in leader.members] == list(sim.g.members)
    assert all(m.metadata == b"range-meta" for m in leader.members)
    assert all(r.members == () for r in followers)
    assert {r.protocol_type for r in results} == {"consumer"} and {r.protocol_name for r in results} == {"range"}


def test_a_rebalance_waits_for_every_member_then_bumps_the_generation_once():
    sim = Sim()
    a, b = sim.stable(2)
    c, _ = sim.new_member()
    assert sim.g.state is S.PREPARING_REBALANCE and sim.g.generation_id == 1
    assert sim.heartbeat(a) is E.REBALANCE_IN_PROGRESS
    assert sim.join(a) is PARKED
    assert sim.g.state is S.PREPARING_REBALANCE
    assert sim.heartbeat(b) is E.REBALANCE_IN_PROGRESS
    last = sim.join(b)  # the last to rejoin is answered at once
    assert sim.g.state is S.COMPLETING_REBALANCE and sim.g.generation_id == 2
    assert {sim.take(a).generation_id, last.generation_id, sim.take(c).generation_id} == {2}


def test_members_that_do_not_rejoin_by_the_rebalance_timeout_are_removed():
    sim = Sim()
    a, b = sim.stable(2)
    assert sim.join(a) is PARKED  # the leader rejoins: rebalance; b heartbeats but never rejoins
    sim.wait(REBALANCE - 1, b)
    assert sim.g.state is S.PREPARING_REBALANCE
    sim.advance(1)
    assert list(sim.g.members) == [a] and sim.g.generation_id == 2
    assert sim.take(a).members == (JoinedMember(a, None, b"range-meta"),)


def test_a_static_member_that_does_not_rejoin_stays_in_the_group():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2"])
    m1, m2 = by_instance["i-1"], by_instance["i-2"]
    leader = sim.g.leader_id
    sim.join(leader, instance=sim.g.members[leader].group_instance_id)
    other = m2 if leader == m1 else m1
    sim.wait(REBALANCE, other)
    assert set(sim.g.members) == {m1, m2} and sim.g.generation_id == 2
    assert {m.member_id for m in sim.take(leader).members} == {m1, m2}


def test_when_no_member_rejoined_the_join_phase_waits_again():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2"])
    leader = sim.g.leader_id
    other = next(m for m in by_instance.values() if m != leader)
    # The leader's new metadata starts a rebalance, then it leaves; the other (static, alive) never rejoins.
    sim.join(leader, instance=sim.g.members[leader].group_instance_id, protocols=(("range", b"changed"),))
    deadline = sim.g.join_deadline_ms
    assert deadline is not None
    sim.leave((leader, None))
    assert sim.g.state is S.PREPARING_REBALANCE and list(sim.g.members) == [other]
    sim.wait(deadline - sim.now, other)
    assert sim.g.state is S.PREPARING_REBALANCE and sim.g.generation_id == 1  # wait again
    assert sim.g.join_deadline_ms == deadline + REBALANCE
    sim.join(other, instance=sim.g.members[other].group_instance_id)
    assert sim.g.state is S.COMPLETING_REBALANCE and sim.g.generation_id == 2


def test_a_leader_that_does_not_rejoin_is_replaced_by_a_member_that_did():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2"])
    leader = sim.g.leader_id
    other = next(m for m in by_instance.values() if m != leader)
    sim.join(other, instance=sim.g.members[other].group_instance_id, protocols=(("range", b"new"),))
    sim.wait(REBALANCE, leader)
    assert sim.g.leader_id == other and leader in sim.g.members
    assert sim.take(other).leader_id == other


VOTES = [
    ("one member, its first protocol", [["range", "rr"]], "range"),
    ("the most votes", [["a", "b"], ["b", "a"], ["b", "a"]], "b"),
    ("only protocols all support are candidates", [["range", "rr"], ["range", "rr"], ["rr"]], "rr"),
    ("a tie goes to the first vote", [["a", "b"], ["b", "a"]], "a"),
    ("a member's later choice counts when its first is not common", [["x", "b", "a"], ["a", "b"], ["b", "a"]], "b"),
]


@pytest.mark.parametrize("name,preferences,chosen", VOTES, ids=[v[0] for v in VOTES])
def test_the_protocol_is_chosen_by_vote_among_the_common_ones(name, preferences, chosen):
    sim = Sim()
    for prefs in preferences:
        protocols = tuple((p, p.encode()) for p in prefs)
        mid = sim.join("", protocols=protocols).member_id
        sim.join(mid, protocols=protocols)
    sim.advance(2 * DELAY)
    assert sim.g.protocol_name == chosen
    leader = sim.take(sim.g.leader_id)
    assert all(m.metadata == chosen.encode() for m in leader.members)


def test_a_lone_member_may_change_its_protocols():
    sim = Sim()
    (a,) = sim.stable(1)
    result = sim.join(a, protocols=(("rr", b"x"),))
    assert (result.error, result.generation_id, result.protocol_name) == (None, 2, "rr")
    assert sim.g.generation_id == 2 and sim.g.protocol_name == "rr"


def test_a_follower_rejoining_a_stable_group_unchanged_gets_the_current_generation():
    sim = Sim()
    a, b = sim.stable(2)
    result = sim.join(b)
    assert result.error is None and result.generation_id == 1 and result.leader_id == a and result.members == ()
    assert sim.g.state is S.STABLE


def test_the_leader_rejoining_a_stable_group_starts_a_rebalance():
    sim = Sim()
    a, _ = sim.stable(2)
    assert sim.join(a) is PARKED
    assert sim.g.state is S.PREPARING_REBALANCE


def test_a_member_rejoining_with_changed_metadata_starts_a_rebalance():
    sim = Sim()
    _, b = sim.stable(2)
    assert sim.join(b, protocols=(("range", b"new-topics"),)) is PARKED
    assert sim.g.state is S.PREPARING_REBALANCE


def test_a_member_that_missed_its_join_answer_gets_it_again():
    sim = Sim()
    a, b = sim.joined(2)
    first_a, first_b = sim.take(a), sim.take(b)
    assert sim.join(b) == first_b and sim.join(a) == first_a
    assert sim.g.state is S.COMPLETING_REBALANCE


def test_a_join_while_parked_answers_the_earlier_request():
    sim = Sim()
    a, _ = sim.new_member()
    assert sim.join(a) is PARKED
    assert sim.take(a).error is E.REBALANCE_IN_PROGRESS


@pytest.mark.parametrize("given", [0, -1])
def test_without_a_rebalance_timeout_the_session_timeout_stands_in(given):
    sim = Sim()
    sim.join("", v4=False, rebalance=given, session=7_000)
    assert sim.g.members["c-1"].rebalance_timeout_ms == 7_000


def test_group_max_size():
    sim = Sim(GroupConfig(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=DELAY, max_size=2))
    sim.stable(2)
    result = sim.join("")
    assert result.error is E.GROUP_MAX_SIZE_REACHED and result.member_id == ""
    assert len(sim.g.members) == 2


def test_group_max_size_while_rebalancing_counts_the_rejoined():
    sim = Sim(GroupConfig(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=DELAY, max_size=3))
    a, b, c = sim.stable(3)
    sim.join(a)
    sim.join(b)
    newcomer = sim.join("", v4=False)  # two have rejoined: a third may come in
    assert newcomer is PARKED
    late = sim.join(c)  # three are waiting: the last to rejoin is left out
    assert late.error is E.GROUP_MAX_SIZE_REACHED and c not in sim.g.members
    assert sim.g.state is S.COMPLETING_REBALANCE and sim.g.generation_id == 2 and len(sim.g.members) == 3


# --- SyncGroup ----------------------------------------------------------------------------------------


def test_followers_wait_for_the_leader_and_each_gets_its_own_bytes():
    sim = Sim()
    a, b, c = sim.joined(3)
    for m in (a, b, c):
        sim.take(m)
    assert sim.sync(b) is PARKED and sim.sync(c) is PARKED
    assert sim.g.state is S.COMPLETING_REBALANCE
    given = ((c, b"\x00\x01for-c"), (b, b"for-b"), ("ghost", b"ignored"), (a, b"for-a"))
    mine = sim.sync(a, assignments=given)
    assert mine == SyncResult(None, "consumer", "range", b"for-a")
    assert sim.take(b, Waiting.SYNC).assignment == b"for-b"
    assert sim.take(c, Waiting.SYNC).assignment == b"\x00\x01for-c"
    assert sim.g.state is S.STABLE and "ghost" not in sim.g.members


def test_a_member_the_leader_left_out_gets_an_empty_assignment_as_in_kafka():
    sim = Sim()
    a, b = sim.joined(2)
    sim.take(a), sim.take(b)
    sim.sync(b)
    sim.sync(a, assignments=((a, b"all"),))
    assert sim.take(b, Waiting.SYNC) == SyncResult(None, "consumer", "range", b"")


def test_a_member_named_twice_keeps_its_last_assignment():
    sim = Sim()
    (a,) = sim.joined(1)
    sim.take(a)
    assert sim.sync(a, assignments=((a, b"first"), (a, b"last"))).assignment == b"last"


def test_a_follower_syncing_after_the_leader_gets_its_assignment_at_once():
    sim = Sim()
    a, b = sim.joined(2)
    sim.take(a), sim.take(b)
    sim.sync(a, assignments=((a, b"x"), (b, b"y")))
    assert sim.g.pending_sync == {b}
    assert sim.sync(b) == SyncResult(None, "consumer", "range", b"y")
    assert sim.g.pending_sync == frozenset() and Timer(TimerKind.SYNC) not in sim.timers


def _preparing(sim: Sim) -> list[str]:
    ids = sim.stable(2)
    sim.join(ids[0])
    return ids


SYNC_REFUSALS: list[tuple[str, Callable[[Sim], Any], Callable[[list[str]], dict[str, Any]], ErrorCode]] = [
    ("unknown member", _stable_two, lambda ids: {"member_id": "nobody"}, E.UNKNOWN_MEMBER_ID),
    ("wrong generation", _stable_two, lambda ids: {"member_id": ids[1], "generation": 0}, E.ILLEGAL_GENERATION),
    (
        "another protocol type",
        _stable_two,
        lambda ids: {"member_id": ids[1], "protocol_type": "connect"},
        E.INCONSISTENT_GROUP_PROTOCOL,
    ),
    (
        "another protocol name",
        _stable_two,
        lambda ids: {"member_id": ids[1], "protocol_name": "rr"},
        E.INCONSISTENT_GROUP_PROTOCOL,
    ),
    ("during a join phase", _preparing, lambda ids: {"member_id": ids[1]}, E.REBALANCE_IN_PROGRESS),
    ("fenced instance", _static_pair, lambda ids: {"member_id": ids[0], "instance": "i-2"}, E.FENCED_INSTANCE_ID),
    ("unknown instance", _static_pair, lambda ids: {"member_id": ids[0], "instance": "i-9"}, E.UNKNOWN_MEMBER_ID),
]


@pytest.mark.parametrize("name,setup,request_kw,expected", SYNC_REFUSALS, ids=[c[0] for c in SYNC_REFUSALS])
def test_sync_refusals(name, setup, request_kw, expected):
    sim = Sim()
    ids = setup(sim)
    before = sim.group
    assert sim.sync(**request_kw(ids)) == SyncResult(expected)
    assert sim.group == before


def test_sync_for_an_unknown_group():
    assert Sim().sync("m", 1) == SyncResult(E.UNKNOWN_MEMBER_ID)


def test_sync_right_protocol_type_and_name_accepted():
    sim = Sim()
    a, b = sim.joined(2)
    sim.take(a), sim.take(b)
    assert sim.sync(b, protocol_type="consumer", protocol_name="range") is PARKED


def test_a_rebalance_while_completing_answers_waiting_followers_and_clears_assignments():
    sim = Sim()
    a, b = sim.stable(2)
    sim.join(a)
    sim.join(b)  # answered at once: the last to rejoin
    sim.take(a)
    assert sim.sync(b) is PARKED
    _c, _ = sim.new_member()  # joins while the leader is assigning
    assert sim.take(b, Waiting.SYNC) == SyncResult(E.REBALANCE_IN_PROGRESS)
    assert sim.g.state is S.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in sim.g.members.values())
    assert not sim.g.pending_sync and Timer(TimerKind.SYNC) not in sim.timers


def test_members_that_do_not_sync_by_the_rebalance_timeout_are_removed():
    sim = Sim()
    a, b, c = sim.joined(3)
    for m in (a, b, c):
        sim.take(m)
    sim.sync(a, assignments=((a, b"1"), (b, b"2"), (c, b"3")))
    sim.sync(b)
    sim.wait(REBALANCE - 1, a, b, c)  # c heartbeats but never sends SyncGroup
    assert c in sim.g.members and sim.g.state is S.STABLE
    sim.advance(1)
    assert c not in sim.g.members
    assert sim.g.state is S.PREPARING_REBALANCE  # then a rebalance without it
    assert sim.heartbeat(a) is E.REBALANCE_IN_PROGRESS


# --- Heartbeat ----------------------------------------------------------------------------------------


def _completing(sim: Sim) -> list[str]:
    ids = sim.joined(2)
    for m in ids:
        sim.take(m)
    return ids


def _emptied(sim: Sim) -> list[str]:
    ids = sim.stable(1)
    sim.leave((ids[0], None))
    return ids


HEARTBEATS: list[tuple[str, Callable[[Sim], Any], Callable[[list[str], Sim], dict[str, Any]], ErrorCode | None]] = [
    ("stable", _stable_two, lambda ids, s: {"member_id": ids[1]}, None),
    ("completing: after the join answer", _completing, lambda ids, s: {"member_id": ids[1]}, None),
    ("preparing: rejoin", _preparing, lambda ids, s: {"member_id": ids[1]}, E.REBALANCE_IN_PROGRESS),
    ("an older generation", _stable_two, lambda ids, s: {"member_id": ids[1], "generation": 0}, E.ILLEGAL_GENERATION),
    ("a newer generation", _stable_two, lambda ids, s: {"member_id": ids[1], "generation": 7}, E.ILLEGAL_GENERATION),
    ("unknown member", _stable_two, lambda ids, s: {"member_id": "nobody"}, E.UNKNOWN_MEMBER_ID),
    ("unknown group", lambda s: [], lambda ids, s: {"member_id": "m", "generation": 1}, E.UNKNOWN_MEMBER_ID),
    ("fenced instance", _static_pair, lambda ids, s: {"member_id": ids[1], "instance": "i-1"}, E.FENCED_INSTANCE_ID),
    ("unknown instance", _static_pair, lambda ids, s: {"member_id": ids[1], "instance": "i-3"}, E.UNKNOWN_MEMBER_ID),
    ("an emptied group", _emptied, lambda ids, s: {"member_id": ids[0], "generation": 1}, E.UNKNOWN_MEMBER_ID),
]


@pytest.mark.parametrize("name,setup,request_kw,expected", HEARTBEATS, ids=[c[0] for c in HEARTBEATS])
def test_heartbeat(name, setup, request_kw, expected):
    sim = Sim()
    ids = setup(sim)
    assert sim.heartbeat(**request_kw(ids, sim)) is expected


def test_heartbeats_keep_a_member_past_its_session_timeout():
    sim = Sim()
    a, b = sim.stable(2)
    for _ in range(5):
        sim.advance(SESSION - 1)
        assert sim.heartbeat(a) is None and sim.heartbeat(b) is None
    assert sim.g.state is S.STABLE and sim.g.generation_id == 1


# --- sessions -----------------------------------------------------------------------------------------


def test_a_member_without_heartbeats_is_removed_at_its_session_timeout_and_the_group_rebalances():
    sim = Sim()
    a, _b = sim.stable(2)
    sim.advance(SESSION - 1)
    sim.heartbeat(a)
    sim.advance(1)
    assert list(sim.g.members) == [a] and sim.g.state is S.PREPARING_REBALANCE
    assert sim.heartbeat(a) is E.REBALANCE_IN_PROGRESS
    assert sim.join(a).generation_id == 2  # the only member: answered at once


def test_the_last_member_expiring_empties_the_group_with_a_new_generation():
    sim = Sim()
    sim.stable(1)
    sim.advance(SESSION)
    assert sim.g.state is S.EMPTY and sim.g.generation_id == 2 and sim.g.protocol_name is None
    assert sim.g.leader_id is None and sim.timers == {}


def test_a_member_waiting_in_a_join_phase_is_not_expired_by_its_session():
    sim = Sim()
    a, b = sim.stable(2)
    sim.join(a)  # rebalance; a waits for b
    sim.advance(SESSION - 1)
    sim.heartbeat(b)
    sim.advance(SESSION - 2)
    assert a in sim.g.members and sim.g.members[a].waiting is Waiting.JOIN
    assert sim.join(b).generation_id == 2
    assert sim.take(a).generation_id == 2


def test_a_new_members_join_expires_after_the_new_member_join_timeout():
    config = GroupConfig(min_session_timeout_ms=1_000, initial_rebalance_delay_ms=DELAY, new_member_join_timeout_ms=30_000)
    sim = Sim(config)
    a, b = sim.stable(2, rebalance=60_000)
    sim.join(a, rebalance=60_000)  # a long rebalance, waiting for b
    c, _ = sim.new_member(rebalance=60_000)
    for _ in range(4):
        sim.advance(SESSION - 1)
        sim.heartbeat(b)
    assert c not in sim.g.members
    assert sim.take(c) == JoinResult(E.UNKNOWN_MEMBER_ID, "")


def test_a_stale_timer_does_nothing():
    sim = Sim()
    a, _b = sim.stable(2)
    before = sim.group
    for timer in (Timer(TimerKind.SESSION, a), Timer(TimerKind.SESSION, "gone"), Timer(TimerKind.JOIN), Timer(TimerKind.SYNC)):
        outcome = coordinator.on_timer(before, timer, sim.now, sim.config)
        assert outcome.group == before
        assert [e for e in outcome.effects if not isinstance(e, ArmTimer)] == []
    assert coordinator.on_timer(None, Timer(TimerKind.JOIN), sim.now, sim.config).group is None


def test_a_fired_timer_still_wanted_is_armed_again():
    sim = Sim()
    a, _ = sim.stable(2)
    deadline = sim.timers[Timer(TimerKind.SESSION, a)]
    outcome = coordinator.on_timer(sim.g, Timer(TimerKind.SESSION, a), deadline - 1, sim.config)
    assert ArmTimer(Timer(TimerKind.SESSION, a), deadline) in outcome.effects


# --- LeaveGroup ---------------------------------------------------------------------------------------


def test_a_member_leaving_starts_a_rebalance_and_the_next_member_leads():
    sim = Sim()
    a, b, c = sim.stable(3)
    answer = sim.leave((a, None))
    assert answer == LeaveAnswer(None, (LeftMember(a, None, None),))
    assert sim.g.leader_id == b and sim.g.state is S.PREPARING_REBALANCE
    sim.join(b)
    assert sim.join(c).leader_id == b


def test_everyone_leaving_empties_the_group_with_one_new_generation():
    sim = Sim()
    a, b = sim.stable(2)
    sim.leave((a, None), (b, None))
    assert sim.g.state is S.EMPTY and sim.g.generation_id == 2 and not sim.g.members


def test_leave_batch_with_instance_ids_and_pending_members():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2", "i-3"])
    pending = sim.join("").member_id
    answer = sim.leave(
        ("", "i-1"),  # an administrator removes a static member by its instance id
        (pending, None),
        ("nobody", None),
        ("", "i-9"),
        (by_instance["i-2"], "i-3"),  # another instance's member id
        (by_instance["i-3"], "i-3"),
    )
    assert answer.error is None
    assert [m.error for m in answer.members] == [None, None, E.UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, None]
    assert list(sim.g.members) == [by_instance["i-2"]] and not sim.g.pending_members


def test_a_member_leaving_while_parked_is_answered():
    sim = Sim()
    _a, b = sim.stable(2)
    sim.join(b, protocols=(("range", b"other"),))
    sim.leave((b, None))
    assert sim.take(b) == JoinResult(E.UNKNOWN_MEMBER_ID, "")


def test_leave_an_unknown_group():
    answer = Sim().leave(("a", None), ("", "i-1"))
    assert answer == LeaveAnswer(None, (LeftMember("a", None, E.UNKNOWN_MEMBER_ID), LeftMember("", "i-1", E.UNKNOWN_MEMBER_ID)))


# --- static membership (KIP-345) ----------------------------------------------------------------------


def test_a_restarted_static_member_takes_over_without_a_rebalance_and_fences_its_old_id():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2"])
    old = by_instance["i-2"]
    assert sim.g.leader_id != old
    result = sim.join("", instance="i-2")
    new = result.member_id
    assert new != old and new.startswith("i-2-")
    assert result.error is None and result.generation_id == 1 and result.members == ()
    assert result.leader_id == sim.g.leader_id
    assert sim.g.state is S.STABLE and sim.g.generation_id == 1
    assert sim.sync(new, instance="i-2").assignment == b"A:" + old.encode()  # its assignment stays
    assert sim.heartbeat(old, instance="i-2") is E.FENCED_INSTANCE_ID
    assert sim.heartbeat(old) is E.UNKNOWN_MEMBER_ID
    assert sim.sync(old, instance="i-2").error is E.FENCED_INSTANCE_ID
    assert sim.commit(old, 1, instance="i-2") is E.FENCED_INSTANCE_ID
    assert sim.join(old, instance="i-2").error is E.FENCED_INSTANCE_ID
    assert sim.heartbeat(new, instance="i-2") is None


def test_a_restarted_static_leader_is_not_told_it_leads_before_join_v9():
    sim = Sim()
    sim.static_stable(["i-1", "i-2"])
    old_leader = sim.g.leader_id
    inst = sim.g.members[old_leader].group_instance_id
    result = sim.join("", instance=inst)
    assert result.leader_id == old_leader != result.member_id and result.members == ()
    assert sim.g.leader_id == result.member_id


def test_a_restarted_static_leader_skips_the_assignment_with_join_v9():
    sim = Sim()
    sim.static_stable(["i-1", "i-2"])
    inst = sim.g.members[sim.g.leader_id].group_instance_id
    result = sim.join("", instance=inst, skip=True)
    assert result.skip_assignment and result.leader_id == result.member_id
    assert {m.group_instance_id for m in result.members} == {"i-1", "i-2"}
    assert sim.g.state is S.STABLE


def test_a_restarted_static_member_whose_protocol_choice_changes_starts_a_rebalance():
    sim = Sim()
    sim.static_stable(["i-1", "i-2"], protocols=(("range", b""), ("rr", b"")))
    assert sim.g.protocol_name == "range"
    assert sim.join("", instance="i-2", protocols=(("rr", b""),)) is PARKED
    assert sim.g.state is S.PREPARING_REBALANCE


def test_a_restarted_static_member_while_completing_fences_the_old_sync_and_rebalances():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2"])
    leader = sim.g.leader_id
    follower = next(m for m in by_instance.values() if m != leader)
    finst = sim.g.members[follower].group_instance_id
    sim.join(leader, instance=sim.g.members[leader].group_instance_id)  # the leader rejoins
    sim.join(follower, instance=finst)  # answered at once: the last to rejoin
    sim.take(leader)
    assert sim.sync(follower, instance=finst) is PARKED
    assert sim.join("", instance=finst) is PARKED
    assert sim.take(follower, Waiting.SYNC) == SyncResult(E.FENCED_INSTANCE_ID)
    assert sim.g.state is S.PREPARING_REBALANCE


def test_a_restarted_static_member_during_a_join_phase_replaces_the_waiting_one():
    sim = Sim()
    by_instance = sim.static_stable(["i-1", "i-2"])
    old = by_instance["i-2"]
    sim.join(old, instance="i-2", protocols=(("range", b"v2"),))  # parks: rebalance
    assert sim.join("", instance="i-2") is PARKED
    assert sim.take(old) == JoinResult(E.FENCED_INSTANCE_ID, old)
    new = sim.g.static_member_id("i-2")
    other = by_instance["i-1"]
    sim.join(other, instance="i-1")
    assert sim.take(new).generation_id == 2


def test_a_new_static_member_joins_without_the_member_id_round_trip():
    sim = Sim()
    assert sim.join("", instance="i-1") is PARKED
    assert sim.g.static_member_id("i-1") == "i-1-1"


# --- offset commits -----------------------------------------------------------------------------------


def _unknown(sim: Sim) -> list[str]:
    return []


COMMITS: list[
    tuple[str, Callable[[Sim], list[str]], Callable[[list[str]], tuple[str, int, str | None]], bool, ErrorCode | None]
] = [
    ("unknown group, simple consumer", _unknown, lambda ids: ("", -1, None), False, None),
    ("unknown group, a generation", _unknown, lambda ids: ("m", 3, None), False, E.ILLEGAL_GENERATION),
    ("empty group, simple consumer", _emptied, lambda ids: ("", -1, None), False, None),
    ("empty group, generation -1 with a member id", _emptied, lambda ids: ("m", -1, None), False, None),
    ("empty group, an old member's generation", _emptied, lambda ids: (ids[0], 1, None), False, E.UNKNOWN_MEMBER_ID),
    ("stable, current member", _stable_two, lambda ids: (ids[1], 1, None), False, None),
    ("stable, transactional current member", _stable_two, lambda ids: (ids[1], 1, None), True, None),
    ("stable, older generation", _stable_two, lambda ids: (ids[1], 0, None), False, E.ILLEGAL_GENERATION),
    ("stable, transactional older generation", _stable_two, lambda ids: (ids[1], 0, None), True, E.ILLEGAL_GENERATION),
    ("stable, unknown member", _stable_two, lambda ids: ("nobody", 1, None), False, E.UNKNOWN_MEMBER_ID),
    ("stable, transactional unknown member", _stable_two, lambda ids: ("nobody", 1, None), True, E.UNKNOWN_MEMBER_ID),
    ("stable, simple consumer", _stable_two, lambda ids: ("", -1, None), False, E.UNKNOWN_MEMBER_ID),
    ("stable, TxnOffsetCommit before v3 (no generation)", _stable_two, lambda ids: ("", -1, None), True, None),
    ("stable, fenced instance", _static_pair, lambda ids: (ids[0], 1, "i-2"), False, E.FENCED_INSTANCE_ID),
    ("stable, transactional fenced instance", _static_pair, lambda ids: (ids[0], 1, "i-2"), True, E.FENCED_INSTANCE_ID),
    ("completing, current member", _completing, lambda ids: (ids[1], 1, None), False, E.REBALANCE_IN_PROGRESS),
    ("completing, transactional current member", _completing, lambda ids: (ids[1], 1, None), True, None),
    ("preparing, the generation before", _preparing, lambda ids: (ids[1], 1, None), False, None),
]


@pytest.mark.parametrize("name,setup,request_args,transactional,expected", COMMITS, ids=[c[0] for c in COMMITS])
def test_offset_commit_checks(name, setup, request_args, transactional, expected):
    sim = Sim()
    ids = setup(sim)
    member_id, generation, instance = request_args(ids)
    assert sim.commit(member_id, generation, instance, transactional) is expected


def test_an_offset_commit_counts_as_a_heartbeat():
    sim = Sim()
    a, b = sim.stable(2)
    sim.advance(SESSION - 1)
    sim.heartbeat(a)
    assert sim.commit(b, 1) is None
    sim.advance(SESSION - 1)
    assert b in sim.g.members
    assert sim.commit(a, 1, transactional=True) is None  # not a transactional one
    sim.advance(1)
    assert a not in sim.g.members


# --- unload, delete, describe, list -------------------------------------------------------------------


def test_unloading_answers_every_parked_request_not_coordinator():
    sim = Sim()
    a, b, c = sim.stable(3)
    sim.join(a)
    sim.join(b)
    outcome = coordinator.unload(sim.g, sim.now)
    sim.apply(outcome)
    assert sim.take(a) == JoinResult(E.NOT_COORDINATOR, a) and sim.take(b) == JoinResult(E.NOT_COORDINATOR, b)
    assert sim.g.state is S.DEAD and sim.timers == {}
    assert sim.heartbeat(c) is E.COORDINATOR_NOT_AVAILABLE
    assert sim.join("").error is E.COORDINATOR_NOT_AVAILABLE
    assert sim.sync(c) == SyncResult(E.COORDINATOR_NOT_AVAILABLE)
    assert sim.leave((c, None)) == LeaveAnswer(E.COORDINATOR_NOT_AVAILABLE, ())
    assert sim.commit(c, 1) is E.COORDINATOR_NOT_AVAILABLE


def test_unloading_answers_waiting_syncs():
    sim = Sim()
    a, b = sim.joined(2)
    sim.take(a), sim.take(b)
    sim.sync(b)
    sim.apply(coordinator.unload(sim.g, sim.now))
    assert sim.take(b, Waiting.SYNC) == SyncResult(E.NOT_COORDINATOR)


def test_delete_only_an_empty_group():
    sim = Sim()
    assert coordinator.delete(None, T0).reply is E.GROUP_ID_NOT_FOUND
    ids = sim.stable(1)
    assert coordinator.delete(sim.g, T0).reply is E.NON_EMPTY_GROUP
    sim.leave((ids[0], None))
    outcome = coordinator.delete(sim.g, T0)
    assert outcome.reply is None and outcome.group is not None and outcome.group.state is S.DEAD
    assert coordinator.delete(outcome.group, T0).reply is E.GROUP_ID_NOT_FOUND


def test_describe_shows_metadata_and_assignments_only_when_stable():
    sim = Sim()
    a, b = sim.stable(2)
    d = describe.describe("g", sim.g)
    assert (d.error, d.state, d.protocol_type, d.protocol_data) == (None, "Stable", "consumer", "range")
    assert [(m.member_id, m.client_id, m.client_host, m.metadata, m.assignment) for m in d.members] == [
        (a, "c", "10.0.0.1", b"range-meta", b"A:" + a.encode()),
        (b, "c", "10.0.0.1", b"range-meta", b"A:" + b.encode()),
    ]
    sim.join(a)
    d = describe.describe("g", sim.g)
    assert (d.state, d.protocol_data) == ("PreparingRebalance", "")
    assert {(m.metadata, m.assignment) for m in d.members} == {(b"", b"")}


def test_describe_an_unknown_group():
    assert describe.describe("x", None) == describe.GroupDescription("x", E.GROUP_ID_NOT_FOUND, "Dead", "", "", ())


def test_listing_filters_by_state_and_type_case_insensitively():
    stable, empty, preparing = Sim(group_id="s"), Sim(group_id="e"), Sim(group_id="p")
    stable.stable(1)
    _emptied(empty)
    preparing.new_member()
    all_groups = [stable.g, empty.g, preparing.g]
    assert [(g.group_id, g.state, g.protocol_type) for g in describe.listing(all_groups)] == [
        ("s", "Stable", "consumer"),
        ("e", "Empty", "consumer"),
        ("p", "PreparingRebalance", "consumer"),
    ]
    assert [g.group_id for g in describe.listing(all_groups, ["stable", "EMPTY"])] == ["s", "e"]
    assert [g.group_id for g in describe.listing(all_groups, types_filter=["Classic"])] == ["s", "e", "p"]
    assert describe.listing(all_groups, types_filter=["consumer"]) == []


def test_snapshot_is_plain_data():
    sim = Sim()
    a, b = sim.stable(2)
    snap = describe.snapshot(sim.g)
    assert snap["state"] == "Stable" and snap["generation_id"] == 1 and snap["leader_id"] == a
    assert [m["member_id"] for m in snap["members"]] == [a, b]  # type: ignore[index]
    assert snap["members"][1]["assignment"] == b"A:" + b.encode()  # type: ignore[index]


def test_new_member_ids_are_kafkas():
    assert coordinator.new_member_id("rdkafka", None, "u1") == "rdkafka-u1"
    assert coordinator.new_member_id("rdkafka", "host-7", "u1") == "host-7-u1"


# --- the asyncio driver -------------------------------------------------------------------------------


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


FAST = GroupConfig(min_session_timeout_ms=10, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=30)


async def _join(
    coord: GroupCoordinator, member_id: str = "", instance: str | None = None, session: int = 5_000, group: str = "g", **kw: Any
) -> JoinResult:
    result = await coord.join_group(
        group, member_id, instance, session, 5_000, "consumer", [("range", b"m")], client_id="c", client_host="h", **kw
    )
    if result.error is E.MEMBER_ID_REQUIRED:
        return await _join(coord, result.member_id, instance, session, group, **kw)
    return result


def test_driver_three_consumers_join_and_sync_concurrently():
    async def scenario() -> None:
        coord = GroupCoordinator(FAST)
        joined = await asyncio.gather(*(_join(coord) for _ in range(3)))
        assert {r.generation_id for r in joined} == {1} and {r.error for r in joined} == {None}
        (leader,) = [r for r in joined if r.members]
        assert leader.leader_id == leader.member_id and len(leader.members) == 3
        followers = [r for r in joined if r is not leader]
        assignments = [(r.member_id, r.member_id.encode()) for r in joined]
        synced = await asyncio.gather(
            *(coord.sync_group("g", 1, r.member_id, None, None, None, []) for r in followers),
            coord.sync_group("g", 1, leader.member_id, None, "consumer", "range", assignments),
        )
        assert [s.assignment for s in synced] == [r.member_id.encode() for r in followers] + [leader.member_id.encode()]
        assert coord.heartbeat("g", 1, followers[0].member_id, None) is None
        assert [g.state for g in coord.list_groups()] == ["Stable"]
        (d,) = coord.describe_groups(["g"])
        assert d.state == "Stable" and len(d.members) == 3
        assert coord.check_offset_commit("g", 1, leader.member_id, None, False) is None
        assert coord.check_offset_commit("g", 0, leader.member_id, None, True) is E.ILLEGAL_GENERATION
        coord.close()

    run(scenario())


def test_driver_session_timeout_fires_and_the_survivor_rebalances():
    async def scenario() -> None:
        coord = GroupCoordinator(FAST)
        a, b = await asyncio.gather(_join(coord, session=5_000), _join(coord, session=60))
        leader = a if a.members else b
        await asyncio.gather(
            *(coord.sync_group("g", 1, r.member_id, None, None, None, [(x.member_id, b"x") for x in (a, b)]) for r in (a, b))
        )
        survivor = a  # b stops heartbeating
        await asyncio.sleep(0.15)
        assert coord.heartbeat("g", 1, survivor.member_id, None) is E.REBALANCE_IN_PROGRESS
        again = await _join(coord, survivor.member_id)
        assert again.generation_id == 2 and [m.member_id for m in again.members] == [survivor.member_id]
        assert leader is not None
        coord.close()

    run(scenario())


def test_driver_close_answers_waiting_members_and_refuses_later_requests():
    async def scenario() -> None:
        coord = GroupCoordinator(GroupConfig(min_session_timeout_ms=10, initial_rebalance_delay_ms=60_000))
        waiting = asyncio.ensure_future(_join(coord))
        await asyncio.sleep(0.01)
        assert coord.snapshot()[0]["state"] == "PreparingRebalance"
        coord.close()
        assert (await waiting).error is E.NOT_COORDINATOR
        assert (await _join(coord)).error is E.COORDINATOR_NOT_AVAILABLE
        assert coord.heartbeat("g", 1, "m", None) is E.COORDINATOR_NOT_AVAILABLE
        assert coord.snapshot() == []

    run(scenario())


def test_driver_a_cancelled_join_does_not_disturb_the_others():
    async def scenario() -> None:
        coord = GroupCoordinator(FAST)
        gone = asyncio.ensure_future(_join(coord))
        stays = asyncio.ensure_future(_join(coord))
        await asyncio.sleep(0.005)
        gone.cancel()
        result = await stays
        assert result.error is None and result.generation_id == 1
        coord.close()

    run(scenario())


def test_driver_refuses_groups_it_does_not_own():
    async def scenario() -> None:
        coord = GroupCoordinator(FAST, owns=lambda group_id: group_id.startswith("mine"))
        assert (await coord.join_group("other", "", None, 5_000, 5_000, "consumer", [("r", b"")])).error is E.NOT_COORDINATOR
        assert (await coord.sync_group("other", 1, "m", None, None, None, [])).error is E.NOT_COORDINATOR
        assert coord.heartbeat("other", 1, "m", None) is E.NOT_COORDINATOR
        assert coord.leave_group("other", [("m", None)]).error is E.NOT_COORDINATOR
        assert coord.check_offset_commit("other", -1, "", None, False) is E.NOT_COORDINATOR
        assert coord.describe_groups(["other"])[0].error is E.NOT_COORDINATOR
        assert (await _join(coord, group="mine-1")).error is None
        coord.close()

    run(scenario())


def test_driver_resign_unloads_groups_that_moved():
    async def scenario() -> None:
        owned = {"g"}
        coord = GroupCoordinator(
            GroupConfig(min_session_timeout_ms=10, initial_rebalance_delay_ms=60_000), owns=lambda g: g in owned
        )
        waiting = asyncio.ensure_future(_join(coord))
        await asyncio.sleep(0.01)
        owned.clear()
        assert coord.resign() == ["g"]
        assert (await waiting).error is E.NOT_COORDINATOR
        assert coord.snapshot() == []
        coord.close()

    run(scenario())


def test_driver_delete_group_and_from_settings():
    async def scenario() -> None:
        settings = Settings(
            kafka_group_initial_rebalance_delay_ms=0, kafka_group_min_session_timeout_ms=10, kafka_group_max_size=5
        )
        coord = GroupCoordinator.from_settings(settings)
        assert coord.config.initial_rebalance_delay_ms == 0 and coord.config.min_session_timeout_ms == 10
        assert coord.config.max_size == 5 and GroupCoordinator.from_settings(Settings()).config.max_size is None
        assert coord.config.max_session_timeout_ms == settings.kafka_group_max_session_timeout_ms
        r = await _join(coord)
        assert coord.delete_group("g") is E.NON_EMPTY_GROUP
        assert coord.leave_group("g", [(r.member_id, None)]).members[0].error is None
        assert coord.delete_group("g") is None
        assert coord.describe_groups(["g"])[0].error is E.GROUP_ID_NOT_FOUND
        coord.close()

    run(scenario())


# --- wire handlers ---------------------------------------------------------------------------------------

from api.kafka.handlers import Node, RequestContext  # noqa: E402
from api.kafka.handlers import groups as h  # noqa: E402
from app.services import consumer_groups as consumer_groups_service  # noqa: E402
from app.services import groups as groups_service  # noqa: E402
from app.services import share_groups as share_groups_service  # noqa: E402
from app.wire.kafka.requests import decode_request  # noqa: E402
from app.wire.kafka.structs import decode_response, encode_request, encode_response  # noqa: E402


@pytest.fixture(autouse=True)
def no_consumer_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The database has no consumer group of the next-generation protocol (KIP-848): every group
    id is free for a classic group."""
    monkeypatch.setattr(consumer_groups_service, "claim_for_classic", lambda broker, group_id: True)
    monkeypatch.setattr(consumer_groups_service, "consumer_group_ids", lambda broker: set())
    monkeypatch.setattr(consumer_groups_service, "list_groups", lambda broker: [])


JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 11, 12, 13, 14, 15, 16


async def call(coord: GroupCoordinator, handler: Any, api_key: int, version: int, body: dict) -> Any:
    """A request through the gateway's codec: encoded as a client sends it (fields a version lacks
    are dropped), decoded, handled, and the answer encoded and decoded as the client reads it."""
    request = decode_request(encode_request(api_key, version, body, correlation_id=7, client_id="cli")[4:])
    ctx = RequestContext(
        broker=None,
        node=Node(0, "127.0.0.1", 9092),
        api_key=api_key,
        api_version=version,  # type: ignore[arg-type]
        correlation_id=7,
        client_id=request.header.client_id,
        client_host="10.1.2.3",
        groups=coord,
    )
    answer = await handler(ctx, request.body)
    correlation_id, response = decode_response(api_key, version, encode_response(request.header, answer)[4:])
    assert correlation_id == 7
    return response


async def _wire_join(coord: GroupCoordinator, v: int, member_id: str = "", instance: str | None = None) -> Any:
    body = {
        "group_id": "g",
        "session_timeout_ms": 6_000,
        "rebalance_timeout_ms": 9_000,
        "member_id": member_id,
        "group_instance_id": instance,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"meta"}],
        "reason": "test",
    }
    return await call(coord, h.handle_join_group, JOIN_GROUP, v, body)


@pytest.mark.parametrize("v", range(0, 10))
def test_handle_join_group_every_version(v):
    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        first = await _wire_join(coord, v)
        if v >= 4:
            assert first.error_code == E.MEMBER_ID_REQUIRED.kafka_code and first.member_id.startswith("cli-")
            assert first.generation_id == -1 and first.leader == ""
            first = await _wire_join(coord, v, first.member_id)
        assert first.error_code == 0 and first.generation_id == 1 and first.leader == first.member_id
        assert first.protocol_name == "range"
        assert [(m.member_id, m.metadata) for m in first.members] == [(first.member_id, b"meta")]
        if v >= 7:
            assert first.protocol_type == "consumer"
        member = coord.snapshot()[0]["members"][0]  # type: ignore[index]
        assert member["client_id"] == "cli" and member["client_host"] == "10.1.2.3"
        assert member["rebalance_timeout_ms"] == (6_000 if v == 0 else 9_000)  # v0: the session timeout
        refused = await _wire_join(coord, v, "nobody")
        assert refused.error_code == E.UNKNOWN_MEMBER_ID.kafka_code
        assert refused.protocol_name == ("" if v < 7 else None)  # nullable from v7
        coord.close()

    run(scenario())


@pytest.mark.parametrize("v", range(5, 10))
def test_handle_join_group_static_members(v):
    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        first = await _wire_join(coord, v, instance="host-1")
        assert first.error_code == 0 and first.member_id.startswith("host-1-")
        assert first.members[0].group_instance_id == "host-1"
        again = await _wire_join(coord, v, instance="host-1")  # restarted: takes over, the old id is fenced
        assert again.error_code == 0 and again.member_id != first.member_id
        stale = await _wire_join(coord, v, first.member_id, instance="host-1")
        assert stale.error_code == E.FENCED_INSTANCE_ID.kafka_code
        coord.close()

    run(scenario())


@pytest.mark.parametrize("v", range(0, 6))
def test_handle_sync_group_every_version(v):
    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        joined = await _join(coord)
        body = {
            "group_id": "g",
            "generation_id": 1,
            "member_id": joined.member_id,
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [{"member_id": joined.member_id, "assignment": b"\x00\x01parts"}],
        }
        response = await call(coord, h.handle_sync_group, SYNC_GROUP, v, body)
        assert response.error_code == 0 and response.assignment == b"\x00\x01parts"
        if v >= 5:
            assert (response.protocol_type, response.protocol_name) == ("consumer", "range")
        response = await call(coord, h.handle_sync_group, SYNC_GROUP, v, {**body, "generation_id": 7})
        assert response.error_code == E.ILLEGAL_GENERATION.kafka_code
        response = await call(coord, h.handle_sync_group, SYNC_GROUP, v, {**body, "protocol_name": "rr"})
        assert response.error_code == (E.INCONSISTENT_GROUP_PROTOCOL.kafka_code if v >= 5 else 0)  # sent from v5
        coord.close()

    run(scenario())


@pytest.mark.parametrize("v", range(0, 5))
def test_handle_heartbeat_every_version(v):
    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        joined = await _join(coord, instance="host-1")
        body = {"group_id": "g", "generation_id": 1, "member_id": joined.member_id, "group_instance_id": "host-1"}
        assert (await call(coord, h.handle_heartbeat, HEARTBEAT, v, body)).error_code == 0
        stale = await call(coord, h.handle_heartbeat, HEARTBEAT, v, {**body, "member_id": "host-1-old"})
        expected = E.FENCED_INSTANCE_ID if v >= 3 else E.UNKNOWN_MEMBER_ID  # the instance id is sent from v3
        assert stale.error_code == expected.kafka_code
        coord.close()

    run(scenario())


@pytest.mark.parametrize("v", range(0, 6))
def test_handle_leave_group_every_version(v):
    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        a = await _join(coord, instance="host-a")
        if v >= 3:
            body = {
                "group_id": "g",
                "members": [
                    {"member_id": "", "group_instance_id": "host-a", "reason": "bye"},
                    {"member_id": "nobody", "group_instance_id": None},
                ],
            }
        else:
            body = {"group_id": "g", "member_id": a.member_id}
        response = await call(coord, h.handle_leave_group, LEAVE_GROUP, v, body)
        assert response.error_code == 0
        if v >= 3:
            assert [(m.member_id, m.group_instance_id, m.error_code) for m in response.members] == [
                ("", "host-a", 0),
                ("nobody", None, E.UNKNOWN_MEMBER_ID.kafka_code),
            ]
        assert coord.snapshot()[0]["members"] == []
        if v < 3:
            again = await call(coord, h.handle_leave_group, LEAVE_GROUP, v, body)
            assert again.error_code == E.UNKNOWN_MEMBER_ID.kafka_code  # the member's error is the request's
        coord.close()

    run(scenario())


@pytest.mark.parametrize("v", range(0, 7))
def test_handle_describe_groups_every_version(v, monkeypatch):
    # "stored" has committed offsets and nothing else: an Empty group, as Kafka keeps it
    monkeypatch.setattr(
        groups_service, "list_groups", lambda broker, among=None: [g for g in ("g", "stored") if among is None or g in among]
    )

    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        joined = await _join(coord, instance="host-1")
        await coord.sync_group("g", 1, joined.member_id, "host-1", None, None, [(joined.member_id, b"assigned")])
        body = {"groups": ["g", "unknown", "stored"], "include_authorized_operations": True}
        known, unknown, stored = (await call(coord, h.handle_describe_groups, DESCRIBE_GROUPS, v, body)).groups
        assert (stored.error_code, stored.group_id, stored.group_state, stored.protocol_type, stored.members) == (
            0,
            "stored",
            "Empty",
            "",
            [],
        )
        assert (known.error_code, known.group_id, known.group_state, known.protocol_type, known.protocol_data) == (
            0,
            "g",
            "Stable",
            "consumer",
            "range",
        )
        (m,) = known.members
        assert (m.member_id, m.client_id, m.client_host, m.member_metadata, m.member_assignment) == (
            joined.member_id,
            "c",
            "h",
            b"m",
            b"assigned",
        )
        if v >= 4:
            assert m.group_instance_id == "host-1"
        assert (unknown.group_id, unknown.group_state, unknown.members) == ("unknown", "Dead", [])
        if v >= 6:
            assert unknown.error_code == E.GROUP_ID_NOT_FOUND.kafka_code and unknown.error_message
        else:
            assert unknown.error_code == 0  # before v6 an unknown group is Dead, without an error
        coord.close()

    run(scenario())


@pytest.mark.parametrize("v", range(0, 6))
def test_handle_list_groups_every_version(v, monkeypatch):
    # "stored" has committed offsets and nothing else: listed as an Empty group, as Kafka does
    monkeypatch.setattr(groups_service, "list_groups", lambda broker: ["one", "stored"])
    monkeypatch.setattr(share_groups_service, "list_groups", lambda broker: [])  # no share groups

    async def scenario() -> None:
        coord = GroupCoordinator(NO_DELAY)
        await _join(coord, group="one")
        r = await _join(coord, group="two")
        coord.leave_group("two", [(r.member_id, None)])
        response = await call(
            coord, h.handle_list_groups, LIST_GROUPS, v, {"states_filter": ["empty"], "types_filter": ["classic"]}
        )
        listed = [(g.group_id, g.protocol_type) for g in response.groups]
        assert response.error_code == 0
        if v >= 4:  # the states filter is sent from v4
            assert listed == [("two", "consumer"), ("stored", "")] and {g.group_state for g in response.groups} == {"Empty"}
        else:
            assert listed == [("one", "consumer"), ("two", "consumer"), ("stored", "")]
        if v >= 5:
            assert response.groups[0].group_type == "classic"
            other = await call(coord, h.handle_list_groups, LIST_GROUPS, v, {"types_filter": ["consumer"]})
            assert other.groups == []
        coord.close()

    run(scenario())


# -- OffsetDelete ---------------------------------------------------------------------------------


def test_offset_delete_keeps_the_offsets_of_the_topics_the_members_subscribe_to():
    from tests.admin.test_kafka_groups import subscription_bytes

    topics = {"a", "b", "c"}
    assert coordinator.offset_delete(None, topics, with_offsets=True) == (None, frozenset())  # known by its offsets only
    assert coordinator.offset_delete(None, topics, with_offsets=False) == (E.GROUP_ID_NOT_FOUND, frozenset())
    one = Sim()
    (member,) = one.stable(1, protocols=(("range", subscription_bytes(1, ["a"])),))
    assert coordinator.offset_delete(one.g, topics, with_offsets=True) == (None, frozenset({"a"}))
    two = Sim()
    two.stable(2, protocols=(("range", subscription_bytes(0, ["a", "b"])),))
    assert coordinator.offset_delete(two.g, topics, with_offsets=False) == (None, frozenset({"a", "b"}))
    garbled = Sim()
    garbled.stable(1, protocols=(("range", b"\x00"),))  # a subscription that does not decode: every topic
    assert coordinator.offset_delete(garbled.g, topics, with_offsets=True) == (None, frozenset(topics))
    connect = Sim()
    connect.stable(1, protocol_type="connect")
    assert coordinator.offset_delete(connect.g, topics, with_offsets=True) == (E.NON_EMPTY_GROUP, frozenset())
    one.leave((member, None))
    assert one.g.state is S.EMPTY
    assert coordinator.offset_delete(one.g, topics, with_offsets=True) == (None, frozenset())
