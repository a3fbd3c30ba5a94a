"""Kafka's classic group coordinator (``GroupCoordinator``) as pure functions, no I/O.

JoinGroup, SyncGroup, Heartbeat and LeaveGroup move a group through its states (``state``). Each event
is a function from the group as it is (``None``: unknown) to an ``Outcome``: the group as it becomes,
the caller's answer (or ``Park``: the caller waits), and the effects the driver carries out in
order — answer waiting JoinGroup/SyncGroup requests, arm or cancel timers. When a timer fires the
driver calls ``on_timer``. Time is passed in as ``now`` (epoch milliseconds), new member ids are
passed in too, so nothing here sleeps, draws random numbers or reads a clock.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from app.domain.consumer_protocol import CONSUMER_PROTOCOL_TYPE, ConsumerProtocolError, decode_subscription
from app.domain.groups import rebalance
from app.domain.groups.state import (
    ArmTimer,
    CancelTimer,
    Effect,
    Group,
    GroupConfig,
    JoinRequest,
    JoinResult,
    LeaveAnswer,
    LeftMember,
    Outcome,
    S,
    SyncRequest,
    SyncResult,
    Timer,
    TimerKind,
    Waiting,
    check_transition,
    join_error,
    sync_error,
    timers,
)
from app.errors import ErrorCode


def _finish(
    before: Group | None, after: Group | None, fx: list[Effect], reply: object = None, fired: Timer | None = None
) -> Outcome:
    """The outcome with the timer changes from ``before`` to ``after`` appended (a timer that just
    fired is re-armed if it is still wanted)."""
    old, new = timers(before), timers(after)
    if fired is not None:
        old.pop(fired, None)
    timer_fx: list[Effect] = [CancelTimer(t) for t in old if t not in new]
    timer_fx += [ArmTimer(t, d) for t, d in new.items() if old.get(t) != d]
    return Outcome(after, reply, (*fx, *timer_fx))


def new_member_id(client_id: str, group_instance_id: str | None, unique: str) -> str:
    """Kafka's member ids: the instance id (static members) or the client id, a dash, a unique part."""
    return f"{group_instance_id if group_instance_id is not None else client_id}-{unique}"


def _validate_member_generation(
    group: Group, generation_id: int, member_id: str, group_instance_id: str | None
) -> ErrorCode | None:
    """``validate_member``, then the request's generation must be the group's (else ILLEGAL_GENERATION):
    what SyncGroup, Heartbeat and a member's OffsetCommit ask of their sender."""
    error = rebalance.validate_member(group, member_id, group_instance_id)
    if error is None and generation_id != group.generation_id:
        return ErrorCode.ILLEGAL_GENERATION
    return error


# --- events: each returns an Outcome ----------------------------------------------------------------


def join(group: Group | None, group_id: str, request: JoinRequest, unique: str, now: int, config: GroupConfig) -> Outcome:
    """JoinGroup (Kafka's handleJoinGroup). ``unique`` makes the member id of a member without one."""
    r = request
    if r.rebalance_timeout_ms <= 0:  # none given (v0), or nonsense: the session timeout, as Kafka
        r = dataclasses.replace(r, rebalance_timeout_ms=r.session_timeout_ms)

    def refuse(error: ErrorCode) -> Outcome:
        return _finish(group, group, [], join_error(r.member_id, error))

    if not group_id:
        return refuse(ErrorCode.INVALID_GROUP_ID)
    if not config.min_session_timeout_ms <= r.session_timeout_ms <= config.max_session_timeout_ms:
        return refuse(ErrorCode.INVALID_SESSION_TIMEOUT)
    if group is None:
        if r.member_id:
            return refuse(ErrorCode.UNKNOWN_MEMBER_ID)
        check_transition(None, S.EMPTY)
        start = Group(group_id, state_since_ms=now)
    else:
        start = group
    if start.state is S.DEAD:
        return refuse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    fx: list[Effect] = []
    reply: JoinResult | None
    if not rebalance.accepts_member(start, r, config):
        g = rebalance.remove(start, r.member_id, fx) if r.member_id in start.members else start
        reply = join_error("", ErrorCode.GROUP_MAX_SIZE_REACHED)
    elif not r.member_id:
        g, reply = rebalance.join_new_member(start, r, new_member_id(r.client_id, r.group_instance_id, unique), now, config, fx)
    else:
        g, reply = rebalance.join_known_member(start, r, now, config, fx)
    g = rebalance.try_complete_join(g, now, config, fx)
    if group is None and not g.members and not g.pending_members:
        return _finish(None, None, fx, reply)  # a refused first join leaves no group behind
    return _finish(group, g, fx, reply)


def sync(group: Group | None, request: SyncRequest, now: int, config: GroupConfig) -> Outcome:
    """SyncGroup (Kafka's handleSyncGroup). Followers wait for the leader; the leader's assignment is
    delivered to every member it names, byte for byte, and members it leaves out get an empty
    assignment (as Kafka does)."""
    r = request

    def refuse(error: ErrorCode) -> Outcome:
        return _finish(group, group, [], sync_error(error))

    if group is None:
        return refuse(ErrorCode.UNKNOWN_MEMBER_ID)
    if group.state is S.DEAD:
        return refuse(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    error = _validate_member_generation(group, r.generation_id, r.member_id, r.group_instance_id)
    if error is not None:
        return refuse(error)
    if (r.protocol_type is not None and r.protocol_type != group.protocol_type) or (
        r.protocol_name is not None and r.protocol_name != group.protocol_name
    ):
        return refuse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    if group.state is S.PREPARING_REBALANCE:
        return refuse(ErrorCode.REBALANCE_IN_PROGRESS)
    fx: list[Effect] = []  # CompletingRebalance or Stable (an Empty group has no member to validate)
    pending = group.pending_sync - {r.member_id}
    g = dataclasses.replace(group, pending_sync=pending, sync_deadline_ms=group.sync_deadline_ms if pending else None)
    if g.state is S.STABLE:
        member = rebalance.alive(g.members[r.member_id], now)
        return _finish(group, rebalance.put(g, member), fx, SyncResult(None, g.protocol_type, g.protocol_name, member.assignment))
    g = rebalance.park(g, r.member_id, Waiting.SYNC, now, fx)
    if g.leader_id == r.member_id:
        given = dict(r.assignments)  # a member named twice keeps its last assignment
        for mid, m in list(g.members.items()):
            g = rebalance.put(g, dataclasses.replace(m, assignment=given.get(mid, b"")))
        g = rebalance.transition(g, S.STABLE, now)
        for mid, m in list(g.members.items()):
            if m.waiting is Waiting.SYNC:
                g = rebalance.answer(g, mid, None, SyncResult(None, g.protocol_type, g.protocol_name, m.assignment), now, fx)
    return _finish(group, g, fx)


def heartbeat(group: Group | None, generation_id: int, member_id: str, group_instance_id: str | None, now: int) -> Outcome:
    """Heartbeat: the reply is an ErrorCode or None. REBALANCE_IN_PROGRESS tells a member to rejoin."""
    if group is None:
        return _finish(group, group, [], ErrorCode.UNKNOWN_MEMBER_ID)
    if group.state is S.DEAD:
        return _finish(group, group, [], ErrorCode.COORDINATOR_NOT_AVAILABLE)
    error = _validate_member_generation(group, generation_id, member_id, group_instance_id)  # an Empty group has no members
    if error is not None:
        return _finish(group, group, [], error)
    g = rebalance.put(group, rebalance.alive(group.members[member_id], now))
    return _finish(group, g, [], ErrorCode.REBALANCE_IN_PROGRESS if g.state is S.PREPARING_REBALANCE else None)


def leave(group: Group | None, leaving: Sequence[tuple[str, str | None]], now: int, config: GroupConfig) -> Outcome:
    """LeaveGroup of (member id, group instance id) pairs (v3+; older versions send one pair). An
    empty member id with an instance id removes that static member (an administrator's removal).
    The reply is a ``LeaveAnswer``."""
    if group is None:
        left = tuple(LeftMember(mid, iid, ErrorCode.UNKNOWN_MEMBER_ID) for mid, iid in leaving)
        return _finish(group, group, [], LeaveAnswer(None, left))
    if group.state is S.DEAD:
        return _finish(group, group, [], LeaveAnswer(ErrorCode.COORDINATOR_NOT_AVAILABLE, ()))
    fx: list[Effect] = []
    g = group
    results: list[LeftMember] = []
    for mid, iid in leaving:
        error: ErrorCode | None = None
        if not mid:
            current = g.static_member_id(iid)
            if current is None:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            else:
                g = rebalance.remove_and_update(g, current, now, config, fx)
        elif mid in g.pending_members:
            g = rebalance.try_complete_join(rebalance.remove(g, mid, fx), now, config, fx)
        else:
            error = rebalance.validate_member(g, mid, iid)
            if error is None:
                g = rebalance.remove_and_update(g, mid, now, config, fx)
        results.append(LeftMember(mid, iid, error))
    return _finish(group, g, fx, LeaveAnswer(None, tuple(results)))


def on_timer(group: Group | None, timer: Timer, now: int, config: GroupConfig) -> Outcome:
    """A timer's deadline passed: a session ended, a join phase's time is up (or its initial delay),
    or members did not send SyncGroup in time. A timer the state no longer wants does nothing."""
    fx: list[Effect] = []
    g = group
    if g is None or g.state is S.DEAD:
        pass
    elif timer.kind is TimerKind.SESSION:
        mid = timer.member_id
        member = g.members.get(mid)
        if mid in g.pending_members and g.pending_members[mid] <= now:
            g = rebalance.try_complete_join(rebalance.remove(g, mid, fx), now, config, fx)
        elif member is not None and not member.kept_alive and member.session_deadline_ms <= now:
            g = rebalance.remove_and_update(g, mid, now, config, fx)
    elif timer.kind is TimerKind.JOIN:
        if g.state is S.PREPARING_REBALANCE and g.join_deadline_ms is not None and g.join_deadline_ms <= now:
            remaining = g.initial_delay_remaining_ms
            if remaining and g.new_member_added:
                # Members are still arriving at a new group: wait once more, within the rebalance timeout.
                delay = min(config.initial_rebalance_delay_ms, remaining)
                g = dataclasses.replace(
                    g, join_deadline_ms=now + delay, initial_delay_remaining_ms=remaining - delay, new_member_added=False
                )
            else:
                g = rebalance.complete_join(g, now, config, fx)
    elif timer.kind is TimerKind.SYNC:
        if (
            g.state in (S.COMPLETING_REBALANCE, S.STABLE)
            and g.pending_sync
            and g.sync_deadline_ms is not None
            and g.sync_deadline_ms <= now
        ):
            for mid in [mid for mid in g.members if mid in g.pending_sync]:
                g = rebalance.remove(g, mid, fx)
            g = rebalance.prepare_rebalance(g, now, config, fx)
    return _finish(group, g, fx, fired=timer)


def offset_commit(
    group: Group | None, generation_id: int, member_id: str, group_instance_id: str | None, transactional: bool, now: int
) -> Outcome:
    """Whether an OffsetCommit (or, ``transactional``, a TxnOffsetCommit) may commit for this group:
    the reply is an ErrorCode or None. Generation -1 without a member id is a "simple" consumer
    (assign()): allowed while the group is Empty or unknown. Otherwise the member must be current in
    this generation (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION), and an OffsetCommit
    while the assignment is being delivered gets REBALANCE_IN_PROGRESS. TxnOffsetCommit below v3
    carries no generation or member: it is allowed whatever the state, as Kafka does. A member's
    accepted OffsetCommit counts as a heartbeat."""
    if group is None:
        return _finish(None, None, [], None if generation_id < 0 else ErrorCode.ILLEGAL_GENERATION)
    if group.state is S.DEAD:
        return _finish(group, group, [], ErrorCode.COORDINATOR_NOT_AVAILABLE)
    if generation_id < 0 and group.state is S.EMPTY:
        return _finish(group, group, [], None)
    error: ErrorCode | None = None
    if generation_id >= 0 or member_id or group_instance_id is not None:
        error = _validate_member_generation(group, generation_id, member_id, group_instance_id)
    elif not transactional and group.state is not S.EMPTY:
        error = ErrorCode.UNKNOWN_MEMBER_ID
    if error is None and not transactional and group.state is S.COMPLETING_REBALANCE:
        error = ErrorCode.REBALANCE_IN_PROGRESS
    g = group
    if error is None and not transactional and member_id in g.members and g.state in (S.STABLE, S.PREPARING_REBALANCE):
        g = rebalance.put(g, rebalance.alive(g.members[member_id], now))
    return _finish(group, g, [], error)


def unload(group: Group, now: int) -> Outcome:
    """The coordinator stops coordinating this group (it shuts down, or the group moved to another
    gateway): every parked request is answered NOT_COORDINATOR, so clients look for the coordinator
    again, and the group is Dead."""
    fx: list[Effect] = []
    g = group
    for m in list(g.members.values()):
        rebalance.refuse_parked(m, ErrorCode.NOT_COORDINATOR, fx)
        g = rebalance.put(g, dataclasses.replace(m, waiting=None))
    return _finish(group, rebalance.transition(g, S.DEAD, now), fx)


def delete(group: Group | None, now: int) -> Outcome:
    """DeleteGroups' part here: only an Empty group may be deleted (the reply is an ErrorCode or None)."""
    if group is None or group.state is S.DEAD:
        return _finish(group, group, [], ErrorCode.GROUP_ID_NOT_FOUND)
    if group.state is not S.EMPTY:
        return _finish(group, group, [], ErrorCode.NON_EMPTY_GROUP)
    return _finish(group, rebalance.transition(group, S.DEAD, now), [], None)


def offset_delete(group: Group | None, topics: Iterable[str], with_offsets: bool) -> tuple[ErrorCode | None, frozenset[str]]:
    """OffsetDelete's part here, as Kafka decides it: the whole request's refusal, or the topics
    whose offsets stay because the group subscribes to them (each of their partitions is
    GROUP_SUBSCRIBED_TO_TOPIC). An Empty group, or one not held here but ``with_offsets``, keeps
    none; a group with neither members nor offsets is GROUP_ID_NOT_FOUND; one with members and
    another protocol than Kafka's consumer protocol is NON_EMPTY_GROUP. A member whose
    subscription does not decode is taken as subscribed to every topic, as Kafka takes it."""
    if group is None or group.state is S.DEAD:
        return (None if with_offsets else ErrorCode.GROUP_ID_NOT_FOUND), frozenset()
    if group.state is S.EMPTY:
        return None, frozenset()
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return ErrorCode.NON_EMPTY_GROUP, frozenset()
    asked = frozenset(topics)
    subscribed: set[str] = set()
    for member in group.members.values():
        try:
            subscribed.update(decode_subscription(member.metadata(group.protocol_name)).topics)
        except ConsumerProtocolError:
            return None, asked
    return None, asked & subscribed
