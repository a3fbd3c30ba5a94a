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
from typing import Any, Iterable, Sequence

from app.domain.consumer_protocol import CONSUMER_PROTOCOL_TYPE, ConsumerProtocolError, decode_subscription
from app.domain.groups.state import (
    VALID_PREVIOUS,
    AnswerJoin,
    AnswerSync,
    ArmTimer,
    CancelTimer,
    Effect,
    Group,
    GroupConfig,
    GroupState,
    JoinedMember,
    JoinRequest,
    JoinResult,
    LeaveAnswer,
    LeftMember,
    Member,
    Outcome,
    Park,
    Protocols,
    S,
    SyncRequest,
    SyncResult,
    Timer,
    TimerKind,
    Waiting,
    check_transition,
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


def join_error(member_id: str, error: ErrorCode) -> JoinResult:
    return JoinResult(error, member_id)


def sync_error(error: ErrorCode) -> SyncResult:
    return SyncResult(error)


# --- small steps over a group; ``fx`` collects the effects of the one event being computed ----------


def _transition(group: Group, to: GroupState, now: int, **changes: Any) -> Group:
    check_transition(group.state, to)
    return dataclasses.replace(group, state=to, state_since_ms=now, **changes)


def _put(group: Group, member: Member) -> Group:
    return dataclasses.replace(group, members={**group.members, member.member_id: member})


def _alive(member: Member, now: int) -> Member:
    """A heartbeat's effect: the session starts again."""
    return dataclasses.replace(member, session_deadline_ms=now + member.session_timeout_ms)


def _current_join_result(group: Group, member_id: str) -> JoinResult:
    leader = group.leader_id == member_id
    members = tuple(
        JoinedMember(m.member_id, m.group_instance_id, m.metadata(group.protocol_name)) for m in group.members.values()
    )
    return JoinResult(
        None,
        member_id,
        group.generation_id,
        group.protocol_type,
        group.protocol_name,
        group.leader_id or "",
        False,
        members if leader else (),
    )


def _answer(group: Group, member_id: str, join: JoinResult | None, sync: SyncResult | None, now: int, fx: list[Effect]) -> Group:
    """Answers the member's parked request (with ``join`` or ``sync`` by what it waits for); its
    session starts again."""
    member = group.members[member_id]
    if member.waiting is Waiting.JOIN:
        fx.append(AnswerJoin(member_id, join or join_error(member_id, ErrorCode.REBALANCE_IN_PROGRESS)))
    elif member.waiting is Waiting.SYNC:
        fx.append(AnswerSync(member_id, sync or sync_error(ErrorCode.REBALANCE_IN_PROGRESS)))
    else:
        return group
    return _put(group, dataclasses.replace(_alive(member, now), waiting=None))


def _park(group: Group, member_id: str, waiting: Waiting, now: int, fx: list[Effect]) -> Group:
    """The caller's request waits. A request the member still had parked is answered first
    (REBALANCE_IN_PROGRESS: it rejoins), so no client is left without an answer."""
    group = _answer(group, member_id, None, None, now, fx)
    fx.append(Park(member_id, waiting))
    return _put(group, dataclasses.replace(group.members[member_id], waiting=waiting))


def _remove(group: Group, member_id: str, fx: list[Effect]) -> Group:
    """Removes a member; its parked request is answered UNKNOWN_MEMBER_ID (it rejoins if alive)."""
    member = group.members.get(member_id)
    if member is not None and member.waiting is Waiting.JOIN:
        fx.append(AnswerJoin(member_id, join_error("", ErrorCode.UNKNOWN_MEMBER_ID)))
    elif member is not None and member.waiting is Waiting.SYNC:
        fx.append(AnswerSync(member_id, sync_error(ErrorCode.UNKNOWN_MEMBER_ID)))
    members = {mid: m for mid, m in group.members.items() if mid != member_id}
    leader = group.leader_id if group.leader_id != member_id else next(iter(members), None)
    pending_sync = group.pending_sync - {member_id}
    return dataclasses.replace(
        group,
        members=members,
        leader_id=leader,
        pending_members={mid: d for mid, d in group.pending_members.items() if mid != member_id},
        pending_sync=pending_sync,
        sync_deadline_ms=group.sync_deadline_ms if pending_sync else None,
    )


def candidate_protocols(group: Group, excluding: str | None = None) -> list[str] | None:
    """Protocol names every member (but ``excluding``) supports, in the first such member's order;
    None when there is no such member (anything goes)."""
    others = [m for m in group.members.values() if m.member_id != excluding]
    if not others:
        return None
    return [name for name, _ in others[0].protocols if all(any(n == name for n, _ in m.protocols) for m in others[1:])]


def supports_protocols(group: Group, protocol_type: str, protocols: Protocols, excluding: str | None = None) -> bool:
    """Whether a member of this protocol type and protocols may join (Kafka's supportsProtocols): the
    first member needs a protocol type and at least one protocol; later ones the group's type and one
    protocol every other member supports."""
    if not protocol_type or not protocols:
        return False
    if not group.members:
        return True
    if protocol_type != group.protocol_type:
        return False
    candidates = candidate_protocols(group, excluding)
    return candidates is None or any(name in candidates for name, _ in protocols)


def select_protocol(group: Group) -> str:
    """Each member votes for the first of its protocols that all members support; the most votes win
    (a tie goes to the protocol voted first, in joining order)."""
    candidates = candidate_protocols(group) or []
    votes: dict[str, int] = {}
    for m in group.members.values():
        vote = next(name for name, _ in m.protocols if name in candidates)
        votes[vote] = votes.get(vote, 0) + 1
    return max(votes, key=lambda name: votes[name])


def _maybe_prepare_rebalance(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    if group.state in VALID_PREVIOUS[S.PREPARING_REBALANCE]:
        return _prepare_rebalance(group, now, config, fx)
    return group


def _prepare_rebalance(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    """A join phase starts. Members waiting for an assignment (CompletingRebalance) are told to
    rejoin; an Empty group's first phase waits group.initial.rebalance.delay.ms for more members, any
    other phase ends when all members have rejoined or at the rebalance timeout (the longest of the
    members')."""
    for mid, m in list(group.members.items()):
        if m.waiting is Waiting.SYNC:
            group = _answer(group, mid, None, sync_error(ErrorCode.REBALANCE_IN_PROGRESS), now, fx)
    rebalance_timeout = group.rebalance_timeout_ms
    delayed = group.state is S.EMPTY and config.initial_rebalance_delay_ms > 0
    group = _transition(
        group,
        S.PREPARING_REBALANCE,
        now,
        pending_sync=frozenset(),
        sync_deadline_ms=None,
        new_member_added=False,
        join_deadline_ms=now + (config.initial_rebalance_delay_ms if delayed else rebalance_timeout),
        initial_delay_remaining_ms=max(rebalance_timeout - config.initial_rebalance_delay_ms, 0) if delayed else None,
    )
    return _try_complete_join(group, now, config, fx)


def _try_complete_join(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    if group.state is S.PREPARING_REBALANCE and group.initial_delay_remaining_ms is None and group.all_joined:
        return _complete_join(group, now, config, fx)
    return group


def _complete_join(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    """The join phase ends (Kafka's onCompleteJoin): dynamic members that did not rejoin are removed
    (static ones stay until their session ends), the next generation starts — once per join phase —
    without assignments yet, and every waiting JoinGroup is answered, the leader's with the members
    and their metadata."""
    for m in list(group.members.values()):
        if m.waiting is not Waiting.JOIN and m.group_instance_id is None:
            group = _remove(group, m.member_id, fx)
    if group.members and group.members[group.leader_id].waiting is not Waiting.JOIN:  # type: ignore[index]  # a group with members has a leader
        joined = next((mid for mid, m in group.members.items() if m.waiting is Waiting.JOIN), None)
        if joined is None:
            # Only static members that have not rejoined: wait another rebalance timeout for them
            # (their sessions end meanwhile if they are gone).
            return dataclasses.replace(group, join_deadline_ms=now + group.rebalance_timeout_ms, initial_delay_remaining_ms=None)
        group = dataclasses.replace(group, leader_id=joined)
    phase_end = dict(join_deadline_ms=None, initial_delay_remaining_ms=None, new_member_added=False)
    if not group.members:
        return _transition(group, S.EMPTY, now, generation_id=group.generation_id + 1, protocol_name=None, **phase_end)
    group = _transition(
        group,
        S.COMPLETING_REBALANCE,
        now,
        generation_id=group.generation_id + 1,
        protocol_name=select_protocol(group),
        pending_sync=frozenset(group.members),
        sync_deadline_ms=now + group.rebalance_timeout_ms,
        **phase_end,
    )
    for mid in list(group.members):
        group = _answer(group, mid, _current_join_result(group, mid), None, now, fx)
        group = _put(group, dataclasses.replace(_alive(group.members[mid], now), is_new=False, assignment=b""))
    return group


def validate_member(group: Group, member_id: str, group_instance_id: str | None) -> ErrorCode | None:
    """Kafka's validateCurrentMember: an instance id must be the group's and name this member id
    (else FENCED_INSTANCE_ID: a newer instance took over), and the member id must be a member."""
    if group_instance_id is not None:
        current = group.static_member_id(group_instance_id)
        if current is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if current != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
    if member_id not in group.members:
        return ErrorCode.UNKNOWN_MEMBER_ID
    return None


def _accepts_member(group: Group, r: JoinRequest, config: GroupConfig) -> bool:
    """group.max.size: new members are accepted up to it (counting the rejoined ones while rebalancing,
    so that the last to rejoin are left out if the limit was lowered). Requests that add no member
    pass: a known static instance joining without a member id replaces itself, and a member id that
    is neither a member nor pending is refused by the member checks (UNKNOWN_MEMBER_ID, or
    FENCED_INSTANCE_ID for a fenced instance)."""
    if config.max_size is None or group.state in (S.EMPTY, S.DEAD):
        return True
    if not r.member_id and group.static_member_id(r.group_instance_id) is not None:
        return True
    if r.member_id and r.member_id not in group.members and r.member_id not in group.pending_members:
        return True
    member = group.members.get(r.member_id)
    if group.state is S.PREPARING_REBALANCE:
        waiting = sum(1 for m in group.members.values() if m.waiting is Waiting.JOIN)
        return (member is not None and member.waiting is Waiting.JOIN) or waiting < config.max_size
    return member is not None or len(group.members) < config.max_size


def _remove_and_update(group: Group, member_id: str, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    """A member leaves or its session ends: a settled group rebalances, a joining one may now be
    complete."""
    group = _remove(group, member_id, fx)
    if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
        return _maybe_prepare_rebalance(group, now, config, fx)
    return _try_complete_join(group, now, config, fx)


def _add_member_and_rebalance(
    group: Group, member_id: str, r: JoinRequest, now: int, config: GroupConfig, fx: list[Effect]
) -> Group:
    member = Member(
        member_id,
        r.group_instance_id,
        r.client_id,
        r.client_host,
        r.session_timeout_ms,
        r.rebalance_timeout_ms,
        r.protocols,
        session_deadline_ms=now + config.new_member_join_timeout_ms,
        waiting=Waiting.JOIN,
        is_new=True,
    )
    group = dataclasses.replace(
        group,
        protocol_type=group.protocol_type if group.members else r.protocol_type,
        leader_id=group.leader_id or member_id,
        members={**group.members, member_id: member},
        pending_members={mid: d for mid, d in group.pending_members.items() if mid != member_id},
        # Only the first join phase of a new group waits longer for each new member.
        new_member_added=group.new_member_added or (group.state is S.PREPARING_REBALANCE and group.generation_id == 0),
    )
    fx.append(Park(member_id, Waiting.JOIN))
    return _maybe_prepare_rebalance(group, now, config, fx)


def _update_member_and_rebalance(group: Group, r: JoinRequest, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    member = dataclasses.replace(
        group.members[r.member_id],
        protocols=r.protocols,
        client_id=r.client_id,
        client_host=r.client_host,
        session_timeout_ms=r.session_timeout_ms,
        rebalance_timeout_ms=r.rebalance_timeout_ms,
    )
    group = _park(_put(group, member), r.member_id, Waiting.JOIN, now, fx)
    return _maybe_prepare_rebalance(group, now, config, fx)


def _replace_static_member(
    group: Group, old_id: str, new_id: str, r: JoinRequest, now: int, config: GroupConfig, fx: list[Effect]
) -> Group:
    """A known group.instance.id joins without a member id (the instance restarted): it takes over the
    member under a new member id, and the old id is fenced — its parked request is answered
    FENCED_INSTANCE_ID, and so is anything it sends later with its instance id. A Stable group whose
    chosen protocol stays the same does not rebalance: the member gets the current generation and
    keeps its assignment. It is not told it leads (the leader id given is the one before), so it does
    not run an assignment the Stable group would never deliver — unless it understands
    skip_assignment (JoinGroup v9+)."""
    old = group.members[old_id]
    if old.waiting is Waiting.JOIN:
        fx.append(AnswerJoin(old_id, join_error(old_id, ErrorCode.FENCED_INSTANCE_ID)))
    elif old.waiting is Waiting.SYNC:
        fx.append(AnswerSync(old_id, sync_error(ErrorCode.FENCED_INSTANCE_ID)))
    member = dataclasses.replace(
        old,
        member_id=new_id,
        client_id=r.client_id,
        client_host=r.client_host,
        protocols=r.protocols,
        session_timeout_ms=r.session_timeout_ms,
        rebalance_timeout_ms=r.rebalance_timeout_ms,
        session_deadline_ms=now + r.session_timeout_ms,
        waiting=Waiting.JOIN,
    )
    previous_leader = group.leader_id
    group = dataclasses.replace(
        group,
        members={(new_id if mid == old_id else mid): (member if mid == old_id else m) for mid, m in group.members.items()},
        leader_id=new_id if previous_leader == old_id else previous_leader,
        pending_sync=(group.pending_sync - {old_id}) | {new_id} if old_id in group.pending_sync else group.pending_sync,
    )
    fx.append(Park(new_id, Waiting.JOIN))
    if group.state is S.STABLE:
        if select_protocol(group) != group.protocol_name:
            return _maybe_prepare_rebalance(group, now, config, fx)
        result = _current_join_result(group, new_id)
        if result.members and r.supports_skip_assignment:
            result = dataclasses.replace(result, skip_assignment=True)
        else:
            result = dataclasses.replace(result, leader_id=previous_leader or "", members=())
        return _answer(group, new_id, result, None, now, fx)
    if group.state is S.COMPLETING_REBALANCE:
        # The leader may be assigning for the old member id: start again.
        return _prepare_rebalance(group, now, config, fx)
    return group  # PreparingRebalance: it waits with the others


def _join_new_member(
    group: Group, r: JoinRequest, member_id: str, now: int, config: GroupConfig, fx: list[Effect]
) -> tuple[Group, JoinResult | None]:
    previous = group.static_member_id(r.group_instance_id)
    if not supports_protocols(group, r.protocol_type, r.protocols, excluding=previous):
        return group, join_error("", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    if previous is not None:
        return _replace_static_member(group, previous, member_id, r, now, config, fx), None
    if r.group_instance_id is None and r.require_known_member_id:
        # JoinGroup v4+: the member comes back with this id (or its session ends, see ``timers``).
        pending = {**group.pending_members, member_id: now + r.session_timeout_ms}
        return dataclasses.replace(group, pending_members=pending), join_error(member_id, ErrorCode.MEMBER_ID_REQUIRED)
    return _add_member_and_rebalance(group, member_id, r, now, config, fx), None


def _join_known_member(
    group: Group, r: JoinRequest, now: int, config: GroupConfig, fx: list[Effect]
) -> tuple[Group, JoinResult | None]:
    if not supports_protocols(group, r.protocol_type, r.protocols, excluding=r.member_id):
        return group, join_error(r.member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    if r.member_id in group.pending_members and r.group_instance_id is None:
        return _add_member_and_rebalance(group, r.member_id, r, now, config, fx), None
    error = validate_member(group, r.member_id, r.group_instance_id)
    if error is not None:
        return group, join_error(r.member_id, error)
    unchanged = group.members[r.member_id].protocols == r.protocols
    if group.state is S.COMPLETING_REBALANCE and unchanged:
        # It missed its JoinGroup answer: the same answer again.
        return group, _current_join_result(group, r.member_id)
    if group.state is S.STABLE and unchanged and group.leader_id != r.member_id:
        return group, _current_join_result(group, r.member_id)
    # Changed metadata, or the leader (it rejoins to have the assignment run again, e.g. when topics
    # changed), or a join phase under way.
    return _update_member_and_rebalance(group, r, now, config, fx), None


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
    if not _accepts_member(start, r, config):
        g = _remove(start, r.member_id, fx) if r.member_id in start.members else start
        reply = join_error("", ErrorCode.GROUP_MAX_SIZE_REACHED)
    elif not r.member_id:
        g, reply = _join_new_member(start, r, new_member_id(r.client_id, r.group_instance_id, unique), now, config, fx)
    else:
        g, reply = _join_known_member(start, r, now, config, fx)
    g = _try_complete_join(g, now, config, fx)
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
    error = validate_member(group, r.member_id, r.group_instance_id)
    if error is not None:
        return refuse(error)
    if r.generation_id != group.generation_id:
        return refuse(ErrorCode.ILLEGAL_GENERATION)
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
        member = _alive(g.members[r.member_id], now)
        return _finish(group, _put(g, member), fx, SyncResult(None, g.protocol_type, g.protocol_name, member.assignment))
    g = _park(g, r.member_id, Waiting.SYNC, now, fx)
    if g.leader_id == r.member_id:
        given = dict(r.assignments)  # a member named twice keeps its last assignment
        for mid, m in list(g.members.items()):
            g = _put(g, dataclasses.replace(m, assignment=given.get(mid, b"")))
        g = _transition(g, S.STABLE, now)
        for mid, m in list(g.members.items()):
            if m.waiting is Waiting.SYNC:
                g = _answer(g, mid, None, SyncResult(None, g.protocol_type, g.protocol_name, m.assignment), now, fx)
    return _finish(group, g, fx)


def heartbeat(group: Group | None, generation_id: int, member_id: str, group_instance_id: str | None, now: int) -> Outcome:
    """Heartbeat: the reply is an ErrorCode or None. REBALANCE_IN_PROGRESS tells a member to rejoin."""
    if group is None:
        return _finish(group, group, [], ErrorCode.UNKNOWN_MEMBER_ID)
    if group.state is S.DEAD:
        return _finish(group, group, [], ErrorCode.COORDINATOR_NOT_AVAILABLE)
    error = validate_member(group, member_id, group_instance_id)  # an Empty group has no members
    if error is None and generation_id != group.generation_id:
        error = ErrorCode.ILLEGAL_GENERATION
    if error is not None:
        return _finish(group, group, [], error)
    g = _put(group, _alive(group.members[member_id], now))
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
                g = _remove_and_update(g, current, now, config, fx)
        elif mid in g.pending_members:
            g = _try_complete_join(_remove(g, mid, fx), now, config, fx)
        else:
            error = validate_member(g, mid, iid)
            if error is None:
                g = _remove_and_update(g, mid, now, config, fx)
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
            g = _try_complete_join(_remove(g, mid, fx), now, config, fx)
        elif member is not None and not member.kept_alive and member.session_deadline_ms <= now:
            g = _remove_and_update(g, mid, now, config, fx)
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
                g = _complete_join(g, now, config, fx)
    elif timer.kind is TimerKind.SYNC:
        if (
            g.state in (S.COMPLETING_REBALANCE, S.STABLE)
            and g.pending_sync
            and g.sync_deadline_ms is not None
            and g.sync_deadline_ms <= now
        ):
            for mid in [mid for mid in g.members if mid in g.pending_sync]:
                g = _remove(g, mid, fx)
            g = _prepare_rebalance(g, now, config, fx)
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
        error = validate_member(group, member_id, group_instance_id)
        if error is None and generation_id != group.generation_id:
            error = ErrorCode.ILLEGAL_GENERATION
    elif not transactional and group.state is not S.EMPTY:
        error = ErrorCode.UNKNOWN_MEMBER_ID
    if error is None and not transactional and group.state is S.COMPLETING_REBALANCE:
        error = ErrorCode.REBALANCE_IN_PROGRESS
    g = group
    if error is None and not transactional and member_id in g.members and g.state in (S.STABLE, S.PREPARING_REBALANCE):
        g = _put(g, _alive(g.members[member_id], now))
    return _finish(group, g, [], error)


def unload(group: Group, now: int) -> Outcome:
    """The coordinator stops coordinating this group (it shuts down, or the group moved to another
    gateway): every parked request is answered NOT_COORDINATOR, so clients look for the coordinator
    again, and the group is Dead."""
    fx: list[Effect] = []
    g = group
    for mid, m in list(g.members.items()):
        if m.waiting is Waiting.JOIN:
            fx.append(AnswerJoin(mid, join_error(mid, ErrorCode.NOT_COORDINATOR)))
        elif m.waiting is Waiting.SYNC:
            fx.append(AnswerSync(mid, sync_error(ErrorCode.NOT_COORDINATOR)))
        g = _put(g, dataclasses.replace(m, waiting=None))
    return _finish(group, _transition(g, S.DEAD, now), fx)


def delete(group: Group | None, now: int) -> Outcome:
    """DeleteGroups' part here: only an Empty group may be deleted (the reply is an ErrorCode or None)."""
    if group is None or group.state is S.DEAD:
        return _finish(group, group, [], ErrorCode.GROUP_ID_NOT_FOUND)
    if group.state is not S.EMPTY:
        return _finish(group, group, [], ErrorCode.NON_EMPTY_GROUP)
    return _finish(group, _transition(group, S.DEAD, now), [], None)


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
