"""Kafka's classic consumer group (``GroupMetadata``) as plain data, no I/O.

A group moves through five states, declared once as data (``VALID_PREVIOUS``); ``check_transition``
is the one place a transition is checked. Beside the group and its members: the requests its events
take (JoinGroup, SyncGroup), the answers they give, and the effects the driver carries out in order
(``Outcome``) — answer waiting JoinGroup/SyncGroup requests, arm or cancel timers. The timers follow
from the state (``timers``): a member's session, the end of a join phase, the deadline for SyncGroup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from app.errors import ErrorCode, TxlogError


class GroupState(Enum):
    """A classic group's state; the values are Kafka's names (DescribeGroups, ListGroups)."""

    EMPTY = "Empty"  # no members; offsets may still be committed ("simple" consumers using assign())
    PREPARING_REBALANCE = "PreparingRebalance"  # a join phase: JoinGroup requests wait for the others
    COMPLETING_REBALANCE = "CompletingRebalance"  # JoinGroup answered; waiting for the leader's SyncGroup
    STABLE = "Stable"  # the leader's assignment is delivered; members heartbeat
    DEAD = "Dead"  # deleted, or its coordinator stopped: it is removed next


S = GroupState

# Which states each state may be entered from. ``None`` is "the group did not exist".
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState | None]] = {
    S.EMPTY: frozenset({None, S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset({S.EMPTY, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE, S.DEAD}),
}


def check_transition(from_state: GroupState | None, to_state: GroupState) -> None:
    """The one place a transition is validated. A refused transition is a coordinator bug, never a
    client's mistake: clients are answered from the state before any transition is attempted."""
    if from_state not in VALID_PREVIOUS[to_state]:
        name = from_state.value if from_state else "(none)"
        raise TxlogError(ErrorCode.UNKNOWN_SERVER_ERROR, f"A group cannot move from {name} to {to_state.value}")


GROUP_TYPE = "classic"  # ListGroups v5+ GroupType
# How long a new member's JoinGroup may wait before the member is dropped (Kafka's
# NewMemberJoinTimeoutMs): its session cannot run yet, and a client that gave up would otherwise
# hold the join phase until the rebalance timeout.
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000


@dataclass(frozen=True)
class GroupConfig:
    """The broker's group settings (group.min/max.session.timeout.ms, group.initial.rebalance.delay.ms,
    group.max.size; ``None``: no limit)."""

    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int | None = None
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS


Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's order of preference


class Waiting(Enum):
    """What a member's parked request waits for. One field: a member waits for one thing at most."""

    JOIN = "join"  # its JoinGroup, for the join phase to end
    SYNC = "sync"  # its SyncGroup, for the leader's assignment


@dataclass(frozen=True)
class Member:
    member_id: str
    group_instance_id: str | None  # set for a static member (KIP-345)
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: Protocols
    session_deadline_ms: int  # removed when this passes, unless it is waiting (see ``kept_alive``)
    waiting: Waiting | None = None
    is_new: bool = False  # joined in the current join phase and not answered yet
    assignment: bytes = b""

    def metadata(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    @property
    def kept_alive(self) -> bool:
        """A member whose request is parked cannot heartbeat; the wait keeps it, except a new member's
        JoinGroup, which has its own deadline."""
        return self.waiting is Waiting.SYNC or (self.waiting is Waiting.JOIN and not self.is_new)


@dataclass(frozen=True)
class Group:
    group_id: str
    state: GroupState = S.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None  # chosen at the end of each join phase; None when Empty
    leader_id: str | None = None
    members: Mapping[str, Member] = field(default_factory=dict)  # in joining order; never mutated
    # Member ids handed out with MEMBER_ID_REQUIRED and their deadline to join with them.
    pending_members: Mapping[str, int] = field(default_factory=dict)
    pending_sync: frozenset[str] = frozenset()  # members that have not sent SyncGroup this generation
    join_deadline_ms: int | None = None  # the join phase ends then at the latest
    # While the first join phase of an Empty group is delayed (group.initial.rebalance.delay.ms): how
    # much of the rebalance timeout is left for further delays; a new member extends the delay.
    initial_delay_remaining_ms: int | None = None
    new_member_added: bool = False
    sync_deadline_ms: int | None = None  # members still in ``pending_sync`` then are removed
    state_since_ms: int = 0

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        if group_instance_id is None:
            return None
        return next((m.member_id for m in self.members.values() if m.group_instance_id == group_instance_id), None)

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    @property
    def all_joined(self) -> bool:
        return not self.pending_members and all(m.waiting is Waiting.JOIN for m in self.members.values())


# --- requests, answers and effects -----------------------------------------------------------------


@dataclass(frozen=True)
class JoinRequest:
    member_id: str  # "" for a member without an id yet
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int  # JoinGroup v0 has none: the session timeout
    protocol_type: str
    protocols: Protocols
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+: a dynamic member first gets its id
    supports_skip_assignment: bool = False  # JoinGroup v9+


@dataclass(frozen=True)
class SyncRequest:
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None  # SyncGroup v5+, else None
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]  # the leader's (member id, assignment); others send none


@dataclass(frozen=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode | None
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()  # only the leader's answer lists the members


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode | None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


def join_error(member_id: str, error: ErrorCode) -> JoinResult:
    return JoinResult(error, member_id)


def sync_error(error: ErrorCode) -> SyncResult:
    return SyncResult(error)


@dataclass(frozen=True)
class LeftMember:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode | None


@dataclass(frozen=True)
class LeaveAnswer:
    error: ErrorCode | None  # the request's error; each member has its own below
    members: tuple[LeftMember, ...]


class TimerKind(Enum):
    SESSION = "session"  # a member's (or a pending member id's) session deadline
    JOIN = "join"  # the end of the join phase: the rebalance timeout, or the initial delay
    SYNC = "sync"  # members that have not sent SyncGroup by then are removed


@dataclass(frozen=True)
class Timer:
    kind: TimerKind
    member_id: str = ""  # SESSION timers only


@dataclass(frozen=True)
class Park:
    """The caller's request waits as this member's ``waiting`` request until an answer effect."""

    member_id: str
    waiting: Waiting


@dataclass(frozen=True)
class AnswerJoin:
    member_id: str
    result: JoinResult


@dataclass(frozen=True)
class AnswerSync:
    member_id: str
    result: SyncResult


@dataclass(frozen=True)
class ArmTimer:
    timer: Timer
    deadline_ms: int


@dataclass(frozen=True)
class CancelTimer:
    timer: Timer


Effect = Park | AnswerJoin | AnswerSync | ArmTimer | CancelTimer


@dataclass(frozen=True)
class Outcome:
    """An event's result. ``group`` None: the group does not exist (or no longer does). ``reply`` is
    the caller's answer unless ``effects`` park it. Effects are carried out in order."""

    group: Group | None
    reply: object = None
    effects: tuple[Effect, ...] = ()

    @property
    def parked(self) -> Park | None:
        return next((e for e in self.effects if isinstance(e, Park)), None)


def timers(group: Group | None) -> dict[Timer, int]:
    """The timers a group needs, with their deadlines: derived from the state, so they cannot drift."""
    if group is None or group.state is S.DEAD:
        return {}
    wanted = {Timer(TimerKind.SESSION, m.member_id): m.session_deadline_ms for m in group.members.values() if not m.kept_alive}
    wanted.update({Timer(TimerKind.SESSION, mid): deadline for mid, deadline in group.pending_members.items()})
    if group.state is S.PREPARING_REBALANCE and group.join_deadline_ms is not None:
        wanted[Timer(TimerKind.JOIN)] = group.join_deadline_ms
    if group.pending_sync and group.sync_deadline_ms is not None:
        wanted[Timer(TimerKind.SYNC)] = group.sync_deadline_ms
    return wanted
