"""The server-side assignors of consumer groups of the next-generation protocol (KIP-848): Kafka's
``uniform`` and ``range``, as pure functions from the members' subscriptions and the subscribed
topics' metadata to every member's target assignment. No I/O."""

from __future__ import annotations

import uuid
from typing import Collection, Iterable, Mapping

from app.domain.share_groups import NO_PARTITIONS, Assignment, TopicMetadata

UNIFORM, RANGE = "uniform", "range"
ASSIGNORS = (UNIFORM, RANGE)  # group.consumer.assignors: the first is the default


def assign(
    name: str,
    subscriptions: Mapping[str, Collection[str]],
    topics: Mapping[str, TopicMetadata],
    current: Mapping[str, Assignment],
    instance_ids: Mapping[str, str | None] | None = None,
) -> dict[str, Assignment]:
    """The target assignment of every member by the server assignor ``name`` (every member
    present, each partition of a subscribed topic given to exactly one member subscribed to it).
    ``instance_ids``: the static members' instance ids, by member id (range orders by them)."""
    if name == RANGE:
        return assign_range(subscriptions, topics, instance_ids or {})
    return assign_uniform(subscriptions, topics, current)


def _partitions(names: Iterable[str], topics: Mapping[str, TopicMetadata]) -> list[tuple[uuid.UUID, int]]:
    return [(topics[n].topic_id, p) for n in sorted(set(names)) if n in topics for p in range(topics[n].partitions)]


def _as_assignment(held: Mapping[str, Iterable[tuple[uuid.UUID, int]]]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {}
    for member_id, tps in held.items():
        by_topic: dict[uuid.UUID, set[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, set()).add(p)
        out[member_id] = {t: frozenset(ps) for t, ps in sorted(by_topic.items())}
    return out


def assign_uniform(
    subscriptions: Mapping[str, Collection[str]], topics: Mapping[str, TopicMetadata], current: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Kafka's uniform assignor's aims: as even a spread of partitions over the members as their
    subscriptions allow, each member keeping what it held where that keeps the balance. Members
    by id, partitions by topic name and index, so the same input gives the same assignment."""
    member_ids = sorted(subscriptions)
    topic_of = {t.topic_id: name for name, t in topics.items()}
    eligible: dict[tuple[uuid.UUID, int], list[str]] = {}
    for member_id in member_ids:
        for tp in _partitions(subscriptions[member_id], topics):
            eligible.setdefault(tp, []).append(member_id)
    ordered = sorted(eligible, key=lambda tp: (topic_of[tp[0]], tp[1]))
    owner: dict[tuple[uuid.UUID, int], str] = {}
    held: dict[str, list[tuple[uuid.UUID, int]]] = {m: [] for m in member_ids}
    # 1. what each member held and may still hold
    for member_id in member_ids:
        for t, ps in sorted(current.get(member_id, NO_PARTITIONS).items()):
            for p in sorted(ps):
                if (t, p) in eligible and member_id in eligible[(t, p)] and (t, p) not in owner:
                    owner[(t, p)] = member_id
                    held[member_id].append((t, p))
    # 2. the rest, each to the least loaded member that may take it
    for tp in ordered:
        if tp not in owner:
            taker = min(eligible[tp], key=lambda m: (len(held[m]), m))
            owner[tp] = taker
            held[taker].append(tp)
    # 3. from the most loaded to the least loaded, while that narrows the gap
    moved = True
    while moved:
        moved = False
        for tp in reversed(ordered):
            giver = owner[tp]
            taker = min(eligible[tp], key=lambda m: (len(held[m]), m))
            if len(held[giver]) - len(held[taker]) > 1:
                held[giver].remove(tp)
                held[taker].append(tp)
                owner[tp] = taker
                moved = True
    return _as_assignment(held)


def assign_range(
    subscriptions: Mapping[str, Collection[str]], topics: Mapping[str, TopicMetadata], instance_ids: Mapping[str, str | None]
) -> dict[str, Assignment]:
    """Kafka's range assignor: each topic's partitions in contiguous ranges over the members
    subscribed to it (by instance id, else member id), the first ones taking one more when they
    do not divide evenly; members with the same subscriptions get the same partition numbers of
    co-partitioned topics."""

    def key(member_id: str) -> tuple[str, str]:
        return (instance_ids.get(member_id) or member_id, member_id)

    held: dict[str, list[tuple[uuid.UUID, int]]] = {m: [] for m in subscriptions}
    for name in sorted(topics):
        subscribers = sorted((m for m, names in subscriptions.items() if name in names), key=key)
        if not subscribers:
            continue
        count = topics[name].partitions
        quota, extra = divmod(count, len(subscribers))
        start = 0
        for index, member_id in enumerate(subscribers):
            size = quota + (1 if index < extra else 0)
            held[member_id].extend((topics[name].topic_id, p) for p in range(start, start + size))
            start += size
    return _as_assignment(held)
