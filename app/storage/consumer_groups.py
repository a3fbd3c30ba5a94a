"""Consumer groups of the next-generation protocol (KIP-848): the group row (epochs, subscription
metadata) and its members (epochs, reconciliation state, subscriptions, owned, revoking and target
partitions, deadlines).

The rows are read and written as every member-epoch group's (``app.storage.member_epoch_groups``):
the group row's lock (``GROUPS.lock``) is held for every change of the group, a heartbeat
loads the group under it, applies the domain's rules (``app.domain.groups.consumer_group``) and
writes back what changed, so any gateway serves any group and none holds its truth in memory. An
offset commit holds the row FOR SHARE (``GROUPS.share_lock``) from its member check to its write.
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
from app.storage.member_epoch_groups import SUBSCRIBED_TOPIC_NAMES, Column, MemberEpochGroups, assignment_json, assignment_of


def _owned_json(owned: OwnedPartitions) -> str:
    return json.dumps({str(t): {str(p): e for p, e in sorted(ps.items())} for t, ps in sorted(owned.items()) if ps})


def _owned(value: Mapping[str, Any]) -> OwnedPartitions:
    return {uuid.UUID(t): {int(p): int(e) for p, e in ps.items()} for t, ps in value.items()}


GROUPS: MemberEpochGroups[ConsumerGroup, ConsumerMember] = MemberEpochGroups(
    "txlog.consumer_group_metadata",
    "txlog.consumer_group_member_metadata",
    ConsumerGroup,
    ConsumerMember,
    (
        Column("instance_id"),
        Column("member_epoch"),
        Column("previous_member_epoch"),
        Column("state"),
        Column("rebalance_timeout_ms"),
        SUBSCRIBED_TOPIC_NAMES,
        Column("subscribed_topic_regex"),
        Column("server_assignor"),
        Column("assignment", "jsonb", _owned_json, _owned, field="owned"),
        Column("pending_revocation", "jsonb", assignment_json, assignment_of),
        Column("session_deadline_ms"),
        Column("rebalance_deadline_ms"),
        Column("rack_id"),
        Column("client_id"),
        Column("client_host"),
    ),
    ("topics_version",),
)


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
