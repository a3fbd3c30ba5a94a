"""Consumer groups of the next-generation protocol (KIP-848) in PostgreSQL: ConsumerGroupHeartbeat,
the fencing of members past their session or rebalance timeout, describing and listing, and the
member-epoch checks of offset commits and fetches.

A heartbeat is one database transaction under the group row's lock (``member_epoch_groups``, as a
share group's): load the group, fence the members whose deadline passed (lazily, as the group is
touched; the sweeper fences those of groups nobody touches), apply ``app.domain.groups.consumer_group.heartbeat``, write back what changed.
Nothing is kept in a gateway's memory: a gateway that restarts or dies loses nothing, and whichever
gateway FindCoordinator names next carries on with the members' epochs and assignments as they were.
Time is the database's clock (``Broker.now``).
"""

from __future__ import annotations

import functools
import logging
from typing import Collection, Sequence

from sqlalchemy.engine import Connection

from app.config import Settings
from app.domain.groups import consumer_group as cg
from app.domain.share_groups import HeartbeatAnswer
from app.errors import ErrorCode, TxlogError
from app.services import Broker, member_epoch_groups
from app.services.member_epoch_groups import DescribedGroup
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


def _fence_due(conn: Connection, group: cg.ConsumerGroup, now_ms: int) -> tuple[cg.ConsumerGroup, list[str]]:
    due = cg.expired_members(group, now_ms)
    if due:
        version = topics_store.topics_version(conn)
        needed = cg.topics_needed(group, topics_version=version)
        topics = member_epoch_groups.topics(conn, needed)
        for member_id in due:
            group = cg.remove_member(group, member_id, topics)
        group = cg.matched_at(group, needed, version)
    return group, due


def heartbeat(broker: Broker, request: cg.HeartbeatRequest) -> HeartbeatAnswer:
    """One ConsumerGroupHeartbeat. Raises ``TxlogError`` as Kafka answers (after persisting the
    fencing of due members it did on the way)."""
    cg.validate_heartbeat(request)
    config = config_of(broker.settings)

    def beat(conn: Connection, group: cg.ConsumerGroup | None, now: int) -> tuple[cg.ConsumerGroup, HeartbeatAnswer]:
        # A group subscribed by regular expression reads every topic only when the catalogue
        # moved since it last did (``cg.topics_needed``): the version is read before the topics.
        version = topics_store.topics_version(conn)
        needed = cg.topics_needed(group, request, version)
        outcome = cg.heartbeat(group, request, member_epoch_groups.topics(conn, needed), now, config)
        return cg.matched_at(outcome.group, needed, version), outcome.answer

    def ended(gone: list[str], answered: bool) -> None:
        _log_fenced(request.group_id, gone)

    joining = request.member_epoch == cg.JOIN_EPOCH
    return member_epoch_groups.heartbeat(broker, request.group_id, joining, store.GROUPS, _fence_due, beat, ended)


def expire_members(broker: Broker, limit: int = 100) -> int:
    """The sweeper's duty: fences the members past their session or rebalance timeout
    (``member_epoch_groups.fence_due_groups``). How many members were fenced."""
    due = functools.partial(store.groups_due, limit=limit)
    return member_epoch_groups.fence_due_groups(broker, store.GROUPS, due, _fence_due, _log_fenced)


def _log_fenced(group_id: str, gone: list[str]) -> None:
    if gone:
        log.info("consumer group %s: fenced %s", group_id, ", ".join(gone))


def _live(group: cg.ConsumerGroup, now_ms: int) -> cg.ConsumerGroup:
    """The group, its members past their deadlines left out (not yet fenced)."""
    for member_id in cg.expired_members(group, now_ms):
        group = cg.remove_member(group, member_id, {})
    return group


def _current(conn: Connection, group_id: str, now_ms: int) -> cg.ConsumerGroup | None:
    """The group as last written, its members past their deadlines left out."""
    group = store.GROUPS.get(conn, group_id)
    return None if group is None else _live(group, now_ms)


def describe(broker: Broker, group_ids: Sequence[str]) -> list[DescribedGroup[cg.ConsumerGroup]]:
    now = broker.now()
    with broker.db.read() as conn:
        return [DescribedGroup(group_id, _current(conn, group_id, now)) for group_id in group_ids]


def list_groups(broker: Broker) -> list[tuple[str, str]]:
    """(group id, state) of every consumer group of this protocol."""
    now = broker.now()
    with broker.db.read() as conn:
        out = []
        for group_id in store.GROUPS.ids(conn):
            group = _current(conn, group_id, now)
            if group is not None:
                out.append((group_id, group.state))
    return out


def consumer_group_ids(broker: Broker) -> set[str]:
    with broker.db.read() as conn:
        return set(store.GROUPS.ids(conn))


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
    group = _live(store.GROUPS.share_lock(conn, group_id) or cg.ConsumerGroup(group_id), broker.now())
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
        stored = store.GROUPS.lock(conn, group_id)
        if stored is None:
            return True
        group, _ = _fence_due(conn, stored, broker.now())
        if group.members:
            if group is not stored:
                store.GROUPS.save(conn, stored, group)
            return False
        store.GROUPS.delete(conn, group_id)
        return True


def delete_group(broker: Broker, group_id: str) -> bool:
    """DeleteGroups' part of a consumer group of this protocol: NON_EMPTY_GROUP while it has
    members; an empty one's membership goes (its offsets are the caller's). Whether it was one."""
    with broker.db.transaction() as conn:
        stored = store.GROUPS.lock(conn, group_id)
        if stored is None:
            return False
        group, _ = _fence_due(conn, stored, broker.now())
        if group.members:
            raise TxlogError(ErrorCode.NON_EMPTY_GROUP, "The group is not empty.")
        store.GROUPS.delete(conn, group_id)
        return True
