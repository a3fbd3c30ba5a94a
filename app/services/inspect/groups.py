"""The consumer groups' pages: each group's committed offsets and lag, and the offsets transactions
have pending for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.services import Broker
from app.storage import admin_reads
from app.storage import groups as groups_store


@dataclass(frozen=True)
class GroupSummary:
    group_id: str
    partitions: int
    lag: int
    last_commit_ms: int | None
    pending_offsets: int
    pending_transactions: int


def groups(broker: Broker, limit: int = 1000) -> list[GroupSummary]:
    with broker.db.read() as conn:
        return [GroupSummary(**r) for r in admin_reads.group_summaries(conn, limit)]


@dataclass(frozen=True)
class GroupPartition:
    topic: str
    partition: int
    offset: int
    metadata: str
    committed_at_ms: int
    log_start_offset: int | None
    last_stable_offset: int | None
    high_watermark: int | None

    @property
    def lag(self) -> int | None:
        """What a read_committed consumer of the group still has to read."""
        if self.last_stable_offset is None:
            return None
        return max(self.last_stable_offset - self.offset, 0)


@dataclass(frozen=True)
class GroupDetail:
    group_id: str
    offsets: list[GroupPartition]
    pending: list[dict]

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.offsets)


def group_detail(broker: Broker, group_id: str) -> GroupDetail:
    """A group's committed and pending offsets; an unknown group simply has none (as Kafka's
    OffsetFetch answers)."""
    with broker.db.read() as conn:
        offsets = [GroupPartition(**r) for r in admin_reads.group_offsets_with_status(conn, group_id)]
        pending = groups_store.pending_offsets_of_group(conn, group_id)
    return GroupDetail(group_id, offsets, pending)
