"""The storage of groups whose coordinator assigns by member epochs (consumer groups of the
next-generation protocol, KIP-848; share groups, KIP-932): a group row (group and assignment
epochs, subscription metadata, and what else the kind keeps) and a row per member (its fields,
and its target assignment), in the tables of the kind of group.

The group row's lock (``lock``) is held for every change of the group: a heartbeat loads the group
under it, applies the domain's rules and writes back what changed (``save``), so any process
serves any group and none holds its truth in memory.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.domain.share_groups import Assignment, TopicMetadata

# The JSON forms of an assignment (topic id -> partitions) and of subscription metadata (topic name
# -> topic id and partition count), as both kinds store them.


def assignment_json(assignment: Assignment) -> str:
    return json.dumps({str(t): sorted(ps) for t, ps in sorted(assignment.items())})


def assignment_of(value: Mapping[str, Any]) -> Assignment:
    return {uuid.UUID(t): frozenset(int(p) for p in ps) for t, ps in value.items()}


def metadata_json(metadata: Mapping[str, TopicMetadata]) -> str:
    return json.dumps({n: {"topic_id": str(t.topic_id), "partitions": t.partitions} for n, t in sorted(metadata.items())})


def metadata_of(value: Mapping[str, Any]) -> dict[str, TopicMetadata]:
    return {n: TopicMetadata(n, uuid.UUID(t["topic_id"]), int(t["partitions"])) for n, t in value.items()}


class MemberEpochGroup(Protocol):
    """What the store reads of a group: ``ShareGroup`` and ``ConsumerGroup`` have it."""

    @property
    def group_id(self) -> str: ...
    @property
    def group_epoch(self) -> int: ...
    @property
    def assignment_epoch(self) -> int: ...
    @property
    def members(self) -> Mapping[str, Any]: ...
    @property
    def subscription_metadata(self) -> Mapping[str, TopicMetadata]: ...
    @property
    def target_assignment(self) -> Mapping[str, Assignment]: ...


G = TypeVar("G", bound=MemberEpochGroup)
M = TypeVar("M")


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Column:
    """A column of a member's row: the member's field it holds, the SQL type its parameter is cast
    to (None: none), and how the field is written to it and read back."""

    name: str
    cast: str | None = None
    write: Callable[[Any], Any] = _same
    read: Callable[[Any], Any] = _same
    field: str = ""  # the member's field (none: the column's name)

    @property
    def attribute(self) -> str:
        return self.field or self.name


SUBSCRIBED_TOPIC_NAMES = Column("subscribed_topic_names", "text[]", sorted, frozenset)


@dataclass(frozen=True)
class MemberEpochGroups(Generic[G, M]):
    """The tables of one kind of group and the codec of its members."""

    group_table: str
    member_table: str
    # The group from its id, epochs, members, subscription metadata, target assignment and
    # ``group_columns``
    group_of: Callable[..., G]
    member_of: Callable[..., M]  # a member from its id and its ``member_columns``' fields
    member_columns: tuple[Column, ...]  # the member row's columns but group id, member id and target
    group_columns: tuple[str, ...] = ()  # the group row's further columns, each a field of the group

    def _load(self, conn: Connection, group_id: str, lock: str) -> G | None:
        extra = "".join(f", {c}" for c in self.group_columns)
        row = conn.execute(
            text(
                f"SELECT group_epoch, assignment_epoch, subscription_metadata{extra} FROM {self.group_table} "
                f"WHERE group_id = :g{lock}"
            ),
            {"g": group_id},
        ).fetchone()
        if row is None:
            return None
        group_epoch, assignment_epoch, metadata, *further = row
        columns = ", ".join(c.name for c in self.member_columns)
        members: dict[str, M] = {}
        target: dict[str, Assignment] = {}
        for m in conn.execute(
            text(
                f"SELECT member_id, {columns}, target_assignment FROM {self.member_table} WHERE group_id = :g ORDER BY member_id"
            ),
            {"g": group_id},
        ):
            fields = {c.attribute: c.read(getattr(m, c.name)) for c in self.member_columns}
            members[m.member_id] = self.member_of(member_id=m.member_id, **fields)
            target[m.member_id] = assignment_of(m.target_assignment)
        return self.group_of(group_id, group_epoch, assignment_epoch, members, metadata_of(metadata), target, *further)

    def lock(self, conn: Connection, group_id: str, skip_locked: bool = False) -> G | None:
        """The group, its row locked until the database transaction ends (None: no such group, or,
        with ``skip_locked``, another transaction holds it)."""
        return self._load(conn, group_id, " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE")

    def get(self, conn: Connection, group_id: str) -> G | None:
        """The group as last written (no lock: for describing it)."""
        return self._load(conn, group_id, "")

    def share_lock(self, conn: Connection, group_id: str) -> G | None:
        """The group, its row locked FOR SHARE until the database transaction ends: no heartbeat or
        fencing (which lock it FOR UPDATE) changes it meanwhile, while other readers share it."""
        return self._load(conn, group_id, " FOR SHARE")

    def create(self, conn: Connection, group_id: str) -> None:
        """An empty group row, unless one exists (the caller locks it next)."""
        conn.execute(
            text(
                f"INSERT INTO {self.group_table} (group_id, group_epoch, assignment_epoch) VALUES (:g, 0, 0) "
                "ON CONFLICT (group_id) DO NOTHING"
            ),
            {"g": group_id},
        )

    def save(self, conn: Connection, old: G | None, new: G) -> None:
        """Writes ``new`` over ``old`` (as loaded under the lock): the group row, the members that
        changed, and the removal of those gone."""

        def group_row(g: G) -> tuple[Any, ...]:
            return (
                g.group_epoch,
                g.assignment_epoch,
                dict(g.subscription_metadata),
                *(getattr(g, c) for c in self.group_columns),
            )

        if old is None or group_row(old) != group_row(new):
            further = "".join(f", {c} = :{c}" for c in self.group_columns)
            conn.execute(
                text(
                    f"UPDATE {self.group_table} SET group_epoch = :ge, assignment_epoch = :ae, "
                    f"subscription_metadata = CAST(:md AS jsonb){further}, updated_at = now() WHERE group_id = :g"
                ),
                {
                    "g": new.group_id,
                    "ge": new.group_epoch,
                    "ae": new.assignment_epoch,
                    "md": metadata_json(new.subscription_metadata),
                    **{c: getattr(new, c) for c in self.group_columns},
                },
            )
        old_members = {} if old is None else dict(old.members)
        old_target = {} if old is None else dict(old.target_assignment)
        gone = [m for m in old_members if m not in new.members]
        if gone:
            conn.execute(
                text(f"DELETE FROM {self.member_table} WHERE group_id = :g AND member_id = ANY(CAST(:ms AS text[]))"),
                {"g": new.group_id, "ms": gone},
            )
        columns = [*self.member_columns, Column("target_assignment", "jsonb")]
        names = [c.name for c in columns]
        values = ", ".join(f"CAST(:{c.name} AS {c.cast})" if c.cast else f":{c.name}" for c in columns)
        upsert = text(
            f"INSERT INTO {self.member_table} (group_id, member_id, {', '.join(names)}) VALUES (:g, :m, {values}) "
            f"ON CONFLICT (group_id, member_id) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in names)}"
        )
        for member_id, member in new.members.items():
            target = new.target_assignment.get(member_id, {})
            if old_members.get(member_id) == member and dict(old_target.get(member_id, {})) == dict(target):
                continue
            row = {c.name: c.write(getattr(member, c.attribute)) for c in self.member_columns}
            conn.execute(upsert, {"g": new.group_id, "m": member_id, **row, "target_assignment": assignment_json(target)})

    def ids(self, conn: Connection) -> list[str]:
        """Every group with a row, by id."""
        return [r[0] for r in conn.execute(text(f"SELECT group_id FROM {self.group_table} ORDER BY group_id"))]

    def delete(self, conn: Connection, group_id: str) -> None:
        conn.execute(text(f"DELETE FROM {self.group_table} WHERE group_id = :g"), {"g": group_id})
