"""Consumer group offsets: OffsetCommit and OffsetFetch (with KIP-447's require_stable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from sqlalchemy.engine import Connection

from app.domain.groups.offsets import GroupOffset, check_committable, last_per_partition
from app.errors import ErrorCode, TxlogError
from app.services import Broker
from app.storage import groups as groups_store
from app.storage import topics as topics_store


def _check_group(group_id: str) -> None:
    if not group_id or "\x00" in group_id:
        raise TxlogError(ErrorCode.INVALID_REQUEST, "A group id must be a non-empty string without NUL characters")


def offset_commit(
    broker: Broker, group_id: str, offsets: Sequence[GroupOffset], fence: Callable[[Connection], None] | None = None
) -> list[GroupOffset]:
    """OffsetCommit; a partition given more than once keeps its last offset. Answers the offsets
    as stored. Nothing is committed when some offset is negative or its metadata holds a NUL
    character, which PostgreSQL text cannot store (INVALID_REQUEST), or some partition does not
    exist (UNKNOWN_TOPIC_OR_PARTITION); the error names them in ``details["partitions"]``.
    ``fence``: the group's member check, run first in the database transaction that writes the
    offsets (``consumer_groups.offset_commit_fence``), raising to refuse the commit."""
    _check_group(group_id)
    offsets = last_per_partition(offsets)
    check_committable(offsets, broker.settings.offset_metadata_max_bytes)
    with broker.db.transaction() as conn:
        if fence is not None:
            fence(conn)
        missing = topics_store.partitions_missing(conn, [(o.topic, o.partition) for o in offsets])
        if missing:
            raise TxlogError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                "Unknown topic-partitions: " + ", ".join(f"{t}-{p}" for t, p in missing),
                partitions=[tuple(tp) for tp in missing],
            )
        groups_store.group_offsets_upsert(conn, group_id, offsets)
    return offsets


@dataclass(frozen=True)
class FetchedOffset:
    """One partition of an OffsetFetch answer."""

    topic: str
    partition: int
    offset: int | None  # None: the group committed none (Kafka answers -1)
    metadata: str  # as committed ("" when none)
    # UNSTABLE_OFFSET_COMMIT (retriable) when the answer was asked stable (require_stable, KIP-447)
    # and a transaction has an offset pending for the partition: its commit may change it.
    error: TxlogError | None = None
    leader_epoch: int = -1  # as committed (-1: none, or nothing committed)


def offset_fetch_partitions(
    broker: Broker, group_id: str, partitions: Sequence[tuple[str, int]] | None = None, require_stable: bool = False
) -> list[FetchedOffset]:
    """OffsetFetch as Kafka answers it, partition by partition: the committed offset of each of
    ``partitions`` (in their order; None for one without), or of every partition the group has an
    offset for (``None``: in (topic, partition) order). With ``require_stable`` a partition with a
    transactional offset pending carries UNSTABLE_OFFSET_COMMIT (and is listed even when it has no
    committed offset yet), the others their offsets. Pending offsets are never read: they are the
    open transactions'."""
    _check_group(group_id)
    with broker.db.read() as conn:
        rows = groups_store.group_offsets_fetch(conn, group_id, partitions)
    out = []
    for r in rows:
        if partitions is None and r.offset is None and not require_stable:
            continue  # only pending: nothing committed to show
        error = None
        if require_stable and r.pending:
            error = TxlogError(
                ErrorCode.UNSTABLE_OFFSET_COMMIT,
                f"Group {group_id!r} has an offset pending in an open transaction for {r.topic}-{r.partition}; retry",
            )
        out.append(
            FetchedOffset(
                r.topic, r.partition, r.offset, r.metadata or "", error, -1 if r.leader_epoch is None else r.leader_epoch
            )
        )
    return out


def offset_fetch(broker: Broker, group_id: str, require_stable: bool = False) -> list[GroupOffset]:
    """OffsetFetch of every partition as the HTTP API answers it: the committed offsets, or with
    ``require_stable`` UNSTABLE_OFFSET_COMMIT for the whole group, naming every partition with an
    offset pending, while there is one."""
    fetched = offset_fetch_partitions(broker, group_id, None, require_stable)
    unstable = [f for f in fetched if f.error is not None]
    if unstable:
        parts = sorted(f"{f.topic}-{f.partition}" for f in unstable)
        raise TxlogError(
            ErrorCode.UNSTABLE_OFFSET_COMMIT,
            f"Group {group_id!r} has offsets pending in open transactions for {', '.join(parts)}; retry",
        )
    return [GroupOffset(f.topic, f.partition, f.offset, f.metadata, f.leader_epoch) for f in fetched if f.offset is not None]


def delete_offsets(broker: Broker, group_id: str) -> bool:
    """DeleteGroups' part here: the group's committed offsets go, and those pending in open
    transactions (whose commit then leaves the deleted group alone). Whether it had any."""
    _check_group(group_id)
    with broker.db.transaction() as conn:
        return groups_store.group_offsets_delete(conn, group_id) > 0


def delete_partition_offsets(broker: Broker, group_id: str, partitions: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
    """OffsetDelete's part here: the group's offsets of ``partitions`` go, committed and pending
    in transactions. Answers the partitions that do not exist (UNKNOWN_TOPIC_OR_PARTITION)."""
    _check_group(group_id)
    with broker.db.transaction() as conn:
        missing = {(t, p) for t, p in topics_store.partitions_missing(conn, list(partitions))}
        groups_store.group_offsets_delete_partitions(conn, group_id, [tp for tp in partitions if tp not in missing])
    return missing


def list_groups(broker: Broker, among: Sequence[str] | None = None) -> list[str]:
    """Groups known by their offsets: all, or those of ``among``."""
    with broker.db.read() as conn:
        return groups_store.group_ids(conn, among)
