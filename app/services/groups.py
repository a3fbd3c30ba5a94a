"""Consumer group offsets: OffsetCommit and OffsetFetch (with KIP-447's require_stable)."""

from __future__ import annotations

from typing import Sequence

from app.domain.groups import last_per_partition
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import queries as q
from app.storage.queries import GroupOffset


def _check_group(group_id: str) -> None:
    if not group_id or "\x00" in group_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A group id must be a non-empty string without NUL characters")


def offset_commit(broker: Broker, group_id: str, offsets: Sequence[GroupOffset]) -> list[GroupOffset]:
    """OffsetCommit; a partition given more than once keeps its last offset. Answers the offsets
    as stored."""
    _check_group(group_id)
    offsets = last_per_partition(offsets)
    for o in offsets:
        if o.offset < 0:
            raise TxlogError(ErrorCode.INVALID_REQUEST, f"Offset for {o.topic}-{o.partition} must not be negative")
    with broker.db.transaction() as conn:
        missing = q.partitions_missing(conn, [(o.topic, o.partition) for o in offsets])
        if missing:
            raise TxlogError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unknown topic-partitions: " + ", ".join(f"{t}-{p}" for t, p in missing)
            )
        q.group_offsets_upsert(conn, group_id, offsets)
    return offsets


def offset_fetch(broker: Broker, group_id: str, require_stable: bool = False) -> list[GroupOffset]:
    _check_group(group_id)
    with broker.db.read() as conn:
        offsets = q.group_offsets_get(conn, group_id)
        pending = q.pending_offsets_of_group(conn, group_id) if require_stable else []
    if pending:
        parts = sorted({f"{p['topic']}-{p['partition']}" for p in pending})
        raise TxlogError(
            ErrorCode.UNSTABLE_OFFSET_COMMIT,
            f"Group {group_id!r} has offsets pending in open transactions for {', '.join(parts)}; retry",
        )
    return offsets


def list_groups(broker: Broker) -> list[str]:
    with broker.db.read() as conn:
        return q.group_ids(conn)
