"""Kafka's share groups (KIP-932): membership and assignment as Kafka 4.2's group coordinator runs
them for ShareGroupHeartbeat, as pure functions over plain data, no I/O.

A share group has no rebalance protocol: the coordinator alone decides who may fetch what. Members
heartbeat (ShareGroupHeartbeat v1); every change of who is in the group, what they subscribe to or
how many partitions the subscribed topics have bumps the *group epoch*; a heartbeat that finds the
group epoch past the *assignment epoch* recomputes the target assignment of every member with the
``simple`` assignor and moves the assignment epoch up to the group epoch; each member takes its
target at its next heartbeat, its *member epoch* becoming the assignment epoch (no revocation
phase: a share partition may be fetched by several members at once, the records themselves are
what is shared out, by the delivery state machine).

- Member ids: since v1 (KIP-1082) the member generates its id (a UUID, written as Kafka writes its
  ``Uuid``: 22 characters of URL-safe base64) and sends it from its first heartbeat on; the
  coordinator only refuses an empty one. Epoch 0 joins, -1 leaves; an epoch ahead of the member's,
  or behind it and not its previous one (the answer that bumped it may have been lost), is fenced.
- A member that does not heartbeat within the session timeout is fenced as if it had left.
- ``assign`` is Kafka's ``SimpleAssignor``: every partition of a subscribed topic is assigned to at
  least one member subscribed to it; with more members than partitions each partition is shared by
  ceil(members / partitions) of them, with fewer each member gets an equal share (give or take
  one); sticky to the previous target where that keeps the balance.

Time is passed in (``now_ms``), so nothing here reads a clock. The topics are the caller's: a
mapping of topic name to ``TopicMetadata`` holding at least the names ``topics_needed`` lists.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Collection, Iterable, Mapping, Sequence

from app.errors import ErrorCode, TxlogError

# The broker's defaults (Kafka's ``group.share.*``); a group's own ``share.session.timeout.ms`` and
# ``share.heartbeat.interval.ms`` (GroupConfig, ``app.domain.share_configs``, which takes its
# defaults and bounds from here) override the first two, within the bounds below.
SESSION_TIMEOUT_MS = 45_000  # group.share.session.timeout.ms
MIN_SESSION_TIMEOUT_MS, MAX_SESSION_TIMEOUT_MS = 45_000, 60_000  # group.share.{min,max}.session.timeout.ms
HEARTBEAT_INTERVAL_MS = 5_000  # group.share.heartbeat.interval.ms
MIN_HEARTBEAT_INTERVAL_MS, MAX_HEARTBEAT_INTERVAL_MS = 5_000, 15_000  # group.share.{min,max}.heartbeat.interval.ms
MAX_SIZE = 200  # group.share.max.size

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
ASSIGNOR_NAME = "simple"
GROUP_TYPE = "share"  # ListGroups' group type (its types filter matches it case-insensitively)
PROTOCOL_TYPE = "share"  # ListGroups' protocol type of a share group
EMPTY, STABLE = "Empty", "Stable"  # a share group's states, as Kafka names them

# A member's partitions: topic id -> partition indexes. Built by the functions here, never mutated.
Assignment = Mapping[uuid.UUID, frozenset[int]]
NO_PARTITIONS: Assignment = {}


@dataclass(frozen=True)
class TopicMetadata:
    """What the group knows of a subscribed topic (Kafka's subscription metadata)."""

    name: str
    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True)
class ShareGroupConfig:
    """A group's effective settings: the broker's defaults unless the group sets its own."""

    session_timeout_ms: int = SESSION_TIMEOUT_MS
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS
    max_size: int = MAX_SIZE


@dataclass(frozen=True)
class ShareMember:
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    subscribed_topic_names: frozenset[str]
    assignment: Assignment  # what the member was last answered it may fetch
    session_deadline_ms: int  # fenced when no heartbeat arrives before this
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True)
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0  # the epoch of ``target_assignment``
    members: Mapping[str, ShareMember] = field(default_factory=dict)
    # topic name -> metadata, for the subscribed topics that exist: a change of it bumps the epoch
    subscription_metadata: Mapping[str, TopicMetadata] = field(default_factory=dict)
    target_assignment: Mapping[str, Assignment] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return STABLE if self.members else EMPTY


@dataclass(frozen=True)
class HeartbeatRequest:
    """ShareGroupHeartbeat v1's fields, with the connection's client id and host."""

    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None  # None: unchanged
    subscribed_topic_names: Sequence[str] | None = None  # None: unchanged
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True)
class HeartbeatAnswer:
    """ShareGroupHeartbeat v1's answer, and ConsumerGroupHeartbeat's (the same fields);
    ``assignment`` None when the member's is unchanged."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None

    def body(self) -> dict[str, Any]:
        """The response body as the codec builds it (``app.wire.kafka.structs.build``)."""
        out: dict[str, Any] = {
            "member_id": self.member_id,
            "member_epoch": self.member_epoch,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
        }
        if self.assignment is not None:
            out["assignment"] = {"topic_partitions": topic_partitions(self.assignment)}
        return out


@dataclass(frozen=True)
class HeartbeatOutcome:
    group: ShareGroup  # the group as it becomes (to store)
    answer: HeartbeatAnswer


def topic_partitions(assignment: Assignment, names: Mapping[uuid.UUID, str] | None = None) -> list[dict[str, Any]]:
    """An assignment as the wire lists it, topic by topic (ordered by id, partitions ascending);
    with ``names`` each entry also carries ``topic_name`` (ShareGroupDescribe)."""
    out = []
    for topic_id in sorted(assignment):
        entry: dict[str, Any] = {"topic_id": topic_id, "partitions": sorted(assignment[topic_id])}
        if names is not None:
            entry["topic_name"] = names.get(topic_id, "")
        out.append(entry)
    return out


# -- the heartbeat -------------------------------------------------------------------------------


def validate_heartbeat(request: HeartbeatRequest) -> None:
    """Kafka's checks of a ShareGroupHeartbeat before it reaches the group (INVALID_REQUEST, with
    Kafka's messages). A string of blanks counts as empty, as Kafka counts it."""
    if not request.member_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "MemberId can't be empty.")
    if not request.group_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
    if request.rack_id is not None and not request.rack_id.strip():
        raise TxlogError(ErrorCode.INVALID_REQUEST, "RackId can't be empty.")
    if request.member_epoch == JOIN_EPOCH:
        if not request.subscribed_topic_names:
            raise TxlogError(ErrorCode.INVALID_REQUEST, "SubscribedTopicNames must be set in first request.")
    elif request.member_epoch < LEAVE_EPOCH:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "MemberEpoch is invalid.")


def topics_needed(group: ShareGroup | None, request: HeartbeatRequest | None = None) -> frozenset[str]:
    """The topic names whose metadata ``heartbeat`` needs: every member's subscriptions, the
    request's included."""
    names: set[str] = set()
    if group is not None:
        for member in group.members.values():
            if request is None or member.member_id != request.member_id or request.subscribed_topic_names is None:
                names |= member.subscribed_topic_names
    if request is not None and request.subscribed_topic_names is not None:
        names |= set(request.subscribed_topic_names)
    return frozenset(names)


def heartbeat(
    group: ShareGroup | None,
    request: HeartbeatRequest,
    topics: Mapping[str, TopicMetadata],
    now_ms: int,
    config: ShareGroupConfig = ShareGroupConfig(),
) -> HeartbeatOutcome:
    """One ShareGroupHeartbeat on ``group`` (None: no such group yet): join (epoch 0), heartbeat,
    or leave (epoch -1). ``topics``: the metadata of the existing topics among ``topics_needed``.
    Raises ``TxlogError`` with Kafka's error and message when Kafka refuses the request."""
    validate_heartbeat(request)
    if request.member_epoch == LEAVE_EPOCH:
        return _leave(group, request, topics)
    joining = request.member_epoch == JOIN_EPOCH
    if group is None:
        if not joining:
            # Kafka keeps an emptied group, so a member only finds none after the group was deleted,
            # which an empty group alone may be: the member was fenced long before. Named as such.
            raise TxlogError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"Member {request.member_id} is not a member of group {request.group_id}."
            )
        group = ShareGroup(request.group_id)
    if len(group.members) >= config.max_size and request.member_id not in group.members:
        raise TxlogError(
            ErrorCode.GROUP_MAX_SIZE_REACHED, f"The share group has reached its maximum capacity of {config.max_size} members."
        )
    member = group.members.get(request.member_id)
    if member is None:
        if not joining:
            raise TxlogError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"Member {request.member_id} is not a member of group {group.group_id}."
            )
        member = ShareMember(request.member_id, JOIN_EPOCH, JOIN_EPOCH, frozenset(), NO_PARTITIONS, now_ms)
    check_member_epoch("share", member.member_epoch, member.previous_member_epoch, request.member_epoch)

    updated = replace(
        member,
        rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
        subscribed_topic_names=(
            frozenset(request.subscribed_topic_names)
            if request.subscribed_topic_names is not None
            else member.subscribed_topic_names
        ),
        client_id=request.client_id,
        client_host=request.client_host,
        session_deadline_ms=now_ms + config.session_timeout_ms,
    )
    members = {**group.members, updated.member_id: updated}
    bump = updated.subscribed_topic_names != member.subscribed_topic_names or request.member_id not in group.members
    metadata = subscription_metadata(members.values(), topics)
    bump = bump or metadata != group.subscription_metadata
    group_epoch = group.group_epoch + 1 if bump else group.group_epoch

    target, assignment_epoch = group.target_assignment, group.assignment_epoch
    if group_epoch > assignment_epoch:
        subscriptions = {m.member_id: m.subscribed_topic_names for m in members.values()}
        target = assign(subscriptions, metadata, group.target_assignment)
        assignment_epoch = group_epoch

    # The member takes its target at once: a share partition is never revoked before another
    # member may fetch it, so there is nothing to wait for.
    if updated.member_epoch != assignment_epoch:
        updated = replace(
            updated,
            member_epoch=assignment_epoch,
            previous_member_epoch=updated.member_epoch,
            assignment=target.get(updated.member_id, NO_PARTITIONS),
        )
        members[updated.member_id] = updated

    new_group = replace(
        group,
        group_epoch=group_epoch,
        assignment_epoch=assignment_epoch,
        members=members,
        subscription_metadata=metadata,
        target_assignment=target,
    )
    changed = joining or dict(updated.assignment) != dict(member.assignment)
    answer = HeartbeatAnswer(
        updated.member_id, updated.member_epoch, config.heartbeat_interval_ms, updated.assignment if changed else None
    )
    return HeartbeatOutcome(new_group, answer)


def check_member_epoch(
    kind: str, member_epoch: int, previous_member_epoch: int, received: int, retry_allowed: bool = True
) -> None:
    """Kafka's fencing of a heartbeat's epoch, for share and consumer groups alike (``kind`` names
    the group's type in the message): an epoch ahead of the member's, or behind it and not its
    previous one (the answer that bumped it may have been lost: the member retries), is fenced.
    ``retry_allowed`` False fences the previous epoch too (a consumer group accepts it only from a
    member that owns no more than its current assignment)."""
    if received > member_epoch:
        raise TxlogError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"The {kind} group member has a greater member epoch ({received}) than the one known by the group coordinator "
            f"({member_epoch}). The member must abandon all its partitions and rejoin.",
        )
    if received < member_epoch and (received != previous_member_epoch or not retry_allowed):
        raise TxlogError(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"The {kind} group member has a smaller member epoch ({received}) than the one known by the group coordinator "
            f"({member_epoch}). The member must abandon all its partitions and rejoin.",
        )


def _leave(group: ShareGroup | None, request: HeartbeatRequest, topics: Mapping[str, TopicMetadata]) -> HeartbeatOutcome:
    if group is None:
        raise TxlogError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {request.group_id} not found.")
    if request.member_id not in group.members:
        raise TxlogError(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {request.member_id} is not a member of group {group.group_id}.")
    return HeartbeatOutcome(fence(group, request.member_id, topics), HeartbeatAnswer(request.member_id, LEAVE_EPOCH, 0))


def fence(group: ShareGroup, member_id: str, topics: Mapping[str, TopicMetadata]) -> ShareGroup:
    """``group`` without the member (it left, or its session expired): its target assignment goes,
    the subscription metadata is recomputed without it, the group epoch is bumped (the next
    heartbeat of any member recomputes the assignment)."""
    members = {k: v for k, v in group.members.items() if k != member_id}
    return replace(
        group,
        group_epoch=group.group_epoch + 1,
        members=members,
        subscription_metadata=subscription_metadata(members.values(), topics),
        target_assignment={k: v for k, v in group.target_assignment.items() if k != member_id},
    )


def session_expired(session_deadline_ms: int, now_ms: int) -> bool:
    """Whether a member's session has ended at ``now_ms``: it is out of the group from then on,
    whether or not it has been fenced yet."""
    return session_deadline_ms <= now_ms


def expired_members(group: ShareGroup, now_ms: int) -> list[str]:
    """The members whose session has expired at ``now_ms`` (each to ``fence``), ordered by id."""
    return sorted(m.member_id for m in group.members.values() if session_expired(m.session_deadline_ms, now_ms))


def in_group(session_deadline_ms: int | None, now_ms: int) -> bool:
    """Whether a member (its session deadline, None if the group has no such member) may use the
    group's share partitions: it joined and its session has not ended. A member fenced, expired or
    unknown has to join again (epoch 0) first."""
    return session_deadline_ms is not None and not session_expired(session_deadline_ms, now_ms)


def subscription_metadata(members: Iterable[ShareMember], topics: Mapping[str, TopicMetadata]) -> dict[str, TopicMetadata]:
    """The metadata of every existing topic some member subscribes to (a topic that does not exist
    is left out: it is assigned once it is created, at the heartbeat that sees it)."""
    names = set().union(*(m.subscribed_topic_names for m in members))
    return {name: topics[name] for name in sorted(names) if name in topics}


def described_topics(group: ShareGroup) -> frozenset[str]:
    """The topics a description of the group names: its members' subscriptions and assignments.
    A caller must be allowed to Describe each of them to be shown the group (Kafka 4.1+)."""
    names = {t.topic_id: t.name for t in group.subscription_metadata.values()}
    subscribed = (name for m in group.members.values() for name in m.subscribed_topic_names)
    assigned = (names[topic_id] for m in group.members.values() for topic_id in m.assignment if topic_id in names)
    return frozenset((*subscribed, *assigned))


def describe(group: ShareGroup) -> dict[str, Any]:
    """The group as ShareGroupDescribe v1 describes it (a ``groups`` entry, without
    ``authorized_operations``, which is the caller's)."""
    names = {t.topic_id: t.name for t in group.subscription_metadata.values()}
    return {
        "group_id": group.group_id,
        "group_state": group.state,
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor_name": ASSIGNOR_NAME,
        "members": [
            {
                "member_id": m.member_id,
                "rack_id": m.rack_id,
                "member_epoch": m.member_epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": sorted(m.subscribed_topic_names),
                "assignment": {"topic_partitions": topic_partitions(m.assignment, names)},
            }
            for _, m in sorted(group.members.items())
        ],
    }


# -- the simple assignor ---------------------------------------------------------------------------
#
# Kafka's SimpleAssignor (SimpleHomogeneousAssignmentBuilder, SimpleHeterogeneousAssignmentBuilder),
# step by step, over ordered data where Kafka iterates hash maps: members by id, topics by name,
# partitions by index, so that the same input always gives the same assignment. Two departures,
# both where Kafka's builders can leave the balance they aim for: the members still short of their
# share are taken afresh before the last step (Kafka's homogeneous builder can count a member it
# trimmed to its share as short, and give it one more), and each partition short of members tries
# every short member (Kafka's single pass over them, once it fails for one partition, skips every
# later one: a partition could stay unassigned until the next epoch).


def assign(
    subscriptions: Mapping[str, Collection[str]], topics: Mapping[str, TopicMetadata], current: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """The target assignment of every member (member id -> its partitions; every member present).

    ``subscriptions``: each member's subscribed topic names; ``topics``: the metadata of the
    subscribed topics that exist (others are ignored); ``current``: the previous target, kept where
    it keeps the balance. When every member subscribes to the same topics (Kafka's homogeneous
    subscription) the balance is over all their partitions together, otherwise topic by topic: a
    member subscribed to two topics gets its share of each."""
    member_ids = sorted(subscriptions)
    if not member_ids:
        return {}
    old = [_valid(current.get(m, NO_PARTITIONS), topics) for m in member_ids]
    names = [set(subscriptions[m]) for m in member_ids]
    if all(n == names[0] for n in names):
        partitions = [(topics[n].topic_id, p) for n in sorted(names[0]) if n in topics for p in range(topics[n].partitions)]
        new = _balance(partitions, list(range(len(member_ids))), old, homogeneous=True)
    else:
        new = [dict(a) for a in old]
        subscribed: dict[uuid.UUID, list[int]] = {}
        for index, member_names in enumerate(names):
            for name in member_names:
                if name in topics:
                    subscribed.setdefault(topics[name].topic_id, []).append(index)
        for name in sorted(topics):
            topic_id = topics[name].topic_id
            if topic_id not in subscribed:
                continue
            partitions = [(topic_id, p) for p in range(topics[name].partitions)]
            only_topic = [{topic_id: a[topic_id]} if topic_id in a else {} for a in new]
            balanced = _balance(partitions, subscribed[topic_id], only_topic, homogeneous=False)
            for index, assignment in enumerate(balanced):
                new[index].pop(topic_id, None)
                new[index].update(assignment)
        new = [{t: p for t, p in a.items() if t in subscribed} for a in new]
    return {m: {t: frozenset(p) for t, p in sorted(a.items()) if p} for m, a in zip(member_ids, new)}


def _valid(assignment: Assignment, topics: Mapping[str, TopicMetadata]) -> dict[uuid.UUID, frozenset[int]]:
    """The partitions of ``assignment`` that still exist."""
    counts = {t.topic_id: t.partitions for t in topics.values()}
    return {t: frozenset(p for p in ps if p < counts[t]) for t, ps in assignment.items() if t in counts}


def desired_counts(sharing: int, partitions: int, members: int) -> list[int]:
    """How many partitions each of ``members`` should hold when each of ``partitions`` is held by
    ``sharing`` of them: the total spread as evenly as integers allow, computed in doubles as Kafka
    computes it (so that a member's share is Kafka's, to the last rounding)."""
    precise = (sharing * partitions) / members
    return [math.ceil(precise * (i + 1)) - math.ceil(precise * i) for i in range(members)]


def _balance(
    partitions: list[tuple[uuid.UUID, int]], eligible: list[int], old: list[dict[uuid.UUID, frozenset[int]]], homogeneous: bool
) -> list[dict[uuid.UUID, frozenset[int]]]:
    """One builder run: ``partitions`` over the ``eligible`` member indexes, from ``old`` (indexed by
    every member); the new assignments of every member, restricted to these partitions."""
    n_members = len(old)
    wanted = set(partitions)
    sharing = 0 if not partitions else (len(eligible) + len(partitions) - 1) // len(partitions)
    desired = [0] * n_members
    for position, count in enumerate(desired_counts(sharing, len(partitions), len(eligible)) if eligible else []):
        desired[eligible[position]] = count
    holders: dict[tuple[uuid.UUID, int], list[int]] = {tp: [] for tp in partitions}
    held: list[list[tuple[uuid.UUID, int]]] = [[] for _ in range(n_members)]
    # 1. the previous assignment, of these partitions only
    for index in range(n_members):
        for topic_id in sorted(old[index]):
            for p in sorted(old[index][topic_id]):
                if (topic_id, p) in wanted:
                    holders[(topic_id, p)].append(index)
                    held[index].append((topic_id, p))

    def revoke(index: int, tp: tuple[uuid.UUID, int]) -> None:
        holders[tp].remove(index)
        held[index].remove(tp)

    def trim_overfilled() -> None:
        for index in range(n_members):
            while len(held[index]) > desired[index]:
                revoke(index, held[index][0])

    def trim_overshared() -> None:
        overfilled = {i for i in range(n_members) if len(held[i]) > desired[i]}
        for tp in partitions:
            # (the homogeneous builder takes from the members holding too many first)
            for pass_overfilled in (True, False) if homogeneous else (None,):
                for index in list(holders[tp]):
                    if len(holders[tp]) <= sharing:
                        break
                    if pass_overfilled is None or (index in overfilled) == pass_overfilled:
                        revoke(index, tp)

    # 2./3. revoke what is shared more than ``sharing`` and what a member holds beyond its share
    # (Kafka's homogeneous builder does the first first, the heterogeneous one the second first)
    if homogeneous:
        trim_overshared()
        trim_overfilled()
    else:
        trim_overfilled()
        trim_overshared()
    # 4. give the partitions short of holders to the members short of partitions, in turn
    short = [i for i in eligible if len(held[i]) < desired[i]]
    cursor = 0
    for tp in partitions:
        if not short:
            break
        misses = 0
        while len(holders[tp]) < sharing and short and misses < len(short):
            cursor %= len(short)
            index = short[cursor]
            if index in holders[tp]:
                cursor += 1
                misses += 1
                continue
            holders[tp].append(index)
            held[index].append(tp)
            misses = 0
            if len(held[index]) >= desired[index]:
                short.pop(cursor)
            else:
                cursor += 1
    out: list[dict[uuid.UUID, frozenset[int]]] = []
    for index in range(n_members):
        by_topic: dict[uuid.UUID, set[int]] = {}
        for topic_id, p in held[index]:
            by_topic.setdefault(topic_id, set()).add(p)
        out.append({t: frozenset(ps) for t, ps in by_topic.items()})
    return out
