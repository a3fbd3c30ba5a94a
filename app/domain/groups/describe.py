"""Reading a classic consumer group: DescribeGroups' view of one group (``describe``), ListGroups
(``listing``), and the group as plain data for the admin pages (``snapshot``). Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from app.domain.groups.state import GROUP_TYPE, Group, S
from app.errors import ErrorCode


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes  # for the chosen protocol; only while Stable
    assignment: bytes  # only while Stable


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    error: ErrorCode | None  # GROUP_ID_NOT_FOUND for a group this coordinator does not know
    state: str
    protocol_type: str
    protocol_data: str  # the chosen protocol; only while Stable
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = GROUP_TYPE


def describe(group_id: str, group: Group | None) -> GroupDescription:
    """DescribeGroups' view of one group, as Kafka's GroupMetadata.summary."""
    if group is None or group.state is S.DEAD:
        error = ErrorCode.GROUP_ID_NOT_FOUND if group is None else None
        return GroupDescription(group_id, error, S.DEAD.value, "", "", ())
    stable = group.state is S.STABLE
    members = tuple(
        MemberDescription(
            m.member_id,
            m.group_instance_id,
            m.client_id,
            m.client_host,
            m.metadata(group.protocol_name) if stable else b"",
            m.assignment if stable else b"",
        )
        for m in group.members.values()
    )
    return GroupDescription(
        group.group_id, None, group.state.value, group.protocol_type or "", group.protocol_name or "" if stable else "", members
    )


def listing(groups: Iterable[Group], states_filter: Iterable[str] = (), types_filter: Iterable[str] = ()) -> list[GroupListing]:
    """ListGroups: the groups whose state (and type) is in the filters, compared case-insensitively;
    an empty filter takes all."""
    states = {s.lower() for s in states_filter}
    types = {t.lower() for t in types_filter}
    if types and GROUP_TYPE not in types:
        return []
    return [
        GroupListing(g.group_id, g.protocol_type or "", g.state.value)
        for g in groups
        if g.state is not S.DEAD and (not states or g.state.value.lower() in states)
    ]


def snapshot(group: Group) -> dict[str, object]:
    """The group as plain data, for the admin pages."""
    return {
        "group_id": group.group_id,
        "group_type": GROUP_TYPE,
        "state": group.state.value,
        "state_since_ms": group.state_since_ms,
        "generation_id": group.generation_id,
        "protocol_type": group.protocol_type,
        "protocol_name": group.protocol_name,
        "leader_id": group.leader_id,
        "pending_member_ids": sorted(group.pending_members),
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "session_deadline_ms": m.session_deadline_ms,
                "protocols": [name for name, _ in m.protocols],
                "waiting": m.waiting.value if m.waiting else None,
                "awaiting_sync": m.member_id in group.pending_sync,
                "assignment": m.assignment,
            }
            for m in group.members.values()
        ],
    }
