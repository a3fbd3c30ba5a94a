"""The join and sync phases of Kafka's classic group coordinator, step by step, as pure functions.

Each step takes the group as it is and answers the group as it becomes; ``fx`` collects the effects
of the one event being computed (``coordinator``'s events call these steps and finish the
``Outcome``). Here: the small steps over a group (a state transition, a member put, kept alive,
answered, parked or removed), the choice of the group's protocol, the join phase from its start
(``prepare_rebalance``) to its end (``complete_join``), and the members a JoinGroup adds, updates or
replaces.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from app.domain.groups.state import (
    VALID_PREVIOUS,
    AnswerJoin,
    AnswerSync,
    Effect,
    Group,
    GroupConfig,
    GroupState,
    JoinedMember,
    JoinRequest,
    JoinResult,
    Member,
    Park,
    Protocols,
    S,
    SyncResult,
    Waiting,
    check_transition,
    join_error,
    sync_error,
)
from app.errors import ErrorCode

# --- small steps over a group; ``fx`` collects the effects of the one event being computed ----------


def transition(group: Group, to: GroupState, now: int, **changes: Any) -> Group:
    check_transition(group.state, to)
    return dataclasses.replace(group, state=to, state_since_ms=now, **changes)


def put(group: Group, member: Member) -> Group:
    return dataclasses.replace(group, members={**group.members, member.member_id: member})


def alive(member: Member, now: int) -> Member:
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


def answer(group: Group, member_id: str, join: JoinResult | None, sync: SyncResult | None, now: int, fx: list[Effect]) -> Group:
    """Answers the member's parked request (with ``join`` or ``sync`` by what it waits for); its
    session starts again."""
    member = group.members[member_id]
    if member.waiting is Waiting.JOIN:
        fx.append(AnswerJoin(member_id, join or join_error(member_id, ErrorCode.REBALANCE_IN_PROGRESS)))
    elif member.waiting is Waiting.SYNC:
        fx.append(AnswerSync(member_id, sync or sync_error(ErrorCode.REBALANCE_IN_PROGRESS)))
    else:
        return group
    return put(group, dataclasses.replace(alive(member, now), waiting=None))


def refuse_parked(member: Member, error: ErrorCode, fx: list[Effect], named: str | None = None) -> None:
    """Answers the member's parked JoinGroup or SyncGroup, if it has one, with ``error``; a JoinGroup
    answer names ``named`` (by default the member's own id). The member keeps its ``waiting``: the
    caller removes, replaces or unloads it."""
    if member.waiting is Waiting.JOIN:
        fx.append(AnswerJoin(member.member_id, join_error(member.member_id if named is None else named, error)))
    elif member.waiting is Waiting.SYNC:
        fx.append(AnswerSync(member.member_id, sync_error(error)))


def park(group: Group, member_id: str, waiting: Waiting, now: int, fx: list[Effect]) -> Group:
    """The caller's request waits. A request the member still had parked is answered first
    (REBALANCE_IN_PROGRESS: it rejoins), so no client is left without an answer."""
    group = answer(group, member_id, None, None, now, fx)
    fx.append(Park(member_id, waiting))
    return put(group, dataclasses.replace(group.members[member_id], waiting=waiting))


def remove(group: Group, member_id: str, fx: list[Effect]) -> Group:
    """Removes a member; its parked request is answered UNKNOWN_MEMBER_ID (it rejoins if alive)."""
    member = group.members.get(member_id)
    if member is not None:
        refuse_parked(member, ErrorCode.UNKNOWN_MEMBER_ID, fx, named="")
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
        return prepare_rebalance(group, now, config, fx)
    return group


def prepare_rebalance(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    """A join phase starts. Members waiting for an assignment (CompletingRebalance) are told to
    rejoin; an Empty group's first phase waits group.initial.rebalance.delay.ms for more members, any
    other phase ends when all members have rejoined or at the rebalance timeout (the longest of the
    members')."""
    for mid, m in list(group.members.items()):
        if m.waiting is Waiting.SYNC:
            group = answer(group, mid, None, sync_error(ErrorCode.REBALANCE_IN_PROGRESS), now, fx)
    rebalance_timeout = group.rebalance_timeout_ms
    delayed = group.state is S.EMPTY and config.initial_rebalance_delay_ms > 0
    group = transition(
        group,
        S.PREPARING_REBALANCE,
        now,
        pending_sync=frozenset(),
        sync_deadline_ms=None,
        new_member_added=False,
        join_deadline_ms=now + (config.initial_rebalance_delay_ms if delayed else rebalance_timeout),
        initial_delay_remaining_ms=max(rebalance_timeout - config.initial_rebalance_delay_ms, 0) if delayed else None,
    )
    return try_complete_join(group, now, config, fx)


def try_complete_join(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    if group.state is S.PREPARING_REBALANCE and group.initial_delay_remaining_ms is None and group.all_joined:
        return complete_join(group, now, config, fx)
    return group


def complete_join(group: Group, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    """The join phase ends (Kafka's onCompleteJoin): dynamic members that did not rejoin are removed
    (static ones stay until their session ends), the next generation starts — once per join phase —
    without assignments yet, and every waiting JoinGroup is answered, the leader's with the members
    and their metadata."""
    for m in list(group.members.values()):
        if m.waiting is not Waiting.JOIN and m.group_instance_id is None:
            group = remove(group, m.member_id, fx)
    if group.members and group.members[group.leader_id].waiting is not Waiting.JOIN:  # type: ignore[index]  # a group with members has a leader
        joined = next((mid for mid, m in group.members.items() if m.waiting is Waiting.JOIN), None)
        if joined is None:
            # Only static members that have not rejoined: wait another rebalance timeout for them
            # (their sessions end meanwhile if they are gone).
            return dataclasses.replace(group, join_deadline_ms=now + group.rebalance_timeout_ms, initial_delay_remaining_ms=None)
        group = dataclasses.replace(group, leader_id=joined)
    phase_end = dict(join_deadline_ms=None, initial_delay_remaining_ms=None, new_member_added=False)
    if not group.members:
        return transition(group, S.EMPTY, now, generation_id=group.generation_id + 1, protocol_name=None, **phase_end)
    group = transition(
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
        group = answer(group, mid, _current_join_result(group, mid), None, now, fx)
        group = put(group, dataclasses.replace(alive(group.members[mid], now), is_new=False, assignment=b""))
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


def accepts_member(group: Group, r: JoinRequest, config: GroupConfig) -> bool:
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


def remove_and_update(group: Group, member_id: str, now: int, config: GroupConfig, fx: list[Effect]) -> Group:
    """A member leaves or its session ends: a settled group rebalances, a joining one may now be
    complete."""
    group = remove(group, member_id, fx)
    if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
        return _maybe_prepare_rebalance(group, now, config, fx)
    return try_complete_join(group, now, config, fx)


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
    group = park(put(group, member), r.member_id, Waiting.JOIN, now, fx)
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
    refuse_parked(old, ErrorCode.FENCED_INSTANCE_ID, fx)
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
        return answer(group, new_id, result, None, now, fx)
    if group.state is S.COMPLETING_REBALANCE:
        # The leader may be assigning for the old member id: start again.
        return prepare_rebalance(group, now, config, fx)
    return group  # PreparingRebalance: it waits with the others


def join_new_member(
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


def join_known_member(
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
