"""What the services of the groups whose coordinator assigns by member epochs do alike (consumer
groups of the next-generation protocol, ``consumer_groups``; share groups, ``share_groups``): a
heartbeat is one database transaction under the group row's lock, and the sweeper fences the
members past their deadlines group by group, each under its lock. What differs (the domain's
heartbeat, what it reads, the fencing's rules, what follows a member's end) is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

from sqlalchemy.engine import Connection

from app.domain.share_groups import HeartbeatAnswer, TopicMetadata
from app.errors import TxlogError
from app.services import Broker
from app.storage import topics as topics_store
from app.storage.member_epoch_groups import MemberEpochGroup, MemberEpochGroups

G = TypeVar("G", bound=MemberEpochGroup)

# The group with its members past their deadlines fenced, and their ids (none: the group as given).
Fence = Callable[[Connection, G, int], tuple[G, list[str]]]


@dataclass(frozen=True)
class DescribedGroup(Generic[G]):
    group_id: str
    group: G | None  # None: no such group


def heartbeat(
    broker: Broker,
    group_id: str,
    joining: bool,
    groups: MemberEpochGroups[G, Any],
    fence_due: Fence[G],
    beat: Callable[[Connection, G | None, int], tuple[G, HeartbeatAnswer]],
    ended: Callable[[list[str], bool], None],
) -> HeartbeatAnswer:
    """One heartbeat, in one database transaction: the group row created when a member joins (a
    group that does not exist is None to ``beat``), locked, its members past their deadlines
    fenced (lazily, as the group is touched), ``beat`` applied (the domain's heartbeat, with what it
    reads: the group to write and the answer) and what changed written back. A heartbeat the
    domain refuses writes the fencing it did on the way alone, and raises its ``TxlogError`` once
    ``ended`` is told, after the commit, of the members fenced and whether the heartbeat was
    answered."""
    error: TxlogError | None = None
    with broker.db.transaction() as conn:
        if joining:
            groups.create(conn, group_id)
        stored = groups.lock(conn, group_id)
        now = broker.now()
        group, gone = (None, []) if stored is None else fence_due(conn, stored, now)
        try:
            written, answer = beat(conn, group, now)
        except TxlogError as exc:
            error = exc
            if group is not None and gone:
                groups.save(conn, stored, group)
        else:
            groups.save(conn, stored, written)
    ended(gone, error is None)
    if error is not None:
        raise error
    return answer


def fence_due_groups(
    broker: Broker,
    groups: MemberEpochGroups[G, Any],
    due: Callable[[Connection, int], Sequence[str]],
    fence_due: Fence[G],
    fenced: Callable[[str, list[str]], None],
) -> int:
    """The sweeper's duty: each group ``due`` finds (at the database's time) under its row lock
    (skipped if another transaction holds it: that one is a heartbeat, which fences them itself),
    its members past their deadlines fenced and written back, then ``fenced`` told of them once
    committed. How many members were fenced."""
    with broker.db.read() as conn:
        group_ids = due(conn, broker.now())
    count = 0
    for group_id in group_ids:
        with broker.db.transaction() as conn:
            stored = groups.lock(conn, group_id, skip_locked=True)
            if stored is None:
                continue
            group, gone = fence_due(conn, stored, broker.now())
            if gone:
                groups.save(conn, stored, group)
        fenced(group_id, gone)
        count += len(gone)
    return count


def topics(conn: Connection, names: frozenset[str] | None) -> dict[str, TopicMetadata]:
    """The metadata of the topics named (None: of every topic)."""
    if names is not None and not names:
        return {}
    found = topics_store.topics_metadata(conn, None if names is None else sorted(names))
    return {t.name: TopicMetadata(t.name, t.topic_id, t.partitions) for t in found}
