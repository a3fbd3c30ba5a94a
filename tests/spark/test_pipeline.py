"""``txlog spark pipeline`` exactly once: killed at a step (every step under ``make chaos``) and at a
random moment, run again, the running totals equal the exact sums of the committed input."""

from __future__ import annotations

import json
import os
import random
import time
from collections import defaultdict
from decimal import Decimal

import pytest

from app.services import produce, topics, transactions
from spark.pipeline import CRASH_ENV, transactional_id
from tests.spark.cli import SparkCommand, run_spark_cli
from tests.spark.logdata import Txn, consume, group_offsets, plain, rec
from tests.support import wait_until

INPUT, OUTPUT, GROUP = "orders", "customer-totals", "billing"
STEPS = ("read", "transform", "write", "commit")
# Each Spark run costs a JVM's start: the suite crashes the job at the last step (the one that leaves
# a transaction open); `make chaos` sets TXLOG_SPARK_CRASH_STEPS=all, a crash at every step.
ALL_STEPS = os.environ.get("TXLOG_SPARK_CRASH_STEPS") == "all"


class Orders:
    """Produces orders (plain, in committed, aborted and open transactions, and some malformed
    records) and keeps the sums a correct pipeline must reach."""

    def __init__(self, broker, seed: int) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker
        self.rng = random.Random(seed)
        self.totals: dict[str, Decimal] = defaultdict(Decimal)
        self.counts: dict[str, int] = defaultdict(int)
        self.pending: list[tuple[str, Decimal]] = []

    def order(self) -> tuple[str, Decimal, bytes]:
        customer = f"customer-{self.rng.randrange(6)}"
        amount = Decimal(self.rng.randrange(1, 100_000)) / 100
        return customer, amount, json.dumps({"customer": customer, "amount": float(amount)}).encode()

    def count(self, customer: str, amount: Decimal) -> None:
        self.totals[customer] += amount
        self.counts[customer] += 1

    def round(self, plain_orders: int = 30, leave_open: bool = False) -> Txn | None:
        for _ in range(plain_orders):
            c, a, value = self.order()
            produce.produce_to_topic(self.broker, INPUT, [rec(value.decode(), c)])
            self.count(c, a)
        plain(self.broker, INPUT, 0, rec("not json"), rec('{"customer": "customer-1"}'))  # consumed, never counted
        for outcome in ("commit", "abort", "commit"):
            t = Txn(self.broker)
            batch = [self.order() for _ in range(5)]
            for i, (c, _a, value) in enumerate(batch):
                t.send(INPUT, i % 3, rec(value.decode(), c))
            if outcome == "commit":
                t.commit()
                for c, a, _ in batch:
                    self.count(c, a)
            else:
                t.abort()
        if not leave_open:
            return None
        t = Txn(self.broker)
        for i in range(3):
            c, a, value = self.order()
            t.send(INPUT, i, rec(value.decode(), c))
            self.pending.append((c, a))
        return t

    def open_committed(self, t: Txn) -> None:
        t.commit()
        for c, a in self.pending:
            self.count(c, a)
        self.pending = []


def output_totals(broker) -> dict[str, tuple[Decimal, int]]:  # type: ignore[no-untyped-def]
    """Each customer's latest committed total in the output topic."""
    latest: dict[str, tuple[Decimal, int]] = {}
    for _, _, key, value, _ in consume(broker, OUTPUT):  # offset order per partition; a key stays on one
        v = json.loads(value, parse_float=Decimal)
        assert key.decode() == v["customer"]
        latest[v["customer"]] = (Decimal(v["total"]), v["orders"])
    return latest


def expected(orders: Orders) -> dict[str, tuple[Decimal, int]]:
    return {c: (orders.totals[c], orders.counts[c]) for c in orders.totals}


@pytest.mark.slow
def test_pipeline_counts_each_order_exactly_once_across_crashes(broker, db_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    seed = random.randrange(1_000_000)
    print(f"seed {seed}")
    topics.create_topic(broker, INPUT, 3)
    topics.create_topic(broker, OUTPUT, 2)
    orders = Orders(broker, seed)
    orders.round()
    args = ["pipeline", "--input", INPUT, "--output", OUTPUT, "--group", GROUP]

    steps = STEPS if ALL_STEPS else STEPS[-1:]
    print(f"crashing at {', '.join(steps)}")
    for step in steps:
        out = run_spark_cli(db_url, args, tmp_path / f"crash-{step}.log", env={CRASH_ENV: step}, expect=137)
        assert f"crashing at {step}" in out
        assert group_offsets(broker, GROUP) == {}
        assert consume(broker, OUTPUT) == []  # nothing visible to read_committed
    # The last one died inside its transaction: records written, offsets pending, nothing committed.
    assert transactions.describe(broker, transactional_id(GROUP, OUTPUT)).state.value == "Ongoing"
    assert len(consume(broker, OUTPUT, "read_uncommitted")) > 0

    run_spark_cli(db_url, args, tmp_path / "run1.log")
    assert output_totals(broker) == expected(orders)
    assert transactions.describe(broker, transactional_id(GROUP, OUTPUT)).state.value == "CompleteCommit"

    # Second round, with a transaction left open on the input: its orders wait. The job is killed
    # with SIGKILL at a random moment once it is reading, then run again.
    open_txn = orders.round(leave_open=True)
    assert open_txn is not None
    job = SparkCommand(db_url, args, tmp_path / "killed.log")
    wait_until(lambda: "pipeline: reading" in job.output() or job.proc.poll() is not None, timeout=120, message="the job to read")
    time.sleep(random.Random(seed).uniform(0.0, 4.0))
    job.kill()
    run_spark_cli(db_url, args, tmp_path / "run2.log")
    assert output_totals(broker) == expected(orders)

    orders.open_committed(open_txn)
    out = run_spark_cli(db_url, args, tmp_path / "run3.log")
    assert output_totals(broker) == expected(orders)
    assert "for 3 orders" in out  # only the orders of the transaction that just committed
    lso = {(INPUT, s.partition): s.last_stable_offset for s in topics.describe_topic(broker, INPUT)}
    assert group_offsets(broker, GROUP) == lso
