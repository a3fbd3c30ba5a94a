"""A model-based test of the classic group coordinator (app.domain.groups): hypothesis drives random
clients — dynamic and static, joining, syncing, heartbeating, committing, leaving, crashing,
restarting — and random passing time through the pure functions, and checks after every step:

- the generation moves only when a join phase ends, by exactly one, whatever the number of joins;
- every successful JoinGroup answer carries the group's generation; the leader's lists the members;
- a Stable group's members all hold assignments of the current generation, and every member the
  leader assigned gets exactly its bytes;
- the leader is a member (and there is one iff there are members); no member is both pending and
  joined, or waits for two things, or waits for something its state does not offer;
- a static instance id names one member at most, and a fenced member's requests are refused;
- the armed timers are the ones the state wants, a join phase always has a deadline, and every
  parked request is a waiting member's (the harness checks these on every outcome): no client is
  ever left without an answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from app.domain.groups import rebalance
from app.domain.groups.state import (
    AnswerJoin,
    AnswerSync,
    Group,
    GroupConfig,
    GroupState,
    JoinResult,
    Outcome,
    Protocols,
    SyncResult,
    Waiting,
)
from app.errors import ErrorCode
from tests.unit.test_group_coordinator import PARKED, Sim

S = GroupState
E = ErrorCode

# Every protocol list includes "range", so members always share one; "rr" wins a vote sometimes.
PROTOCOL_CHOICES = [("range",), ("rr", "range"), ("range", "rr")]
SESSIONS = [3_000, 10_000]
REBALANCES = [5_000, 20_000]
STEPS_MS = [1, 50, 100, 1_000, 2_999, 5_000, 9_999, 20_000, 40_000]


@dataclass
class Client:
    name: str
    instance: str | None
    protocols: tuple[str, ...]
    session_ms: int
    rebalance_ms: int
    v4: bool = True  # JoinGroup v4+ (member id round trip)
    skip: bool = False  # JoinGroup v9+ (skip_assignment)
    version: int = 0  # bumps the protocol metadata when the subscription changes
    member_id: str = ""
    generation: int = -1
    leader: bool = False
    to_assign: tuple[str, ...] = ()
    waiting: tuple[Waiting, str] | None = None
    fenced: bool = False  # a newer instance took over: it is a zombie now
    synced: bool = False  # has its assignment for this generation
    rejoin: bool = False  # was told to rejoin

    def protocol_list(self) -> Protocols:
        return tuple((name, f"{name}:{self.version}".encode()) for name in self.protocols)


class GroupModel(RuleBasedStateMachine):
    config = GroupConfig(min_session_timeout_ms=1_000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=100)

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(self.config)
        self.clients: list[Client] = []
        self.zombies: list[Client] = []
        self.names = 0
        self.checked = 0  # outcomes already checked
        self.before: Group | None = None
        self.given: dict[int, dict[str, bytes]] = {}  # the leader's assignment per generation

    # --- helpers ---

    def _new_client(self, static: bool, protocols: tuple[str, ...], session: int, rebalance: int, v4: bool, skip: bool) -> Client:
        self.names += 1
        instance = f"i{self.names}" if static else None
        return Client(f"c{self.names}", instance, protocols, session, rebalance, v4, skip)

    def _pick(self, i: int) -> Client:
        return self.clients[i % len(self.clients)]

    def _on_join(self, c: Client, r: JoinResult) -> None:
        if r.error is None:
            c.member_id, c.generation = r.member_id, r.generation_id
            c.leader = r.leader_id == r.member_id and not r.skip_assignment
            c.to_assign = tuple(m.member_id for m in r.members)
            c.synced = c.rejoin = False
        elif r.error is E.MEMBER_ID_REQUIRED:
            c.member_id = r.member_id
        elif r.error is E.FENCED_INSTANCE_ID:
            c.fenced = True
        elif r.error in (E.UNKNOWN_MEMBER_ID, E.GROUP_MAX_SIZE_REACHED):
            c.member_id, c.generation = "", -1
        else:
            assert r.error is E.REBALANCE_IN_PROGRESS, r
            c.rejoin = True

    def _on_sync(self, c: Client, r: SyncResult) -> None:
        if r.error is E.FENCED_INSTANCE_ID:
            c.fenced = True
        elif r.error is E.UNKNOWN_MEMBER_ID:
            c.member_id, c.generation = "", -1
        else:
            assert r.error in (None, E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION), r
            c.synced = r.error is None
            c.rejoin = r.error is not None

    def _deliver(self) -> None:
        """Answers that reached parked clients (the simulator keeps them by waiting key)."""
        for c in self.clients + self.zombies:
            if c.waiting is not None and c.waiting in self.sim.answers:
                result = self.sim.answers.pop(c.waiting)
                c.waiting = None
                if isinstance(result, JoinResult):
                    self._on_join(c, result)
                else:
                    self._on_sync(c, result)
        self.zombies = [z for z in self.zombies if z.waiting is not None or z.member_id]

    def _reply(self, c: Client, result: object, on: object) -> None:
        if result is PARKED:
            assert self.sim.last_parked is not None
            c.waiting = self.sim.last_parked
            c.member_id = c.waiting[1]
        else:
            on(c, result)  # type: ignore[operator]
        self._deliver()

    # --- rules ---

    @rule(
        static=st.booleans(),
        protocols=st.sampled_from(PROTOCOL_CHOICES),
        session=st.sampled_from(SESSIONS),
        rebalance=st.sampled_from(REBALANCES),
        v4=st.booleans(),
        skip=st.booleans(),
    )
    def start_client(self, static: bool, protocols: tuple[str, ...], session: int, rebalance: int, v4: bool, skip: bool) -> None:
        if len(self.clients) < 5:
            self.clients.append(self._new_client(static, protocols, session, rebalance, v4, skip))

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 50), change=st.sampled_from([False, False, False, True]))
    def join(self, i: int, change: bool) -> None:
        c = self._pick(i)
        if c.waiting is not None or c.fenced:
            return
        if change:
            c.version += 1
        result = self.sim.join(
            c.member_id,
            instance=c.instance,
            protocols=c.protocol_list(),
            session=c.session_ms,
            rebalance=c.rebalance_ms,
            v4=c.v4,
            skip=c.skip,
            client_id=c.name,
        )
        if isinstance(result, JoinResult) and result.error is None:
            assert result.generation_id == self.sim.g.generation_id
        self._reply(c, result, self._on_join)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 50), omit=st.integers(0, 3))
    def sync(self, i: int, omit: int) -> None:
        c = self._pick(i)
        if c.waiting is not None or c.fenced or c.generation < 0:
            return
        assignments: tuple[tuple[str, bytes], ...] = ()
        if c.leader:
            # The leader assigns every member it was given, but sometimes leaves one out.
            assigned = [m for k, m in enumerate(c.to_assign) if k != omit or len(c.to_assign) < 2]
            assignments = tuple((m, f"g{c.generation}:{m}".encode()) for m in assigned)
            g = self.sim.group
            if (
                g is not None
                and g.state is S.COMPLETING_REBALANCE
                and (g.generation_id, g.leader_id) == (c.generation, c.member_id)
            ):
                self.given[c.generation] = dict(assignments)  # this one takes effect
        result = self.sim.sync(c.member_id, c.generation, assignments, instance=c.instance)
        if isinstance(result, SyncResult) and result.error is None:  # a Stable group answers at once
            self._check_assignment(self.sim.g, c.member_id, result.assignment)
        self._reply(c, result, self._on_sync)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 50))
    def heartbeat(self, i: int) -> None:
        c = self._pick(i)
        if c.waiting is not None or c.fenced or not c.member_id:
            return
        error = self.sim.heartbeat(c.member_id, max(c.generation, 0), c.instance)
        if error is E.UNKNOWN_MEMBER_ID:
            c.member_id, c.generation = "", -1
        elif error is E.FENCED_INSTANCE_ID:
            c.fenced = True
        elif error is not None:
            c.rejoin = True
        self._deliver()

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 50))
    def client_step(self, i: int) -> None:
        """One client does what a consumer does next: join, sync, or heartbeat (rejoining when told)."""
        self._step(self._pick(i))

    @precondition(lambda self: self.clients)
    @rule()
    def every_client_steps(self) -> None:
        for c in list(self.clients):
            self._step(c)

    @precondition(lambda self: self.clients)
    @rule()
    def calm_period(self) -> None:
        """Nothing disturbs the group for a while: the clients carry the rebalance through."""
        for _ in range(6):
            self.every_client_steps()
            self.time_passes(100, True)

    def _step(self, c: Client) -> None:
        if c.waiting is not None or c.fenced:
            return
        if not c.member_id or c.generation < 0 or c.rejoin:
            self.join(self.clients.index(c), change=False)
        elif not c.synced:
            self.sync(self.clients.index(c), omit=3)
        else:
            self.heartbeat(self.clients.index(c))

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 50), transactional=st.booleans())
    def commit(self, i: int, transactional: bool) -> None:
        c = self._pick(i)
        if c.fenced:
            return
        g = self.sim.group
        error = self.sim.commit(c.member_id, c.generation, c.instance, transactional)
        if g is None or g.state is S.DEAD:
            return
        member = c.member_id in g.members and (c.instance is None or g.static_member_id(c.instance) == c.member_id)
        if member and c.generation == g.generation_id:
            completing = g.state is S.COMPLETING_REBALANCE and not transactional
            assert error is (E.REBALANCE_IN_PROGRESS if completing else None)
        elif member and c.generation >= 0:
            assert error is E.ILLEGAL_GENERATION
        elif c.generation >= 0:
            assert error in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID)

    @rule(transactional=st.booleans())
    def simple_consumer_commit(self, transactional: bool) -> None:
        g = self.sim.group
        error = self.sim.commit("", -1, None, transactional)
        allowed = g is None or g.state is S.EMPTY or transactional
        assert (error is None) == allowed, (error, g and g.state)

    @precondition(lambda self: self.clients)
    @rule(i=st.integers(0, 50), graceful=st.booleans())
    def client_stops(self, i: int, graceful: bool) -> None:
        """A client stops: gracefully it leaves; otherwise its session (or the rebalance timeout)
        removes it."""
        c = self._pick(i)
        self.clients.remove(c)
        if not graceful:
            return
        if c.member_id and not c.fenced:
            answer = self.sim.leave((c.member_id, c.instance))
            assert answer.error is None
        self._deliver()
        if c.waiting is not None:  # answered when it left
            assert c.waiting not in self.sim.parked

    @precondition(lambda self: any(c.instance and c.member_id and not c.fenced for c in self.clients))
    @rule(i=st.integers(0, 50), protocols=st.sampled_from(PROTOCOL_CHOICES))
    def restart_static(self, i: int, protocols: tuple[str, ...]) -> None:
        """A static member restarts: the new process joins with the same instance id and no member id;
        the old one becomes a zombie that may still send requests with its old member id."""
        candidates = [c for c in self.clients if c.instance and c.member_id and not c.fenced]
        old = candidates[i % len(candidates)]
        self.clients.remove(old)
        self.zombies.append(old)
        new = Client(old.name + "'", old.instance, protocols, old.session_ms, old.rebalance_ms, old.v4, old.skip)
        self.clients.append(new)
        result = self.sim.join(
            "",
            instance=new.instance,
            protocols=new.protocol_list(),
            session=new.session_ms,
            rebalance=new.rebalance_ms,
            skip=new.skip,
            client_id=new.name,
        )
        self._reply(new, result, self._on_join)

    @precondition(lambda self: self.zombies)
    @rule(i=st.integers(0, 50), kind=st.sampled_from(["heartbeat", "sync", "join", "commit"]))
    def zombie_request(self, i: int, kind: str) -> None:
        """A fenced member is refused whatever it sends with its instance id."""
        z = self.zombies[i % len(self.zombies)]
        if z.waiting is not None or not z.member_id:
            return
        current = self.sim.group.static_member_id(z.instance) if self.sim.group else None
        if current == z.member_id:
            return  # not replaced yet (its replacement's join was refused)
        expected = E.FENCED_INSTANCE_ID if current is not None else E.UNKNOWN_MEMBER_ID
        if kind == "heartbeat":
            error = self.sim.heartbeat(z.member_id, max(z.generation, 0), z.instance)
        elif kind == "sync":
            error = self.sim.sync(z.member_id, max(z.generation, 0), (), instance=z.instance).error
        elif kind == "join":
            error = self.sim.join(z.member_id, instance=z.instance, protocols=z.protocol_list()).error
        else:
            error = self.sim.commit(z.member_id, max(z.generation, 0), z.instance)
        assert error is expected or (self.sim.group is None and error is E.UNKNOWN_MEMBER_ID), (kind, error)
        self._deliver()

    @rule(instance_index=st.integers(0, 50))
    def admin_removes_a_static_member(self, instance_index: int) -> None:
        g = self.sim.group
        statics = [m.group_instance_id for m in g.members.values() if m.group_instance_id] if g else []
        if not statics:
            return
        self.sim.leave(("", statics[instance_index % len(statics)]))
        self._deliver()

    @rule(ms=st.sampled_from(STEPS_MS), live=st.sampled_from([True, True, True, False]))
    def time_passes(self, ms: int, live: bool) -> None:
        """Time passes; with ``live``, running clients heartbeat on the way (as real ones do)."""
        if live:
            alive = [c.member_id for c in self.clients if c.member_id and not c.fenced and c.waiting is None]
            self.sim.wait(ms, *alive, every=min(SESSIONS) // 2)
        else:
            self.sim.advance(ms)
        self._deliver()

    # --- invariants ---

    @invariant()
    def every_step_keeps_the_rules(self) -> None:
        for outcome in self.sim.outcomes[self.checked :]:
            self._check_step(self.before, outcome)
            self.before = outcome.group
        self.checked = len(self.sim.outcomes)
        self._check_group(self.sim.group)

    def _check_step(self, before: Group | None, outcome: Outcome) -> None:
        after = outcome.group
        if after is None:
            return
        gen_before = before.generation_id if before is not None else 0
        if after.generation_id != gen_before:
            # One generation per completed join phase: only a phase's end moves it, by one. (One event
            # may start and end a phase, e.g. the last member's session ends and the group is Empty.)
            assert after.generation_id == gen_before + 1
            assert after.state in (S.COMPLETING_REBALANCE, S.EMPTY)
        for e in outcome.effects:
            if isinstance(e, AnswerJoin) and e.result.error is None:
                assert e.result.generation_id == after.generation_id
                if e.result.members:
                    assert e.result.leader_id == e.result.member_id == after.leader_id
                    assert {m.member_id for m in e.result.members} == set(after.members)
            if isinstance(e, AnswerSync) and e.result.error is None:
                assert after.state is S.STABLE
                self._check_assignment(after, e.member_id, e.result.assignment)

    def _check_assignment(self, group: Group, member_id: str, assignment: bytes) -> None:
        given = self.given.get(group.generation_id, {})
        if member_id in given:
            assert assignment == given[member_id]  # exactly the leader's bytes
        else:
            assert assignment == b"" or assignment.startswith(f"g{group.generation_id}:".encode())

    def _check_group(self, g: Group | None) -> None:
        if g is None:
            return
        members = g.members
        assert (g.leader_id is None) == (not members)
        assert g.leader_id is None or g.leader_id in members
        assert not set(members) & set(g.pending_members)
        assert g.pending_sync <= set(members)
        instances = [m.group_instance_id for m in members.values() if m.group_instance_id is not None]
        assert len(instances) == len(set(instances))
        if g.state is S.EMPTY:
            assert not members and g.protocol_name is None
        elif not members:
            assert g.state is S.PREPARING_REBALANCE
        for m in members.values():
            assert m.waiting is not Waiting.JOIN or g.state is S.PREPARING_REBALANCE
            assert m.waiting is not Waiting.SYNC or g.state is S.COMPLETING_REBALANCE
            assert not m.is_new or m.waiting is Waiting.JOIN
        if g.state is S.PREPARING_REBALANCE:
            assert g.join_deadline_ms is not None  # a join phase always ends
        if g.state in (S.COMPLETING_REBALANCE, S.STABLE):
            assert g.protocol_name is not None and g.generation_id > 0
            assert g.protocol_name in (rebalance.candidate_protocols(g) or [])
        if g.state is S.STABLE:
            for mid, m in members.items():
                self._check_assignment(g, mid, m.assignment)
        else:
            assert g.state is not S.COMPLETING_REBALANCE or all(m.assignment == b"" for m in members.values())


class GroupModelWithoutInitialDelay(GroupModel):
    config = GroupConfig(min_session_timeout_ms=1_000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=0)


class GroupModelWithMaxSize(GroupModel):
    config = GroupConfig(min_session_timeout_ms=1_000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=100, max_size=3)


_settings = settings(max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestGroupModel = GroupModel.TestCase
TestGroupModel.settings = _settings
TestGroupModelWithoutInitialDelay = GroupModelWithoutInitialDelay.TestCase
TestGroupModelWithoutInitialDelay.settings = _settings
TestGroupModelWithMaxSize = GroupModelWithMaxSize.TestCase
TestGroupModelWithMaxSize.settings = _settings
