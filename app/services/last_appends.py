"""Where this process's last appends left partitions, and the transactions as this process last
wrote them: the memory the optimistic append (``produce``) and the transitions planned ahead
(``coordinator.record_if_unchanged``) plan against. Only ever a guess: the database decides."""

from __future__ import annotations

from app.domain.log import AppendBatch, AppendPosition
from app.domain.transactions import TxnMetadata
from app.services import Broker


class LastAppends:
    """Where this process's last append left each (topic, partition, producer id) — None for plain
    appends: the partition's next offset and position and the producer's state there. And each
    transactional id's state as this process last wrote it with a statement planned ahead — whole,
    members and all, and committed: exact at its version. Each emptied whole when it reaches
    ``limit`` entries, as a guess that is missing costs one locked append."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._at: dict[tuple[str, int, int | None], AppendPosition] = {}
        self._txns: dict[str, TxnMetadata] = {}

    def __len__(self) -> int:
        return len(self._at)

    def get(self, topic: str, partition: int, producer_id: int | None) -> AppendPosition | None:
        return self._at.get((topic, partition, producer_id))

    def remember(self, batch: AppendBatch, before: AppendPosition) -> None:
        """``batch`` was appended at ``before`` (and committed)."""
        if len(self._at) >= self.limit:
            self._at.clear()
        self._at[(batch.topic, batch.partition, batch.producer_id)] = AppendPosition(
            batch.base_offset + len(batch.records),
            before.log_start_offset,
            batch.base_position + sum(batch.record_sizes()),
            batch.producer_state,
            None,
        )

    def forget(self, topic: str, partition: int, producer_id: int | None) -> None:
        self._at.pop((topic, partition, producer_id), None)

    def txn(self, transactional_id: str) -> TxnMetadata | None:
        return self._txns.get(transactional_id)

    def remember_txn(self, meta: TxnMetadata) -> None:
        """``meta`` was committed, whole, by this process."""
        if len(self._txns) >= self.limit:
            self._txns.clear()
        self._txns[meta.transactional_id] = meta

    def forget_txn(self, transactional_id: str) -> None:
        self._txns.pop(transactional_id, None)


def of(broker: Broker) -> LastAppends:
    """This process's memory (one per broker)."""
    last = broker.extensions.get("last_appends")
    if last is None:
        last = broker.extensions.setdefault("last_appends", LastAppends())
    return last
