"""Share groups' membership (KIP-932): the group row (epochs, subscription metadata) and its
members (epochs, subscriptions, assignments, session deadlines).

The rows are read and written as every member-epoch group's (``app.storage.member_epoch_groups``):
the group row's lock (``GROUPS.lock``) is held for every change of the group, a heartbeat
loads the group under it, applies the domain's rules (``app.domain.share_groups``) and writes back
what changed, so any process serves any share group. Session deadlines are epoch milliseconds of
the database's clock; the expired ones are found through their index.
"""

from __future__ import annotations

from typing import Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.share_groups import ShareGroup, ShareMember
from app.storage.member_epoch_groups import SUBSCRIBED_TOPIC_NAMES, Column, MemberEpochGroups, assignment_json, assignment_of
from app.storage.statements import Statement

GROUPS: MemberEpochGroups[ShareGroup, ShareMember] = MemberEpochGroups(
    "txlog.share_group_metadata",
    "txlog.share_group_member_metadata",
    ShareGroup,
    ShareMember,
    (
        Column("member_epoch"),
        Column("previous_member_epoch"),
        SUBSCRIBED_TOPIC_NAMES,
        Column("assignment", "jsonb", assignment_json, assignment_of),
        Column("session_deadline_ms"),
        Column("rack_id"),
        Column("client_id"),
        Column("client_host"),
    ),
)


def share_group_member_counts(conn: Connection, group_ids: Sequence[str]) -> dict[str, int]:
    """How many members each of ``group_ids`` has (a group without a row is left out)."""
    rows = conn.execute(
        text(
            "SELECT g.group_id, count(m.member_id) FROM txlog.share_group_metadata g "
            "LEFT JOIN txlog.share_group_member_metadata m USING (group_id) "
            "WHERE g.group_id = ANY(CAST(:gs AS text[])) GROUP BY g.group_id"
        ),
        {"gs": list(group_ids)},
    )
    return {g: n for g, n in rows}


def groups_with_expired_sessions(conn: Connection, now_ms: int, limit: int) -> list[str]:
    """Share groups with a member whose session deadline has passed (through the deadline index)."""
    rows = conn.execute(
        text(
            "SELECT DISTINCT group_id FROM (SELECT group_id FROM txlog.share_group_member_metadata "
            "WHERE session_deadline_ms <= :now ORDER BY session_deadline_ms LIMIT :n) due"
        ),
        {"now": now_ms, "n": limit},
    )
    return [r[0] for r in rows]


def share_member_session_deadline(group_id: str, member_id: str) -> Statement[int | None]:
    """The member's session deadline (one key lookup), None if the group has no such member."""
    return Statement(
        "SELECT (SELECT session_deadline_ms FROM txlog.share_group_member_metadata WHERE group_id = %(g)s AND member_id = %(m)s)",
        {"g": group_id, "m": member_id},
        lambda row: row[0],
    )


def share_group_exists(conn: Connection, group_id: str) -> bool:
    """A membership row, share-partition state or share configs of the group (three key lookups)."""
    return bool(
        conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM txlog.share_group_metadata WHERE group_id = :g) "
                "OR EXISTS (SELECT 1 FROM txlog.share_partitions WHERE group_id = :g) "
                "OR EXISTS (SELECT 1 FROM txlog.share_group_configs WHERE group_id = :g)"
            ),
            {"g": group_id},
        ).scalar()
    )
