"""A small, realistic cluster built through the public HTTP API, for the admin page tests, the
browser test and the README screenshots: a quarter of an hour of traffic, idempotent and plain
producers, committed and aborted transactions, consume-transform-produce with transactional
offsets, consumer groups with lag, an open transaction and a hanging one."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field

import httpx


def _ok(r: httpx.Response) -> dict:
    assert r.status_code in (200, 201), f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    return r.json()


@dataclass
class Producer:
    """A producer's id, epoch and next sequence per partition, as a Kafka client keeps them."""

    client: httpx.Client
    transactional_id: str | None = None
    timeout_ms: int | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)

    def init(self) -> "Producer":
        body = {"transactional_id": self.transactional_id, "transaction_timeout_ms": self.timeout_ms}
        got = _ok(self.client.post("/v1/producers", json=body))
        self.producer_id, self.producer_epoch = got["producer_id"], got["producer_epoch"]
        self.sequences.clear()
        return self

    def send(self, topic: str, partition: int, records: list[dict]) -> dict:
        seq = self.sequences.get((topic, partition), 0)
        body = {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "base_sequence": seq,
            "transactional_id": self.transactional_id,
            "records": records,
        }
        got = _ok(self.client.post(f"/v1/topics/{topic}/partitions/{partition}/records", json=body))
        self.sequences[(topic, partition)] = seq + len(records)
        return got

    def commit_offsets(self, group: str, offsets: list[tuple[str, int, int]]) -> None:
        body = {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "group_id": group,
            "offsets": [{"topic": t, "partition": p, "offset": o, "metadata": ""} for t, p, o in offsets],
        }
        _ok(self.client.post(f"/v1/transactions/{self.transactional_id}/offsets", json=body))

    def end(self, result: str) -> dict:
        body = {"producer_id": self.producer_id, "producer_epoch": self.producer_epoch, "result": result}
        got = _ok(self.client.post(f"/v1/transactions/{self.transactional_id}/end", json=body))
        # Transactions V2: every transaction has its own epoch and starts its sequences at 0.
        self.producer_id, self.producer_epoch = got["producer_id"], got["producer_epoch"]
        self.sequences.clear()
        return got


@dataclass
class Scenario:
    """Names are prefixed so that several scenarios can share one server."""

    client: httpx.Client
    prefix: str = ""
    hanging_timeout_ms: int = 2000
    seed: int = 7
    history_minutes: int = 14

    def name(self, base: str) -> str:
        return f"{self.prefix}{base}"

    @property
    def orders(self) -> str:
        return self.name("orders")

    @property
    def payments(self) -> str:
        return self.name("payments")

    @property
    def inventory(self) -> str:
        return self.name("inventory.events")

    @property
    def audit(self) -> str:
        return self.name("audit-log")

    @property
    def processor(self) -> str:
        return self.name("payments-processor-0")

    @property
    def refunds(self) -> str:
        return self.name("refunds-processor-1")

    @property
    def hanging(self) -> str:
        return self.name("inventory-sync-7")

    @property
    def enricher(self) -> str:
        return self.name("order-enricher-2")

    @property
    def payments_group(self) -> str:
        return self.name("payments-processor")

    @property
    def analytics_group(self) -> str:
        return self.name("analytics-dashboard")

    def build(self) -> "Scenario":
        rnd = random.Random(self.seed)
        topics = {self.orders: 6, self.payments: 3, self.inventory: 4, self.audit: 1}
        for name, n in topics.items():
            _ok(self.client.post("/v1/topics", json={"name": name, "partitions": n}))

        # A quarter of an hour of history, oldest first, so timestamps grow with offsets.
        now = int(time.time() * 1000)
        checkout = Producer(self.client).init()  # idempotent, no transactional id
        for minute in range(self.history_minutes, 0, -1):
            base = now - minute * 60_000
            load = 0.55 + 0.45 * math.sin(minute / 2.3)  # a gentle wave
            for partition in range(topics[self.orders]):
                n = max(1, int(rnd.randint(6, 12) * load))
                checkout.send(self.orders, partition, [self._order(rnd, base + i * 50_000 // n) for i in range(n)])
            for partition in range(topics[self.inventory]):
                n = max(1, int(rnd.randint(2, 6) * load))
                records = [self._stock(rnd, base + i * 50_000 // n) for i in range(n)]
                _ok(self.client.post(f"/v1/topics/{self.inventory}/partitions/{partition}/records", json={"records": records}))
            audit = [{"key": None, "value": f"login user={rnd.randint(1, 99)}", "timestamp_ms": base + 1000}]
            _ok(self.client.post(f"/v1/topics/{self.audit}/partitions/0/records", json={"records": audit}))

        # Consume-transform-produce: payments from orders, the group's offsets in the transaction.
        processor = Producer(self.client, self.processor, 60_000).init()
        for round_ in range(3):
            for p in range(topics[self.payments]):
                processor.send(self.payments, p, [self._payment(rnd) for _ in range(rnd.randint(2, 4))])
            processor.commit_offsets(self.payments_group, [(self.orders, p, 20 + 10 * round_) for p in range(3)])
            processor.end("commit")

        # A transaction its producer aborts (a failed refund batch).
        refunds = Producer(self.client, self.refunds, 60_000).init()
        refunds.send(self.payments, 1, [self._payment(rnd, refund=True) for _ in range(3)])
        refunds.commit_offsets(self.payments_group, [(self.orders, 4, 15)])
        refunds.end("abort")
        refunds.send(self.payments, 2, [self._payment(rnd, refund=True) for _ in range(2)])
        refunds.end("commit")

        # A plain consumer group, behind the log.
        offsets = [{"topic": self.orders, "partition": p, "offset": 40 + 7 * p, "metadata": "dashboard-v3"} for p in range(6)]
        _ok(self.client.post(f"/v1/groups/{self.analytics_group}/offsets", json={"offsets": offsets}))

        # Open transactions: one healthy (long timeout), one that will hang (short timeout).
        enricher = Producer(self.client, self.enricher, 900_000).init()
        enricher.send(self.orders, 0, [self._order(rnd, None) for _ in range(2)])
        enricher.send(self.audit, 0, [{"key": "enricher", "value": "batch 4411 started"}])
        hanging = Producer(self.client, self.hanging, self.hanging_timeout_ms).init()
        hanging.send(self.inventory, 2, [self._stock(rnd, None) for _ in range(2)])
        hanging.end("commit")  # one good transaction first, then the one that hangs
        hanging.send(self.inventory, 1, [self._stock(rnd, None) for _ in range(3)])
        hanging.send(self.orders, 3, [self._order(rnd, None)])
        hanging.commit_offsets(self.payments_group, [(self.inventory, 1, 9)])
        # Records after the open transactions: what read_committed readers wait for.
        checkout.send(self.orders, 3, [self._order(rnd, None) for _ in range(4)])
        _ok(self.client.post(f"/v1/topics/{self.inventory}/partitions/1/records", json={"records": [self._stock(rnd, None)]}))
        return self

    @staticmethod
    def _order(rnd: random.Random, ts: int | None) -> dict:
        oid = rnd.randint(10_000, 99_999)
        value = {
            "order_id": f"o-{oid}",
            "customer": f"c-{rnd.randint(100, 999)}",
            "total": round(rnd.uniform(5, 480), 2),
            "currency": "EUR",
            "items": rnd.randint(1, 6),
        }
        return {
            "key": f"o-{oid}",
            "value": json.dumps(value),
            "headers": {"source": "checkout", "schema": "order.v2"},
            "timestamp_ms": ts,
        }

    @staticmethod
    def _stock(rnd: random.Random, ts: int | None) -> dict:
        sku = f"SKU-{rnd.randint(1000, 9999)}"
        value = {"sku": sku, "warehouse": rnd.choice(["AMS-1", "FRA-2", "DUB-1"]), "delta": rnd.randint(-5, 20)}
        return {"key": sku, "value": json.dumps(value), "headers": {"source": "wms"}, "timestamp_ms": ts}

    @staticmethod
    def _payment(rnd: random.Random, refund: bool = False) -> dict:
        pid = rnd.randint(100_000, 999_999)
        value = {
            "payment_id": f"p-{pid}",
            "order_id": f"o-{rnd.randint(10_000, 99_999)}",
            "amount": round(rnd.uniform(5, 480), 2),
            "status": "refunded" if refund else "captured",
        }
        return {"key": f"p-{pid}", "value": json.dumps(value), "headers": {"source": "psp", "attempt": "1"}}
