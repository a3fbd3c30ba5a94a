"""Share groups' membership (KIP-932): the group row (epochs, subscription metadata) and its
members (epochs, subscriptions, assignments, session deadlines).

The group row's lock (``share_group_lock``) is held for every change of the group: a heartbeat
loads the group under it, applies the domain's rules (``app.domain.share_groups``) and writes back
what changed, so any process serves any share group. Session deadlines are epoch milliseconds of
the database's clock; the expired ones are found through their index.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Mapping, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.share_groups import Assignment, ShareGroup, ShareMember, TopicMetadata


def assignment_json(assignment: Assignment) -> str:
    return json.dumps({str(t): sorted(ps) for t, ps in sorted(assignment.items())})


def assignment_of(value: Mapping[str, Any]) -> Assignment:
    return {uuid.UUID(t): frozenset(int(p) for p in ps) for t, ps in value.items()}


def metadata_json(metadata: Mapping[str, TopicMetadata]) -> str:
    return json.dumps({n: {"topic_id": str(t.topic_id), "partitions": t.partitions} for n, t in sorted(metadata.items())})


def metadata_of(value: Mapping[str, Any]) -> dict[str, TopicMetadata]:
    return {n: TopicMetadata(n, uuid.UUID(t["topic_id"]), int(t["partitions"])) for n, t in value.items()}


_GROUP = "SELECT group_epoch, assignment_epoch, subscription_metadata FROM txlog.share_group_metadata WHERE group_id = :g"
_MEMBERS = """
SELECT member_id, member_epoch, previous_member_epoch, subscribed_topic_names, assignment, target_assignment,
       session_deadline_ms, rack_id, client_id, client_host
FROM txlog.share_group_member_metadata WHERE group_id = :g ORDER BY member_id
"""


def _load(conn: Connection, group_id: str, lock: str) -> ShareGroup | None:
    row = conn.execute(text(_GROUP + lock), {"g": group_id}).fetchone()
    if row is None:
        return None
    group_epoch, assignment_epoch, metadata = row
    members: dict[str, ShareMember] = {}
    target: dict[str, Assignment] = {}
    for m in conn.execute(text(_MEMBERS), {"g": group_id}):
        members[m.member_id] = ShareMember(
            m.member_id,
            m.member_epoch,
            m.previous_member_epoch,
            frozenset(m.subscribed_topic_names),
            assignment_of(m.assignment),
            m.session_deadline_ms,
            m.rack_id,
            m.client_id,
            m.client_host,
        )
        target[m.member_id] = assignment_of(m.target_assignment)
    return ShareGroup(group_id, group_epoch, assignment_epoch, members, metadata_of(metadata), target)


def share_group_lock(conn: Connection, group_id: str, skip_locked: bool = False) -> ShareGroup | None:
    """The share group, its row locked until the database transaction ends (None: no such group,
    or, with ``skip_locked``, another transaction holds it)."""
    return _load(conn, group_id, " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE")


def share_group(conn: Connection, group_id: str) -> ShareGroup | None:
    """The share group as last written (no lock: for describing it)."""
    return _load(conn, group_id, "")


def share_group_create(conn: Connection, group_id: str) -> None:
    """An empty share group row, unless one exists (the caller locks it next)."""
    conn.execute(
        text(
            "INSERT INTO txlog.share_group_metadata (group_id, group_epoch, assignment_epoch) VALUES (:g, 0, 0) "
            "ON CONFLICT (group_id) DO NOTHING"
        ),
        {"g": group_id},
    )


def share_group_save(conn: Connection, old: ShareGroup | None, new: ShareGroup) -> None:
    """Writes ``new`` over ``old`` (as loaded under the lock): the group row, the members that
    changed, and the removal of those gone."""
    if old is None or (old.group_epoch, old.assignment_epoch, dict(old.subscription_metadata)) != (
        new.group_epoch,
        new.assignment_epoch,
        dict(new.subscription_metadata),
    ):
        conn.execute(
            text(
                "UPDATE txlog.share_group_metadata SET group_epoch = :ge, assignment_epoch = :ae, "
                "subscription_metadata = CAST(:md AS jsonb), updated_at = now() WHERE group_id = :g"
            ),
            {
                "g": new.group_id,
                "ge": new.group_epoch,
                "ae": new.assignment_epoch,
                "md": metadata_json(new.subscription_metadata),
            },
        )
    old_members = {} if old is None else dict(old.members)
    old_target = {} if old is None else dict(old.target_assignment)
    gone = [m for m in old_members if m not in new.members]
    if gone:
        conn.execute(
            text("DELETE FROM txlog.share_group_member_metadata WHERE group_id = :g AND member_id = ANY(CAST(:ms AS text[]))"),
            {"g": new.group_id, "ms": gone},
        )
    for member_id, member in new.members.items():
        target = new.target_assignment.get(member_id, {})
        if old_members.get(member_id) == member and dict(old_target.get(member_id, {})) == dict(target):
            continue
        conn.execute(
            text(
                """
                INSERT INTO txlog.share_group_member_metadata
                  (group_id, member_id, member_epoch, previous_member_epoch, subscribed_topic_names, assignment,
                   target_assignment, session_deadline_ms, rack_id, client_id, client_host)
                VALUES (:g, :m, :e, :pe, CAST(:subs AS text[]), CAST(:a AS jsonb), CAST(:ta AS jsonb), :dl, :rack, :cid, :host)
                ON CONFLICT (group_id, member_id) DO UPDATE SET
                  member_epoch = EXCLUDED.member_epoch, previous_member_epoch = EXCLUDED.previous_member_epoch,
                  subscribed_topic_names = EXCLUDED.subscribed_topic_names, assignment = EXCLUDED.assignment,
                  target_assignment = EXCLUDED.target_assignment, session_deadline_ms = EXCLUDED.session_deadline_ms,
                  rack_id = EXCLUDED.rack_id, client_id = EXCLUDED.client_id, client_host = EXCLUDED.client_host
                """
            ),
            {
                "g": new.group_id,
                "m": member_id,
                "e": member.member_epoch,
                "pe": member.previous_member_epoch,
                "subs": sorted(member.subscribed_topic_names),
                "a": assignment_json(member.assignment),
                "ta": assignment_json(target),
                "dl": member.session_deadline_ms,
                "rack": member.rack_id,
                "cid": member.client_id,
                "host": member.client_host,
            },
        )


def share_group_ids(conn: Connection) -> list[str]:
    """Every share group with a membership row, by id."""
    return [r[0] for r in conn.execute(text("SELECT group_id FROM txlog.share_group_metadata ORDER BY group_id"))]


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


def share_member_session_deadline(conn: Connection, group_id: str, member_id: str) -> int | None:
    """The member's session deadline (one key lookup), None if the group has no such member."""
    return conn.execute(
        text("SELECT session_deadline_ms FROM txlog.share_group_member_metadata WHERE group_id = :g AND member_id = :m"),
        {"g": group_id, "m": member_id},
    ).scalar()


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


def share_group_delete(conn: Connection, group_id: str) -> None:
    conn.execute(text("DELETE FROM txlog.share_group_metadata WHERE group_id = :g"), {"g": group_id})
