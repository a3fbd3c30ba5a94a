"""Consumer groups of the next-generation protocol (KIP-848) in PostgreSQL: ConsumerGroupHeartbeat,
the fencing of members past their session or rebalance timeout, describing and listing, and the
member-epoch checks of offset commits and fetches.

A heartbeat is one database transaction under the group row's lock: load the group, fence the
members whose deadline passed (lazily, as the group is touched; the sweeper fences those of groups
nobody touches), apply ``app.domain.groups.consumer_group.heartbeat``, write back what changed.
Nothing is kept in a gateway's memory: a gateway that restarts or dies loses nothing, and whichever
gateway FindCoordinator names next carries on with the members' epochs and assignments as they were.
Time is the database's clock (``Broker.now``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Collection, Sequence

from sqlalchemy.engine import Connection

from app.config import Settings
from app.domain.groups import consumer_group as cg
from app.domain.share_groups import TopicMetadata
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import consumer_groups as store
from app.storage import topics as topics_store

log = logging.getLogger("txlog.groups")

GROUP_TYPE, PROTOCOL_TYPE = cg.GROUP_TYPE, cg.PROTOCOL_TYPE


def config_of(settings: Settings) -> cg.ConsumerGroupConfig:
    return cg.ConsumerGroupConfig(
        session_timeout_ms=settings.kafka_consumer_group_session_timeout_ms,
        heartbeat_interval_ms=settings.kafka_consumer_group_heartbeat_interval_ms,
        max_size=settings.kafka_consumer_group_max_size,
    )


def _topics(conn: Connection, names: frozenset[str] | None) -> dict[str, TopicMetadata]:
    """The metadata of the topics named (None: of every topic)."""
    if names is not None and not names:
        return {}
    found = topics_store.topics_metadata(conn, None if names is None else sorted(names))
    return {t.name: TopicMetadata(t.name, t.topic_id, t.partitions) for t in found}


def _fence_due(conn: Connection, group: cg.ConsumerGroup, now_ms: int) -> tuple[cg.ConsumerGroup, list[str]]:
    due = cg.expired_members(group, now_ms)
    if due:
        version = topics_store.topics_version(conn)
        needed = cg.topics_needed(group, topics_version=version)
        topics = _topics(conn, needed)
        for member_id in due:
            group = cg.remove_member(group, member_id, topics)
        group = cg.matched_at(group, needed, version)
    return group, due


def heartbeat(broker: Broker, request: cg.HeartbeatRequest) -> cg.HeartbeatAnswer:
    """One ConsumerGroupHeartbeat. Raises ``TxlogError`` as Kafka answers (after persisting the
    fencing of due members it did on the way)."""
    cg.validate_heartbeat(request)
    config = config_of(broker.settings)
    error: TxlogError | None = None
    answer: cg.HeartbeatAnswer | None = None
    with broker.db.transaction() as conn:
        if request.member_epoch == cg.JOIN_EPOCH:
            store.consumer_group_create(conn, request.group_id)
        stored = store.consumer_group_lock(conn, request.group_id)
        now = broker.now()
        group, gone = (None, []) if stored is None else _fence_due(conn, stored, now)
        # A group subscribed by regular expression reads every topic only when the catalogue
        # moved since it last did (``cg.topics_needed``): the version is read before the topics.
        version = topics_store.topics_version(conn)
        needed = cg.topics_needed(group, request, version)
        try:
            outcome = cg.heartbeat(group, request, _topics(conn, needed), now, config)
        except TxlogError as exc:
            error = exc
            if group is not None and gone:
                store.consumer_group_save(conn, stored, group)
        else:
            store.consumer_group_save(conn, stored, cg.matched_at(outcome.group, needed, version))
            answer = outcome.answer
    if gone:
        log.info("consumer group %s: fenced %s", request.group_id, ", ".join(gone))
    if error is not None:
        raise error
    assert answer is not None
    return answer


def expire_members(broker: Broker, limit: int = 100) -> int:
    """The sweeper's duty: fences the members past their session or rebalance timeout (each group
    under its row lock, skipped if another transaction holds it: that one is a heartbeat, which
    fences them itself). How many members were fenced."""
    with broker.db.read() as conn:
        due = store.groups_due(conn, broker.now(), limit)
    fenced = 0
    for group_id in due:
        with broker.db.transaction() as conn:
            stored = store.consumer_group_lock(conn, group_id, skip_locked=True)
            if stored is None:
                continue
            group, gone = _fence_due(conn, stored, broker.now())
            if gone:
                store.consumer_group_save(conn, stored, group)
                log.info("consumer group %s: fenced %s", group_id, ", ".join(gone))
        fenced += len(gone)
    return fenced


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    group: cg.ConsumerGroup | None  # None: no such consumer group


def _current(conn: Connection, group_id: str, now_ms: int) -> cg.ConsumerGroup | None:
    """The group as last written, its members past their deadlines left out (not yet fenced)."""
    group = store.consumer_group(conn, group_id)
    if group is None:
        return None
    for member_id in cg.expired_members(group, now_ms):
        group = cg.remove_member(group, member_id, {})
    return group


def describe(broker: Broker, group_ids: Sequence[str]) -> list[DescribedGroup]:
    now = broker.now()
    with broker.db.read() as conn:
        return [DescribedGroup(group_id, _current(conn, group_id, now)) for group_id in group_ids]


def list_groups(broker: Broker) -> list[tuple[str, str]]:
    """(group id, state) of every consumer group of this protocol."""
    now = broker.now()
    with broker.db.read() as conn:
        out = []
        for group_id in store.consumer_group_ids(conn):
            group = _current(conn, group_id, now)
            if group is not None:
                out.append((group_id, group.state))
    return out


def consumer_group_ids(broker: Broker) -> set[str]:
    with broker.db.read() as conn:
        return set(store.consumer_group_ids(conn))


def live_group(broker: Broker, group_id: str) -> cg.ConsumerGroup | None:
    """The group if it is a consumer group of this protocol with members, else None (a classic
    group, or none: the classic coordinator's rules apply)."""
    with broker.db.read() as conn:
        group = _current(conn, group_id, broker.now())
    return group if group is not None and group.members else None


def check_offset_commit(
    broker: Broker,
    group_id: str,
    member_id: str,
    member_epoch: int,
    partitions: Collection[tuple[str, int]],
    transactional: bool,
    api_version: int,
) -> tuple[bool, ErrorCode | None]:
    """(whether the group is a consumer group of this protocol with members, the commit's refusal
    if it is one): ``cg.validate_offset_commit``, without a lock. A commit that passes is checked
    again where it is written (``offset_commit_fence``): a fence may fall between the two."""
    group = live_group(broker, group_id)
    if group is None:
        return False, None
    try:
        cg.validate_offset_commit(group, member_id, member_epoch, partitions, transactional, api_version)
    except TxlogError as exc:
        return True, exc.code
    return True, None


def offset_commit_fence(
    broker: Broker,
    group_id: str,
    member_id: str,
    member_epoch: int,
    partitions: Collection[tuple[str, int]],
    transactional: bool,
    api_version: int,
    conn: Connection,
) -> None:
    """The member check of an OffsetCommit or TxnOffsetCommit (``cg.validate_offset_commit``),
    inside the database transaction that writes its offsets (``conn``): the group's row is held
    FOR SHARE from the check to the write's end, so a heartbeat or a fencing (FOR UPDATE) falls
    either before the check, which then sees it, or after the write. Members past their deadlines
    count as fenced; a group gone meanwhile has no members. Raises ``TxlogError`` as Kafka answers."""
    group = store.consumer_group_share(conn, group_id) or cg.ConsumerGroup(group_id)
    now = broker.now()
    for expired in cg.expired_members(group, now):
        group = cg.remove_member(group, expired, {})
    cg.validate_offset_commit(group, member_id, member_epoch, partitions, transactional, api_version)


def check_offset_fetch(broker: Broker, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode | None:
    """OffsetFetch v9's member check (``cg.validate_offset_fetch``) when the group is a consumer
    group of this protocol with members; None otherwise."""
    if not member_id and member_epoch < 0:
        return None
    group = live_group(broker, group_id)
    if group is None:
        return None
    try:
        cg.validate_offset_fetch(group, member_id, member_epoch)
    except TxlogError as exc:
        return exc.code
    return None


def claim_for_classic(broker: Broker, group_id: str) -> bool:
    """A classic member joins ``group_id``: refused (False) while it is a consumer group of this
    protocol with members; an empty one is dropped, as Kafka turns an empty group into the type of
    the member that joins it."""
    with broker.db.transaction() as conn:
        stored = store.consumer_group_lock(conn, group_id)
        if stored is None:
            return True
        group, _ = _fence_due(conn, stored, broker.now())
        if group.members:
            if group is not stored:
                store.consumer_group_save(conn, stored, group)
            return False
        store.consumer_group_delete(conn, group_id)
        return True


def delete_group(broker: Broker, group_id: str) -> bool:
    """DeleteGroups' part of a consumer group of this protocol: NON_EMPTY_GROUP while it has
    members; an empty one's membership goes (its offsets are the caller's). Whether it was one."""
    with broker.db.transaction() as conn:
        stored = store.consumer_group_lock(conn, group_id)
        if stored is None:
            return False
        group, _ = _fence_due(conn, stored, broker.now())
        if group.members:
            raise TxlogError(ErrorCode.NON_EMPTY_GROUP, "The group is not empty.")
        store.consumer_group_delete(conn, group_id)
        return True
