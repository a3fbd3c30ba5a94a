"""Share groups' membership (KIP-932) in PostgreSQL: ShareGroupHeartbeat, session expiry, describe.

A heartbeat is one database transaction under the group row's lock: load the group, apply
``app.domain.share_groups.heartbeat`` (the members whose session ended first fenced: lazily, as
the group is touched), write back what changed. Any gateway serves any share group; a gateway
killed loses nothing, its members' sessions end (by the database's clock) and their records are
given back (``share_locks.release_member``), by the next heartbeat of the group or by the sweeper.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from sqlalchemy.engine import Connection

from app.domain import share_groups as sg
from app.domain.share_configs import config_of
from app.errors import ErrorCode, TxlogError
from app.services import Broker, share_admin, share_locks
from app.storage import share as share_store
from app.storage import share_groups as store
from app.storage import topics as topics_store

T = TypeVar("T")

log = logging.getLogger("txlog.share")

GROUP_TYPE, PROTOCOL_TYPE = sg.GROUP_TYPE, sg.PROTOCOL_TYPE


def _topics(conn: Connection, names: frozenset[str]) -> dict[str, sg.TopicMetadata]:
    if not names:
        return {}
    return {t.name: sg.TopicMetadata(t.name, t.topic_id, t.partitions) for t in topics_store.topics_metadata(conn, sorted(names))}


def _fence_expired(conn: Connection, group: sg.ShareGroup, now_ms: int) -> tuple[sg.ShareGroup, list[str]]:
    expired = sg.expired_members(group, now_ms)
    for member_id in expired:
        group = sg.fence(group, member_id, _topics(conn, sg.topics_needed(group)))
    return group, expired


def _release(broker: Broker, group_id: str, members: Sequence[str]) -> None:
    for member_id in members:
        share_locks.release_member(broker, group_id, member_id)


def heartbeat(broker: Broker, request: sg.HeartbeatRequest) -> sg.HeartbeatAnswer:
    """One ShareGroupHeartbeat. Raises ``TxlogError`` as Kafka answers (after persisting the
    fencing of expired members it did on the way). The records of a member that left or was fenced
    are given back once the membership change is committed."""
    sg.validate_heartbeat(request)
    error: TxlogError | None = None
    answer: sg.HeartbeatAnswer | None = None
    with broker.db.transaction() as conn:
        if request.member_epoch == sg.JOIN_EPOCH:
            store.share_group_create(conn, request.group_id)
        stored = store.share_group_lock(conn, request.group_id)
        config = config_of(share_store.share_group_configs(conn, request.group_id))
        now = broker.now()
        group, gone = (None, []) if stored is None else _fence_expired(conn, stored, now)
        try:
            outcome = sg.heartbeat(group, request, _topics(conn, sg.topics_needed(group, request)), now, config.membership)
        except TxlogError as exc:
            error = exc
            if group is not None and gone:
                store.share_group_save(conn, stored, group)
        else:
            store.share_group_save(conn, stored, outcome.group)
            answer = outcome.answer
            if request.member_epoch == sg.LEAVE_EPOCH:
                gone.append(request.member_id)
    _release(broker, request.group_id, gone)
    if error is not None:
        raise error
    assert answer is not None
    return answer


def expire_sessions(broker: Broker, limit: int = 100) -> int:
    """The sweeper's duty: fences the members whose session ended (each group under its row lock,
    skipped if another transaction holds it: that one is a heartbeat, which fences them itself) and
    gives back their records. How many members were fenced."""
    with broker.db.read() as conn:
        due = store.groups_with_expired_sessions(conn, broker.now(), limit)
    fenced = 0
    for group_id in due:
        with broker.db.transaction() as conn:
            stored = store.share_group_lock(conn, group_id, skip_locked=True)
            if stored is None:
                continue
            group, gone = _fence_expired(conn, stored, broker.now())
            if gone:
                store.share_group_save(conn, stored, group)
        _release(broker, group_id, gone)
        fenced += len(gone)
    return fenced


@dataclass(frozen=True)
class DescribedGroup:
    group_id: str
    group: sg.ShareGroup | None  # None: no such share group


def describe(broker: Broker, group_ids: Sequence[str]) -> list[DescribedGroup]:
    """Each group's membership as last written, its expired members left out (not yet fenced)."""
    now = broker.now()
    out = []
    with broker.db.read() as conn:
        for group_id in group_ids:
            group = store.share_group(conn, group_id)
            if group is not None:
                group, _ = _fence_expired(conn, group, now)
            out.append(DescribedGroup(group_id, group))
    return out


def list_groups(broker: Broker) -> list[tuple[str, str]]:
    """(group id, state) of every share group: with membership, share-partition state or configs."""
    now = broker.now()
    with broker.db.read() as conn:
        ids = sorted(set(store.share_group_ids(conn)) | set(share_store.share_group_ids(conn)))
        out = []
        for group_id in ids:
            group = store.share_group(conn, group_id)
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
        store.share_group_create(conn, group_id)
        group = store.share_group_lock(conn, group_id)
        if group is not None and any(m.session_deadline_ms > now for m in group.members.values()):
            raise TxlogError(ErrorCode.NON_EMPTY_GROUP, f"The share group {group_id} is not empty.")
        return change(conn)


def is_member(broker: Broker, group_id: str, member_id: str) -> bool:
    """Whether ``member_id`` is in the share group now (joined, its session not ended): what a
    Kafka client's ShareFetch and ShareAcknowledge need (``sg.in_group``). One key lookup, one
    statement in autocommit (its own snapshot; no BEGIN or COMMIT round trips: every ShareFetch
    asks)."""
    with broker.db.autocommit() as conn:
        deadline = store.share_member_session_deadline(conn, group_id, member_id)
    return sg.in_group(deadline, broker.now())


def is_share_group(broker: Broker, group_id: str) -> bool:
    """Whether the group is a share group: it has a membership row, share-partition state or
    share configs."""
    with broker.db.read() as conn:
        return store.share_group_exists(conn, group_id)


def delete_group(broker: Broker, group_id: str) -> None:
    """DeleteGroups of a share group: refused (NON_EMPTY_GROUP) while it has members; else its
    membership, share-partition state and configs go."""
    with broker.db.transaction() as conn:
        stored = store.share_group_lock(conn, group_id)
        if stored is not None:
            group, _ = _fence_expired(conn, stored, broker.now())
            if group.members:
                raise TxlogError(ErrorCode.NON_EMPTY_GROUP, "The group is not empty.")
            store.share_group_delete(conn, group_id)
    share_admin.delete_group(broker, group_id)
