"""Share groups' administration (KIP-932's admin APIs, the HTTP API's and the admin pages' views):
the groups with share-partition state, each one's state described, share-partition start offsets
altered or deleted, and a share group's state and configs deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from sqlalchemy.engine import Connection

from app.domain import share_partition as sp
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import log as log_store
from app.storage import share as share_store


@dataclass(frozen=True)
class SharePartitionDescription:
    topic: str
    partition: int
    start_offset: int  # SPSO
    end_offset: int  # exclusive (SPEO + 1)
    state_epoch: int
    in_flight: tuple[sp.InFlightRange, ...]
    counts: Mapping[str, int] = field(default_factory=dict)  # records per state name, in flight


@dataclass(frozen=True)
class ShareGroupDescription:
    group_id: str
    partitions: tuple[SharePartitionDescription, ...]
    configs: Mapping[str, str]  # those set


def list_share_groups(broker: Broker) -> list[str]:
    """Groups with share-partition state or share configs."""
    with broker.db.read() as conn:
        return share_store.share_group_ids(conn)


def describe(broker: Broker, group_id: str) -> ShareGroupDescription:
    """Every share partition of the group: SPSO, end offset, state epoch, in-flight runs (member,
    lock deadline, delivery count) and the records in each state. One snapshot."""
    with broker.db.read() as conn:
        state = share_store.share_group_state(conn, group_id)
        configs = share_store.share_group_configs(conn, group_id)
    parts = []
    for row, ranges in state:
        counts = {s.name: 0 for s in sp.RecordState}
        for r in ranges:
            counts[r.state.name] += r.count
        parts.append(
            SharePartitionDescription(
                row.topic, row.partition, row.start_offset, row.end_offset, row.state_epoch, tuple(ranges), counts
            )
        )
    return ShareGroupDescription(group_id, tuple(parts), configs)


@dataclass(frozen=True)
class ShareOffsetResult:
    topic: str
    partition: int
    error: TxlogError | None = None


def alter_offsets(broker: Broker, group_id: str, offsets: Sequence[tuple[str, int, int]]) -> list[ShareOffsetResult]:
    """Kafka's AlterShareGroupOffsets in one database transaction (``alter_offsets_on``)."""
    with broker.db.transaction() as conn:
        return alter_offsets_on(conn, group_id, offsets)


def alter_offsets_on(conn: Connection, group_id: str, offsets: Sequence[tuple[str, int, int]]) -> list[ShareOffsetResult]:
    """Kafka's AlterShareGroupOffsets: each (topic, partition, start offset) starts over there with
    nothing in flight, its state epoch raised. Kafka allows it only while the group has no member
    (``share_groups.while_empty`` holds that). Errors per partition."""
    out: list[ShareOffsetResult] = []
    for topic, partition, start in offsets:
        try:
            state = sp.altered(start)
            log_store.partition_status(conn, topic, partition)  # UNKNOWN_TOPIC_OR_PARTITION, before any write
            share_store.share_partition_reset(conn, group_id, topic, partition, state.start_offset)
        except TxlogError as exc:
            if exc.code is ErrorCode.UNKNOWN_SERVER_ERROR:
                raise
            out.append(ShareOffsetResult(topic, partition, exc))
        else:
            out.append(ShareOffsetResult(topic, partition))
    return out


def delete_offsets(broker: Broker, group_id: str, partitions: Sequence[tuple[str, int]] | None = None) -> list[tuple[str, int]]:
    """Kafka's DeleteShareGroupOffsets in one database transaction (``delete_offsets_on``)."""
    with broker.db.transaction() as conn:
        return delete_offsets_on(conn, group_id, partitions)


def delete_offsets_on(
    conn: Connection, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
) -> list[tuple[str, int]]:
    """Kafka's DeleteShareGroupOffsets (None: every partition, as DeleteGroups of a share group):
    the group's state of those partitions is gone, in-flight records with it; read again, a
    partition starts per share.auto.offset.reset. The partitions that had state."""
    return share_store.share_partitions_delete(conn, group_id, partitions)


def delete_group(broker: Broker, group_id: str) -> None:
    """A share group deleted: its share partitions' state and its configs."""
    with broker.db.transaction() as conn:
        share_store.share_partitions_delete(conn, group_id)
        share_store.share_group_configs_delete(conn, group_id)
