"""Kafka's consumer groups of the next-generation protocol (KIP-848, ConsumerGroupHeartbeat), as
pure functions over plain data, no I/O: the group's state, the heartbeat, leaving, the expiry of
sessions and rebalance timeouts, and the member-epoch checks of offset commits and fetches. The
server-side assignors are ``app.domain.groups.assignors``'s; what the members subscribe to,
``app.domain.groups.subscriptions``'s; ConsumerGroupDescribe's view of a group is
``app.domain.groups.consumer_group_describe``'s.

The coordinator alone decides who reads what. Every change of who is in the group, what they
subscribe to (topic names or a regular expression), which server assignor they ask for, or of the
subscribed topics' partitions bumps the *group epoch*; a heartbeat that finds the group epoch past
the *assignment epoch* computes the target assignment of every member with the group's assignor
(``uniform`` or ``range``: the one most members ask for, ``uniform`` when none asks) and moves the
assignment epoch up to the group epoch. Each member then moves from its current assignment to its
target at its own heartbeats, as Kafka's CurrentAssignmentBuilder moves it:

- partitions it owns that its target no longer holds are revoked first: the member keeps its epoch
  and is answered its assignment without them (``UNREVOKED``) until a heartbeat lists what it owns
  without them, and is fenced if that does not happen within its rebalance timeout;
- then its epoch becomes the assignment epoch and it is given the partitions of its target that no
  other member owns (assigned or still revoking); those still owned elsewhere are given at a later
  heartbeat, once released (``UNRELEASED``); a member owning exactly its target is ``STABLE``.

So no partition is ever owned by two members at once. Epoch 0 joins (a known member id rejoining
with 0 starts over), -1 leaves, -2 leaves a static member (``instance_id``) temporarily: it keeps
its assignment until its session ends, and a member rejoining with its instance id takes its place
and its assignment. A member that misses its session timeout is fenced as if it had left.

Each partition a member owns carries the epoch it was given at: an offset commit with an epoch
older than the member's is accepted for the partitions the member has owned since that epoch
(KIP-1251's assignment epochs), any other mismatch is STALE_MEMBER_EPOCH.

Time is passed in (``now_ms``). The topics are the caller's: a mapping of topic name to
``TopicMetadata`` of at least the names ``topics_needed`` lists (every topic when it says so).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Collection, Mapping, Sequence

from app.domain.groups.assignors import ASSIGNORS, assign
from app.domain.groups.subscriptions import compile_regex, member_topics, preferred_assignor, subscription_metadata
from app.domain.share_groups import NO_PARTITIONS, Assignment, HeartbeatAnswer, TopicMetadata, check_member_epoch, session_expired
from app.errors import ErrorCode, TxlogError

# The broker's defaults (Kafka's ``group.consumer.*``).
SESSION_TIMEOUT_MS = 45_000  # group.consumer.session.timeout.ms
HEARTBEAT_INTERVAL_MS = 5_000  # group.consumer.heartbeat.interval.ms

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2  # a static member leaving for a while, keeping its assignment
GROUP_TYPE = "consumer"  # ListGroups' group type of a group of this protocol
PROTOCOL_TYPE = "consumer"  # ListGroups' protocol type
EMPTY, ASSIGNING, RECONCILING, STABLE = "Empty", "Assigning", "Reconciling", "Stable"  # the group's states

# A member's states (Kafka's MemberState)
MEMBER_STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"

# The partitions a member owns, each with the epoch it was given at: topic id -> partition -> epoch.
OwnedPartitions = Mapping[uuid.UUID, Mapping[int, int]]


@dataclass(frozen=True)
class ConsumerGroupConfig:
    session_timeout_ms: int = SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    max_size: int | None = None  # group.consumer.max.size (None: no limit)


@dataclass(frozen=True)
class ConsumerMember:
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    state: str  # MEMBER_STABLE, UNREVOKED or UNRELEASED
    rebalance_timeout_ms: int
    subscribed_topic_names: frozenset[str]
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: OwnedPartitions  # what it was last answered it may read, with each partition's epoch
    pending_revocation: Assignment  # what it still has to give up
    session_deadline_ms: int
    rebalance_deadline_ms: int | None = None  # while revoking: fenced when still revoking then
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""

    @property
    def assignment(self) -> Assignment:
        return {t: frozenset(ps) for t, ps in self.owned.items() if ps}

    def holds(self) -> set[tuple[uuid.UUID, int]]:
        """Every partition the member owns or is still revoking."""
        return {(t, p) for t, ps in self.owned.items() for p in ps} | {
            (t, p) for t, ps in self.pending_revocation.items() for p in ps
        }

    def reconciled_to(self, epoch: int) -> bool:
        return self.state == MEMBER_STABLE and self.member_epoch == epoch


@dataclass(frozen=True)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0  # the epoch of ``target_assignment``
    members: Mapping[str, ConsumerMember] = field(default_factory=dict)
    # topic name -> metadata, for the subscribed topics that exist: a change of it bumps the epoch
    subscription_metadata: Mapping[str, TopicMetadata] = field(default_factory=dict)
    target_assignment: Mapping[str, Assignment] = field(default_factory=dict)
    # the topic catalogue's version its regular expressions were last matched against every topic
    # at (None: never); while the catalogue stays at it, the topics they match are those known
    topics_version: int | None = None

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        if not all(m.reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return RECONCILING
        return STABLE

    @property
    def assignor(self) -> str:
        return preferred_assignor(self.members.values())

    def by_instance(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)


@dataclass(frozen=True)
class HeartbeatRequest:
    """ConsumerGroupHeartbeat v0–1's fields, with the connection's client id and host. None (or
    -1 for the rebalance timeout) is "unchanged since the last heartbeat"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: Sequence[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None  # TopicPartitions: what the member owns now
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True)
class HeartbeatOutcome:
    group: ConsumerGroup  # the group as it becomes (to store)
    answer: HeartbeatAnswer


# -- the topics a heartbeat reads ----------------------------------------------------------------


def topics_needed(
    group: ConsumerGroup | None, request: HeartbeatRequest | None = None, topics_version: int | None = None
) -> frozenset[str] | None:
    """The topic names whose metadata ``heartbeat`` needs; None: every topic (a member subscribes
    by regular expression, and the topic catalogue is not at the version the group last matched
    its expressions at, ``topics_version`` being the catalogue's now, or the request brings an
    expression the group has not matched yet). While the catalogue stays at the group's version,
    the topics the expressions match are among those the group knows: a heartbeat then reads
    those, not every topic."""
    names: set[str] = set()
    members = {} if group is None else dict(group.members)
    member = None if request is None else members.get(request.member_id)
    matched = group is not None and topics_version is not None and group.topics_version == topics_version
    if request is not None and request.subscribed_topic_regex:
        if member is None or member.subscribed_topic_regex != request.subscribed_topic_regex or not matched:
            return None
    regex = False
    for m in members.values():
        replaced = request is not None and m.member_id == request.member_id
        if m.subscribed_topic_regex and not (replaced and request is not None and request.subscribed_topic_regex == ""):
            regex = True
        if not (replaced and request is not None and request.subscribed_topic_names is not None):
            names |= m.subscribed_topic_names
    if request is not None and request.subscribed_topic_names is not None:
        names |= set(request.subscribed_topic_names)
    if regex or (request is not None and request.subscribed_topic_regex):
        if not matched:
            return None
        assert group is not None
        names |= set(group.subscription_metadata)
    return frozenset(names)


def matched_at(group: ConsumerGroup, needed: frozenset[str] | None, topics_version: int | None) -> ConsumerGroup:
    """The group after a heartbeat or fencing that read the topics ``topics_needed`` asked for:
    its expressions matched against every topic at ``topics_version`` when it asked for every
    topic, else as it was."""
    if needed is not None or topics_version is None:
        return group
    return replace(group, topics_version=topics_version)


# -- the heartbeat -------------------------------------------------------------------------------


def validate_heartbeat(request: HeartbeatRequest) -> None:
    """Kafka's checks of a ConsumerGroupHeartbeat before it reaches the group (INVALID_REQUEST,
    UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, with Kafka's messages)."""
    if not request.member_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
    if not request.group_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
    if request.instance_id is not None and not request.instance_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "InstanceId can't be empty.")
    if request.rack_id is not None and not request.rack_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "RackId can't be empty.")
    if request.member_epoch == JOIN_EPOCH:
        if request.rebalance_timeout_ms == -1:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request.")
        if request.owned is None or any(request.owned.values()):
            raise TxlogError(ErrorCode.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise TxlogError(
                ErrorCode.INVALID_REQUEST, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif request.member_epoch == STATIC_LEAVE_EPOCH:
        if request.instance_id is None:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "InstanceId can't be null.")
    elif request.member_epoch < STATIC_LEAVE_EPOCH:
        raise TxlogError(
            ErrorCode.INVALID_REQUEST, f"MemberEpoch is {request.member_epoch}, but must be greater than or equal to -2."
        )
    if request.server_assignor is not None and request.server_assignor not in ASSIGNORS:
        raise TxlogError(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {request.server_assignor} is not supported. Supported assignors: {', '.join(ASSIGNORS)}.",
        )
    if request.subscribed_topic_regex:
        compile_regex(request.subscribed_topic_regex)


def _unknown(member_id: str, group_id: str) -> TxlogError:
    return TxlogError(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")


def _check_instance(holder: ConsumerMember | None, request: HeartbeatRequest) -> ConsumerMember:
    """The static member holding the request's instance id (``holder``), when it is the member the
    request is from: UNKNOWN_MEMBER_ID when no member holds it, FENCED_INSTANCE_ID when another does."""
    if holder is None:
        raise TxlogError(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {request.instance_id} is unknown.")
    if holder.member_id != request.member_id:
        raise TxlogError(
            ErrorCode.FENCED_INSTANCE_ID,
            f"Static member {request.member_id} with instance id {request.instance_id} was fenced by member {holder.member_id}.",
        )
    return holder


def _subset(owned: Assignment | None, of: Assignment) -> bool:
    return owned is not None and all(ps <= of.get(t, frozenset()) for t, ps in owned.items())


def heartbeat(
    group: ConsumerGroup | None,
    request: HeartbeatRequest,
    topics: Mapping[str, TopicMetadata],
    now_ms: int,
    config: ConsumerGroupConfig = ConsumerGroupConfig(),
) -> HeartbeatOutcome:
    """One ConsumerGroupHeartbeat on ``group`` (None: no such group yet): join (epoch 0),
    heartbeat, leave (-1) or leave for a while (-2, static members). ``topics``: the metadata of
    the existing topics among ``topics_needed`` (every topic when it says None). Raises
    ``TxlogError`` with Kafka's error and message when Kafka refuses the request."""
    validate_heartbeat(request)
    if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
        return _leave(group, request, topics, now_ms, config)
    joining = request.member_epoch == JOIN_EPOCH
    if group is None:
        if not joining:
            raise _unknown(request.member_id, request.group_id)
        group = ConsumerGroup(request.group_id)
    member, group = _member(group, request, topics, now_ms)
    if member is None:
        if config.max_size is not None and len(group.members) >= config.max_size:
            raise TxlogError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {config.max_size} members.",
            )
        member = ConsumerMember(
            request.member_id, JOIN_EPOCH, JOIN_EPOCH, MEMBER_STABLE, 0, frozenset(), None, None, {}, NO_PARTITIONS, now_ms
        )
    new_member = request.member_id not in group.members
    updated = replace(
        member,
        instance_id=request.instance_id if request.instance_id is not None else member.instance_id,
        rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms if request.rebalance_timeout_ms != -1 else member.rebalance_timeout_ms,
        subscribed_topic_names=(
            frozenset(request.subscribed_topic_names)
            if request.subscribed_topic_names is not None
            else member.subscribed_topic_names
        ),
        subscribed_topic_regex=(
            (request.subscribed_topic_regex or None)
            if request.subscribed_topic_regex is not None
            else member.subscribed_topic_regex
        ),
        server_assignor=request.server_assignor if request.server_assignor is not None else member.server_assignor,
        client_id=request.client_id,
        client_host=request.client_host,
        session_deadline_ms=now_ms + config.session_timeout_ms,
    )
    members = {**group.members, updated.member_id: updated}
    subscription = (updated.subscribed_topic_names, updated.subscribed_topic_regex, updated.server_assignor, updated.rack_id)
    bump = new_member or subscription != (
        member.subscribed_topic_names,
        member.subscribed_topic_regex,
        member.server_assignor,
        member.rack_id,
    )
    metadata = subscription_metadata(members.values(), topics)
    bump = bump or metadata != dict(group.subscription_metadata)
    group = replace(
        group, group_epoch=group.group_epoch + 1 if bump else group.group_epoch, members=members, subscription_metadata=metadata
    )
    group = with_target(group)
    reconciled = reconcile(group, updated, request.owned, now_ms)
    group = replace(group, members={**group.members, reconciled.member_id: reconciled})
    full = joining or (
        request.rebalance_timeout_ms != -1 and request.subscribed_topic_names is not None and request.owned is not None
    )
    changed = dict(reconciled.assignment) != dict(member.assignment)
    answer = HeartbeatAnswer(
        reconciled.member_id,
        reconciled.member_epoch,
        config.heartbeat_interval_ms,
        reconciled.assignment if full or changed else None,
    )
    return HeartbeatOutcome(group, answer)


def _member(
    group: ConsumerGroup, request: HeartbeatRequest, topics: Mapping[str, TopicMetadata], now_ms: int
) -> tuple[ConsumerMember | None, ConsumerGroup]:
    """The member the request is from (None: a new one), and the group it joins: without the
    member's former self when it rejoins (epoch 0) under a known id, and with a static member's new
    id in place of the old one when it takes its instance's place back."""
    joining = request.member_epoch == JOIN_EPOCH
    member = group.members.get(request.member_id)
    if request.instance_id is not None:
        holder = group.by_instance(request.instance_id)
        if joining:
            if holder is not None and holder.member_epoch == STATIC_LEAVE_EPOCH:
                # The instance comes back: the new member id takes the old one's place, assignment and
                # epoch; nothing else changes in the group.
                heir = replace(holder, member_id=request.member_id, member_epoch=holder.previous_member_epoch)
                members = {k: v for k, v in group.members.items() if k != holder.member_id}
                members[heir.member_id] = heir
                target = {k: v for k, v in group.target_assignment.items() if k != holder.member_id}
                target[heir.member_id] = group.target_assignment.get(holder.member_id, NO_PARTITIONS)
                return heir, replace(group, members=members, target_assignment=target)
            if holder is not None and holder.member_id != request.member_id:
                raise TxlogError(
                    ErrorCode.UNRELEASED_INSTANCE_ID,
                    f"Static member {request.member_id} with instance id {request.instance_id} cannot join the group "
                    f"because the instance id is owned by {holder.member_id} member.",
                )
        else:
            _check_instance(holder, request)
    if joining:
        if member is not None:
            # A member that lost its state (fenced, or restarted under the same id) starts over.
            group = remove_member(group, member.member_id, topics)
        return None, group
    if member is None:
        raise _unknown(request.member_id, group.group_id)
    check_member_epoch(
        "consumer",
        member.member_epoch,
        member.previous_member_epoch,
        request.member_epoch,
        retry_allowed=_subset(request.owned, member.assignment),
    )
    return member, group


def with_target(group: ConsumerGroup) -> ConsumerGroup:
    """The group with the target assignment of its epoch: computed when the group epoch is past
    the assignment epoch, by the group's assignor, else as it was."""
    if group.group_epoch <= group.assignment_epoch:
        return group
    live = {m.member_id: m for m in group.members.values()}
    subscriptions = {m.member_id: member_topics(m, group.subscription_metadata) for m in live.values()}
    instance_ids = {m.member_id: m.instance_id for m in live.values()}
    target = assign(group.assignor, subscriptions, group.subscription_metadata, group.target_assignment, instance_ids)
    return replace(group, target_assignment=target, assignment_epoch=group.group_epoch)


def reconcile(group: ConsumerGroup, member: ConsumerMember, owned: Assignment | None, now_ms: int) -> ConsumerMember:
    """The member one step nearer its target (Kafka's CurrentAssignmentBuilder): revocation first,
    then the new epoch with the partitions no other member holds. ``owned``: what the member said
    it owns (None: not said)."""
    epoch = group.assignment_epoch
    if member.state == UNREVOKED:
        pending = {(t, p) for t, ps in member.pending_revocation.items() for p in ps}
        said = set() if owned is None else {(t, p) for t, ps in owned.items() for p in ps}
        if owned is None or pending & said:
            return member  # still revoking
        member = replace(member, pending_revocation=NO_PARTITIONS, rebalance_deadline_ms=None)
    elif member.reconciled_to(epoch):
        return member
    target = group.target_assignment.get(member.member_id, NO_PARTITIONS)
    elsewhere: set[tuple[uuid.UUID, int]] = set()
    for other in group.members.values():
        if other.member_id != member.member_id:
            elsewhere |= other.holds()
    keep: dict[uuid.UUID, dict[int, int]] = {}
    revoke: dict[uuid.UUID, frozenset[int]] = {}
    for t, ps in member.owned.items():
        kept = {p: e for p, e in ps.items() if p in target.get(t, frozenset())}
        if kept:
            keep[t] = kept
        gone = frozenset(p for p in ps if p not in target.get(t, frozenset()))
        if gone:
            revoke[t] = gone
    if revoke:
        return replace(
            member,
            state=UNREVOKED,
            owned=keep,
            pending_revocation=revoke,
            rebalance_deadline_ms=now_ms + member.rebalance_timeout_ms,
        )
    unreleased = False
    for t, wanted in target.items():
        for p in sorted(wanted):
            if p in keep.get(t, {}):
                continue
            if (t, p) in elsewhere:
                unreleased = True
            else:
                keep.setdefault(t, {})[p] = epoch
    return replace(
        member,
        state=UNRELEASED if unreleased else MEMBER_STABLE,
        member_epoch=epoch,
        previous_member_epoch=member.member_epoch if member.member_epoch != epoch else member.previous_member_epoch,
        owned=keep,
        pending_revocation=NO_PARTITIONS,
        rebalance_deadline_ms=None,
    )


def _leave(
    group: ConsumerGroup | None,
    request: HeartbeatRequest,
    topics: Mapping[str, TopicMetadata],
    now_ms: int,
    config: ConsumerGroupConfig,
) -> HeartbeatOutcome:
    if group is None:
        raise TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {request.group_id} not found.")
    member = group.members.get(request.member_id)
    if request.instance_id is not None:
        member = _check_instance(group.by_instance(request.instance_id), request)
    if member is None:
        raise _unknown(request.member_id, group.group_id)
    if request.member_epoch == STATIC_LEAVE_EPOCH:
        # Gone for a while: the member keeps its assignment, and its place, until its session ends.
        away = replace(
            member,
            member_epoch=STATIC_LEAVE_EPOCH,
            previous_member_epoch=member.member_epoch if member.member_epoch >= 0 else member.previous_member_epoch,
            session_deadline_ms=now_ms + config.session_timeout_ms,
        )
        return HeartbeatOutcome(
            replace(group, members={**group.members, away.member_id: away}),
            HeartbeatAnswer(member.member_id, STATIC_LEAVE_EPOCH, 0),
        )
    return HeartbeatOutcome(remove_member(group, member.member_id, topics), HeartbeatAnswer(member.member_id, LEAVE_EPOCH, 0))


def remove_member(group: ConsumerGroup, member_id: str, topics: Mapping[str, TopicMetadata]) -> ConsumerGroup:
    """``group`` without the member (it left, or was fenced): its partitions are free at once, the
    group epoch is bumped (the next heartbeat of any member computes the new target)."""
    members = {k: v for k, v in group.members.items() if k != member_id}
    return replace(
        group,
        group_epoch=group.group_epoch + 1,
        members=members,
        subscription_metadata=subscription_metadata(members.values(), topics) if topics else dict(group.subscription_metadata),
        target_assignment={k: v for k, v in group.target_assignment.items() if k != member_id},
    )


def expired_members(group: ConsumerGroup, now_ms: int) -> list[str]:
    """The members to fence at ``now_ms``, ordered by id: their session ended, or they did not
    revoke within their rebalance timeout."""
    return sorted(
        m.member_id
        for m in group.members.values()
        if session_expired(m.session_deadline_ms, now_ms)
        or (m.state == UNREVOKED and m.rebalance_deadline_ms is not None and m.rebalance_deadline_ms <= now_ms)
    )


def next_deadline(group: ConsumerGroup) -> int | None:
    """The earliest deadline of the group's members (session or rebalance), None without members."""
    deadlines = [m.session_deadline_ms for m in group.members.values()]
    deadlines += [m.rebalance_deadline_ms for m in group.members.values() if m.rebalance_deadline_ms is not None]
    return min(deadlines) if deadlines else None


# -- offsets ---------------------------------------------------------------------------------------


def validate_offset_commit(
    group: ConsumerGroup,
    member_id: str,
    member_epoch: int,
    partitions: Collection[tuple[str, int]],
    transactional: bool,
    api_version: int,
) -> None:
    """May an OffsetCommit (``transactional``: a TxnOffsetCommit) of these partitions happen in the
    group? Kafka's ConsumerGroup.validateOffsetCommit, with KIP-1251's assignment epochs: an epoch
    older than the member's commits the partitions the member has owned since it."""
    if member_epoch < 0 and not group.members:
        return  # a simple consumer, or an admin client: the group has no members
    member = group.members.get(member_id)
    if member is None:
        raise _unknown(member_id, group.group_id)
    if not transactional and api_version < 9:
        raise TxlogError(
            ErrorCode.UNSUPPORTED_VERSION,
            "OffsetCommit version 9 or above must be used by members using the modern group protocol",
        )
    if member_epoch == member.member_epoch:
        return
    if 0 <= member_epoch < member.member_epoch:
        ids = {name: t.topic_id for name, t in group.subscription_metadata.items()}
        epochs = [member.owned.get(ids[t], {}).get(p) if t in ids else None for t, p in partitions]
        if all(e is not None and e <= member_epoch for e in epochs):
            return
    raise TxlogError(
        ErrorCode.STALE_MEMBER_EPOCH,
        f"The received member epoch {member_epoch} does not match the expected member epoch {member.member_epoch}.",
    )


def validate_offset_fetch(group: ConsumerGroup, member_id: str | None, member_epoch: int) -> None:
    """May an OffsetFetch (v9+, which names the member) read the group's offsets? Anyone who names
    no member; a member only with its current epoch."""
    if not member_id and member_epoch < 0:
        return
    member = group.members.get(member_id or "")
    if member is None:
        raise _unknown(member_id or "", group.group_id)
    if member_epoch != member.member_epoch:
        raise TxlogError(
            ErrorCode.STALE_MEMBER_EPOCH,
            f"The received member epoch {member_epoch} does not match the expected member epoch {member.member_epoch}.",
        )
