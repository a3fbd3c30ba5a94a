"""Where this process's last appends left partitions: the memory the optimistic append plans
against (``produce``), and which the end of a transaction clears for its partitions
(``coordinator.complete``). Only ever a guess: the database decides."""

from __future__ import annotations

from app.services import Broker
from app.storage import queries as q


class LastAppends:
    """Where this process's last append left each (topic, partition, producer id) — None for plain
    appends: the partition's next offset and position and the producer's state there. Emptied
    whole when it reaches ``limit`` entries, as a guess that is missing costs one locked append."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._at: dict[tuple[str, int, int | None], q.AppendPosition] = {}

    def __len__(self) -> int:
        return len(self._at)

    def get(self, topic: str, partition: int, producer_id: int | None) -> q.AppendPosition | None:
        return self._at.get((topic, partition, producer_id))

    def remember(self, batch: q.AppendBatch, before: q.AppendPosition) -> None:
        """``batch`` was appended at ``before`` (and committed)."""
        if len(self._at) >= self.limit:
            self._at.clear()
        self._at[(batch.topic, batch.partition, batch.producer_id)] = q.AppendPosition(
            batch.base_offset + len(batch.records), before.log_start_offset,
            batch.base_position + sum(batch.record_sizes()), batch.producer_state, None,
        )

    def forget(self, topic: str, partition: int, producer_id: int | None) -> None:
        self._at.pop((topic, partition, producer_id), None)


def of(broker: Broker) -> LastAppends:
    """This process's memory (one per broker)."""
    last = broker.extensions.get("last_appends")
    if last is None:
        last = broker.extensions.setdefault("last_appends", LastAppends())
    return last
