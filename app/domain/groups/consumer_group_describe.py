"""ConsumerGroupDescribe's view of a consumer group of the next-generation protocol (KIP-848), and
the topics it names (whose Describe ACLs the answer needs). Pure, no I/O."""

from __future__ import annotations

from typing import Any

from app.domain.groups.consumer_group import ConsumerGroup
from app.domain.share_groups import NO_PARTITIONS, topic_partitions


def described_topics(group: ConsumerGroup) -> frozenset[str]:
    """The topics a description of the group names: its members' subscriptions and assignments."""
    names = {t.topic_id: t.name for t in group.subscription_metadata.values()}
    out: set[str] = set()
    for m in group.members.values():
        out |= m.subscribed_topic_names
        out |= {names[t] for t in m.owned if t in names}
    return frozenset(out)


def describe(group: ConsumerGroup, version: int = 1) -> dict[str, Any]:
    """The group as ConsumerGroupDescribe describes it (a ``groups`` entry, without
    ``authorized_operations``, which is the caller's)."""
    names = {t.topic_id: t.name for t in group.subscription_metadata.values()}
    return {
        "group_id": group.group_id,
        "group_state": group.state,
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor_name": group.assignor,
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack_id,
                "member_epoch": m.member_epoch,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "subscribed_topic_names": sorted(m.subscribed_topic_names),
                "subscribed_topic_regex": m.subscribed_topic_regex,
                "assignment": {"topic_partitions": topic_partitions(m.assignment, names)},
                "target_assignment": {
                    "topic_partitions": topic_partitions(group.target_assignment.get(m.member_id, NO_PARTITIONS), names)
                },
                "member_type": 1 if version >= 1 else -1,  # 1: the consumer protocol (0 is classic)
            }
            for _, m in sorted(group.members.items())
        ],
    }
