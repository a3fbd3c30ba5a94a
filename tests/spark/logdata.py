"""Building partition logs through txlog's own services (plain, idempotent and transactional
producers; committed, aborted and open transactions) and reading them back the way a consumer does."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from app.domain.records import NewRecord, headers_from_object, headers_object
from app.services import Broker, fetch, groups, produce, topics, transactions
from app.services.produce import ProduceRequest


def rec(value: str, key: str | None = None, headers: dict[str, str] | None = None) -> NewRecord:
    return NewRecord(key.encode() if key is not None else None, value.encode(), headers_from_object(headers or {}))


@dataclass
class Txn:
    """One transaction of a fresh transactional id, spanning any partitions."""

    broker: Broker
    tid: str = field(default_factory=lambda: f"tx-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        p = transactions.init_producer_id(self.broker, self.tid)
        self.pid, self.epoch = p.producer_id, p.producer_epoch
        self.seq: dict[tuple[str, int], int] = {}

    def send(self, topic: str, partition: int, *records: NewRecord) -> None:
        seq = self.seq.get((topic, partition), 0)
        produce.produce(self.broker, topic, partition, ProduceRequest(list(records), self.pid, self.epoch, seq, self.tid))
        self.seq[(topic, partition)] = seq + len(records)

    def commit(self) -> None:
        transactions.end_txn(self.broker, self.tid, self.pid, self.epoch, "commit")

    def abort(self) -> None:
        transactions.end_txn(self.broker, self.tid, self.pid, self.epoch, "abort")


def plain(broker: Broker, topic: str, partition: int, *records: NewRecord) -> None:
    produce.produce(broker, topic, partition, ProduceRequest(list(records)))


def mixed_log(broker: Broker, topic: str, partitions: int = 3) -> Txn:
    """Plain and idempotent records, committed and aborted transactions across partitions, and one
    transaction left open (returned) — so every partition has control records, aborted records and
    records above its last stable offset."""
    topics.create_topic(broker, topic, partitions)
    for p in range(partitions):
        plain(broker, topic, p, rec(f"plain-{p}-0", "k0", {"h": "1"}), rec(f"plain-{p}-1"))
    idem = transactions.init_producer_id(broker, None)
    produce.produce(broker, topic, 0, ProduceRequest([rec("idem-0", "ki")], idem.producer_id, 0, 0))
    for i in range(3):
        t = Txn(broker)
        for p in range(partitions):
            t.send(topic, p, *(rec(f"committed-{i}-{p}-{j}", f"k{j}") for j in range(4)))
        t.commit()
        a = Txn(broker)
        for p in range(partitions):
            a.send(topic, p, rec(f"aborted-{i}-{p}", "ka"))
        a.abort()
    open_txn = Txn(broker)
    for p in range(partitions):
        open_txn.send(topic, p, rec(f"open-{p}", "ko"))
    for p in range(partitions):  # after the open transaction: above the last stable offset
        plain(broker, topic, p, rec(f"late-{p}"))
    return open_txn


def consume(
    broker: Broker, topic: str, isolation_level: str = "read_committed", start: dict[int, int] | None = None
) -> list[tuple]:
    """Every record a consumer sees, by fetching from each partition until its end, as
    (partition, offset, key, value, headers) tuples."""
    out = []
    for status in topics.describe_topic(broker, topic):
        p = status.partition
        offset = (start or {}).get(p, status.log_start_offset)
        end = status.last_stable_offset if isolation_level == "read_committed" else status.high_watermark
        while offset < end:
            r = fetch.fetch(broker, topic, p, offset, max_records=1000, isolation_level=isolation_level)  # type: ignore[arg-type]
            out += [(p, x.offset, x.key, x.value, headers_object(x.headers) or None) for x in r.records]
            offset = r.next_offset
    return sorted(out)


def spark_rows(df) -> list[tuple]:  # type: ignore[no-untyped-def]
    return sorted(
        (r["partition"], r["offset"], r["key"], r["value"], json.loads(r["headers"]) if r["headers"] else None)
        for r in df.collect()
    )


def group_offsets(broker: Broker, group: str) -> dict[tuple[str, int], int]:
    return {(o.topic, o.partition): o.offset for o in groups.offset_fetch(broker, group)}
