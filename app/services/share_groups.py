"""Share groups' membership (KIP-932) in PostgreSQL: ShareGroupHeartbeat, session expiry, describe.

A heartbeat is one database transaction under the group row's lock (``member_epoch_groups``, as a
consumer group's): load the group, apply ``app.domain.share_groups.heartbeat`` (the members whose
session ended first fenced: lazily, as the group is touched), write back what changed. Any
gateway serves any share group; a gateway killed loses nothing, its members' sessions end (by the
database's clock) and their records are given back (``share_locks.release_member``), by the next
heartbeat of the group or by the sweeper.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Sequence, TypeVar

from sqlalchemy.engine import Connection

from app.domain import share_groups as sg
from app.domain.share_configs import config_of
from app.errors import ErrorCode, TxlogError
from app.services import Broker, member_epoch_groups, share_admin, share_locks
from app.services.executor import Operation
from app.services.member_epoch_groups import DescribedGroup
from app.storage import share as share_store
from app.storage import share_groups as store

T = TypeVar("T")

log = logging.getLogger("txlog.share")

GROUP_TYPE, PROTOCOL_TYPE = sg.GROUP_TYPE, sg.PROTOCOL_TYPE


def _fence_expired(conn: Connection, group: sg.ShareGroup, now_ms: int) -> tuple[sg.ShareGroup, list[str]]:
    expired = sg.expired_members(group, now_ms)
    for member_id in expired:
        group = sg.fence(group, member_id, member_epoch_groups.topics(conn, sg.topics_needed(group)))
    return group, expired


def _release(broker: Broker, group_id: str, members: Sequence[str]) -> None:
    for member_id in members:
        share_locks.release_member(broker, group_id, member_id)


def heartbeat(broker: Broker, request: sg.HeartbeatRequest) -> sg.HeartbeatAnswer:
    """One ShareGroupHeartbeat. Raises ``TxlogError`` as Kafka answers (after persisting the
    fencing of expired members it did on the way). The records of a member that left or was fenced
    are given back once the membership change is committed."""
    sg.validate_heartbeat(request)

    def beat(conn: Connection, group: sg.ShareGroup | None, now: int) -> tuple[sg.ShareGroup, sg.HeartbeatAnswer]:
        config = config_of(share_store.share_group_configs(conn, request.group_id))
        topics = member_epoch_groups.topics(conn, sg.topics_needed(group, request))
        outcome = sg.heartbeat(group, request, topics, now, config.membership)
        return outcome.group, outcome.answer

    def ended(gone: list[str], answered: bool) -> None:
        left = [request.member_id] if answered and request.member_epoch == sg.LEAVE_EPOCH else []
        _release(broker, request.group_id, [*gone, *left])

    joining = request.member_epoch == sg.JOIN_EPOCH
    return member_epoch_groups.heartbeat(broker, request.group_id, joining, store.GROUPS, _fence_expired, beat, ended)


def expire_sessions(broker: Broker, limit: int = 100) -> int:
    """The sweeper's duty: fences the members whose session ended
    (``member_epoch_groups.fence_due_groups``) and gives back their records. How many members were
    fenced."""
    due = functools.partial(store.groups_with_expired_sessions, limit=limit)
    return member_epoch_groups.fence_due_groups(broker, store.GROUPS, due, _fence_expired, functools.partial(_release, broker))


def describe(broker: Broker, group_ids: Sequence[str]) -> list[DescribedGroup[sg.ShareGroup]]:
    """Each group's membership as last written, its expired members left out (not yet fenced)."""
    now = broker.now()
    out = []
    with broker.db.read() as conn:
        for group_id in group_ids:
            group = store.GROUPS.get(conn, group_id)
            if group is not None:
                group, _ = _fence_expired(conn, group, now)
            out.append(DescribedGroup(group_id, group))
    return out


def list_groups(broker: Broker) -> list[tuple[str, str]]:
    """(group id, state) of every share group: with membership, share-partition state or configs."""
    now = broker.now()
    with broker.db.read() as conn:
        ids = sorted(set(store.GROUPS.ids(conn)) | set(share_store.share_group_ids(conn)))
        out = []
        for group_id in ids:
            group = store.GROUPS.get(conn, group_id)
            live = group is not None and any(m.session_deadline_ms > now for m in group.members.values())
            out.append((group_id, sg.STABLE if live else sg.EMPTY))
    return out


def while_empty(broker: Broker, group_id: str, change: Callable[[Connection], T]) -> T:
    """``change(conn)`` in one database transaction that holds the group's row lock, and only
    while the group has no member whose session runs (NON_EMPTY_GROUP otherwise): Kafka's condition
    for altering or deleting a share group's offsets. A member joining meanwhile waits for the
    change, as every heartbeat takes the same lock first."""
    now = broker.now()
    with broker.db.transaction() as conn:
        store.GROUPS.create(conn, group_id)
        group = store.GROUPS.lock(conn, group_id)
        if group is not None and any(m.session_deadline_ms > now for m in group.members.values()):
            raise TxlogError(ErrorCode.NON_EMPTY_GROUP, f"The share group {group_id} is not empty.")
        return change(conn)


def is_member_steps(group_id: str, member_id: str, now: int) -> Operation[bool]:
    """Whether ``member_id`` is in the share group now (joined, its session not ended): what a
    Kafka client's ShareFetch and ShareAcknowledge need (``sg.in_group``). One key lookup, one
    statement in autocommit (every ShareFetch asks), awaited on the caller's event loop where it
    has a connection (``app.services.executor``)."""
    deadline = yield store.share_member_session_deadline(group_id, member_id)
    return sg.in_group(deadline, now)


def is_share_group(broker: Broker, group_id: str) -> bool:
    """Whether the group is a share group: it has a membership row, share-partition state or
    share configs."""
    with broker.db.read() as conn:
        return store.share_group_exists(conn, group_id)


def delete_group(broker: Broker, group_id: str) -> None:
    """DeleteGroups of a share group: refused (NON_EMPTY_GROUP) while it has members; else its
    membership, share-partition state and configs go."""
    with broker.db.transaction() as conn:
        stored = store.GROUPS.lock(conn, group_id)
        if stored is not None:
            group, _ = _fence_expired(conn, stored, broker.now())
            if group.members:
                raise TxlogError(ErrorCode.NON_EMPTY_GROUP, "The group is not empty.")
            store.GROUPS.delete(conn, group_id)
    share_admin.delete_group(broker, group_id)
