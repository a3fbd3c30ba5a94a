"""Consumer groups of the next-generation protocol (KIP-848): the group row (epochs, subscription
metadata) and its members (epochs, reconciliation state, subscriptions, owned, revoking and target
partitions, deadlines).

The group row's lock (``consumer_group_lock``) is held for every change of the group: a heartbeat
loads the group under it, applies the domain's rules (``app.domain.groups.consumer_group``) and
writes back what changed, so any gateway serves any group and none holds its truth in memory. An
offset commit holds the row FOR SHARE (``consumer_group_share``) from its member check to its write.
Deadlines are epoch milliseconds of the database's clock; the due ones are found through their
indexes. The JSON forms of assignments and subscription metadata are the share groups' (an owned
assignment adds each partition's epoch: topic id -> partition -> epoch).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Mapping

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.groups.consumer_group import ConsumerGroup, ConsumerMember, OwnedPartitions
from app.storage.share_groups import assignment_json, assignment_of, metadata_json, metadata_of


def _owned_json(owned: OwnedPartitions) -> str:
    return json.dumps({str(t): {str(p): e for p, e in sorted(ps.items())} for t, ps in sorted(owned.items()) if ps})


def _owned(value: Mapping[str, Any]) -> OwnedPartitions:
    return {uuid.UUID(t): {int(p): int(e) for p, e in ps.items()} for t, ps in value.items()}


_GROUP = (
    "SELECT group_epoch, assignment_epoch, subscription_metadata, topics_version "
    "FROM txlog.consumer_group_metadata WHERE group_id = :g"
)
_MEMBERS = """
SELECT member_id, member_epoch, previous_member_epoch, state, rebalance_timeout_ms, subscribed_topic_names,
       subscribed_topic_regex, server_assignor, assignment, pending_revocation, target_assignment, session_deadline_ms,
       rebalance_deadline_ms, instance_id, rack_id, client_id, client_host
FROM txlog.consumer_group_member_metadata WHERE group_id = :g ORDER BY member_id
"""


def _load(conn: Connection, group_id: str, lock: str) -> ConsumerGroup | None:
    row = conn.execute(text(_GROUP + lock), {"g": group_id}).fetchone()
    if row is None:
        return None
    group_epoch, assignment_epoch, metadata, topics_version = row
    members: dict[str, ConsumerMember] = {}
    target = {}
    for m in conn.execute(text(_MEMBERS), {"g": group_id}):
        members[m.member_id] = ConsumerMember(
            m.member_id,
            m.member_epoch,
            m.previous_member_epoch,
            m.state,
            m.rebalance_timeout_ms,
            frozenset(m.subscribed_topic_names),
            m.subscribed_topic_regex,
            m.server_assignor,
            _owned(m.assignment),
            assignment_of(m.pending_revocation),
            m.session_deadline_ms,
            m.rebalance_deadline_ms,
            m.instance_id,
            m.rack_id,
            m.client_id,
            m.client_host,
        )
        target[m.member_id] = assignment_of(m.target_assignment)
    return ConsumerGroup(group_id, group_epoch, assignment_epoch, members, metadata_of(metadata), target, topics_version)


def consumer_group_lock(conn: Connection, group_id: str, skip_locked: bool = False) -> ConsumerGroup | None:
    """The group, its row locked until the database transaction ends (None: no such group, or,
    with ``skip_locked``, another transaction holds it)."""
    return _load(conn, group_id, " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE")


def consumer_group(conn: Connection, group_id: str) -> ConsumerGroup | None:
    """The group as last written (no lock: for describing it)."""
    return _load(conn, group_id, "")


def consumer_group_share(conn: Connection, group_id: str) -> ConsumerGroup | None:
    """The group, its row locked FOR SHARE until the database transaction ends: no heartbeat or
    fencing (which lock it FOR UPDATE) changes it meanwhile, while other offset commits share it."""
    return _load(conn, group_id, " FOR SHARE")


def consumer_group_create(conn: Connection, group_id: str) -> None:
    """An empty group row, unless one exists (the caller locks it next)."""
    conn.execute(
        text(
            "INSERT INTO txlog.consumer_group_metadata (group_id, group_epoch, assignment_epoch) VALUES (:g, 0, 0) "
            "ON CONFLICT (group_id) DO NOTHING"
        ),
        {"g": group_id},
    )


def consumer_group_save(conn: Connection, old: ConsumerGroup | None, new: ConsumerGroup) -> None:
    """Writes ``new`` over ``old`` (as loaded under the lock): the group row, the members that
    changed, and the removal of those gone."""
    if old is None or (old.group_epoch, old.assignment_epoch, dict(old.subscription_metadata), old.topics_version) != (
        new.group_epoch,
        new.assignment_epoch,
        dict(new.subscription_metadata),
        new.topics_version,
    ):
        conn.execute(
            text(
                "UPDATE txlog.consumer_group_metadata SET group_epoch = :ge, assignment_epoch = :ae, "
                "subscription_metadata = CAST(:md AS jsonb), topics_version = :tv, updated_at = now() WHERE group_id = :g"
            ),
            {
                "g": new.group_id,
                "ge": new.group_epoch,
                "ae": new.assignment_epoch,
                "md": metadata_json(new.subscription_metadata),
                "tv": new.topics_version,
            },
        )
    old_members = {} if old is None else dict(old.members)
    old_target = {} if old is None else dict(old.target_assignment)
    gone = [m for m in old_members if m not in new.members]
    if gone:
        conn.execute(
            text("DELETE FROM txlog.consumer_group_member_metadata WHERE group_id = :g AND member_id = ANY(CAST(:ms AS text[]))"),
            {"g": new.group_id, "ms": gone},
        )
    for member_id, member in new.members.items():
        target = new.target_assignment.get(member_id, {})
        if old_members.get(member_id) == member and dict(old_target.get(member_id, {})) == dict(target):
            continue
        conn.execute(
            text(
                """
                INSERT INTO txlog.consumer_group_member_metadata
                  (group_id, member_id, instance_id, member_epoch, previous_member_epoch, state, rebalance_timeout_ms,
                   subscribed_topic_names, subscribed_topic_regex, server_assignor, assignment, pending_revocation,
                   target_assignment, session_deadline_ms, rebalance_deadline_ms, rack_id, client_id, client_host)
                VALUES (:g, :m, :inst, :e, :pe, :st, :rt, CAST(:subs AS text[]), :rx, :sa, CAST(:a AS jsonb),
                        CAST(:pr AS jsonb), CAST(:ta AS jsonb), :dl, :rdl, :rack, :cid, :host)
                ON CONFLICT (group_id, member_id) DO UPDATE SET
                  instance_id = EXCLUDED.instance_id, member_epoch = EXCLUDED.member_epoch,
                  previous_member_epoch = EXCLUDED.previous_member_epoch, state = EXCLUDED.state,
                  rebalance_timeout_ms = EXCLUDED.rebalance_timeout_ms,
                  subscribed_topic_names = EXCLUDED.subscribed_topic_names,
                  subscribed_topic_regex = EXCLUDED.subscribed_topic_regex, server_assignor = EXCLUDED.server_assignor,
                  assignment = EXCLUDED.assignment, pending_revocation = EXCLUDED.pending_revocation,
                  target_assignment = EXCLUDED.target_assignment, session_deadline_ms = EXCLUDED.session_deadline_ms,
                  rebalance_deadline_ms = EXCLUDED.rebalance_deadline_ms, rack_id = EXCLUDED.rack_id,
                  client_id = EXCLUDED.client_id, client_host = EXCLUDED.client_host
                """
            ),
            {
                "g": new.group_id,
                "m": member_id,
                "inst": member.instance_id,
                "e": member.member_epoch,
                "pe": member.previous_member_epoch,
                "st": member.state,
                "rt": member.rebalance_timeout_ms,
                "subs": sorted(member.subscribed_topic_names),
                "rx": member.subscribed_topic_regex,
                "sa": member.server_assignor,
                "a": _owned_json(member.owned),
                "pr": assignment_json(member.pending_revocation),
                "ta": assignment_json(target),
                "dl": member.session_deadline_ms,
                "rdl": member.rebalance_deadline_ms,
                "rack": member.rack_id,
                "cid": member.client_id,
                "host": member.client_host,
            },
        )


def consumer_group_ids(conn: Connection) -> list[str]:
    """Every consumer group of this protocol, by id."""
    return [r[0] for r in conn.execute(text("SELECT group_id FROM txlog.consumer_group_metadata ORDER BY group_id"))]


def groups_due(conn: Connection, now_ms: int, limit: int) -> list[str]:
    """Groups with a member whose session or rebalance deadline has passed (through the indexes)."""
    rows = conn.execute(
        text(
            "SELECT DISTINCT group_id FROM ("
            "(SELECT group_id FROM txlog.consumer_group_member_metadata WHERE session_deadline_ms <= :now "
            "ORDER BY session_deadline_ms LIMIT :n) UNION ALL "
            "(SELECT group_id FROM txlog.consumer_group_member_metadata WHERE rebalance_deadline_ms <= :now "
            "ORDER BY rebalance_deadline_ms LIMIT :n)) due"
        ),
        {"now": now_ms, "n": limit},
    )
    return [r[0] for r in rows]


def consumer_group_delete(conn: Connection, group_id: str) -> None:
    conn.execute(text("DELETE FROM txlog.consumer_group_metadata WHERE group_id = :g"), {"g": group_id})
