"""Produce throughput against raw PostgreSQL inserts of the same rows, in the same process.

The baseline is the least a durable log append can cost on this database: one transaction per batch
inserting the batch's rows (one INSERT … SELECT FROM unnest) at consecutive offsets. txlog adds the
partition lock, the high-watermark update, the NOTIFY for long-polls and, for idempotent and
transactional producers, the producer-state check and update (and the coordinator's row lock).
Printed as ratios: 1.00 means as fast as the raw insert.

    python -m bench.produce [--batches 300] [--batch-size 10]
"""

from __future__ import annotations

import argparse
import uuid

import psycopg

from app.config import Settings
from app.domain.records import NewRecord
from app.services import Broker, produce, topics, transactions
from app.services.produce import ProduceRequest
from app.storage.db import Database
from bench.common import bench_database, rate, reset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=10)
    args = ap.parse_args()
    n, size = args.batches, args.batch_size
    rows = n * size
    records = [NewRecord(f"key-{i}".encode(), b"x" * 100) for i in range(size)]

    with bench_database() as url:
        reset(url)
        broker = Broker(Database(url, pool_size=2), Settings(database_url=url))

        def raw_inserts() -> None:
            with psycopg.connect(url) as conn:
                # A logged table like the log (same columns and primary key): WAL and fsync as for txlog.
                conn.execute("CREATE TABLE IF NOT EXISTS public.bench_raw (LIKE txlog.records INCLUDING ALL)")
                conn.commit()
                conn.execute("TRUNCATE public.bench_raw")
                conn.commit()
                offset = 0
                for _ in range(n):
                    conn.execute(
                        "INSERT INTO public.bench_raw (topic, partition, \"offset\", key, value, \"timestamp\") "
                        "SELECT 'raw', 0, %s + o - 1, k, v, now() FROM unnest(%s::bytea[], %s::bytea[]) WITH ORDINALITY AS u(k, v, o)",
                        (offset, [r.key for r in records], [r.value for r in records]),
                    )
                    conn.commit()
                    offset += size

        def plain() -> None:
            topic = f"plain-{uuid.uuid4().hex[:6]}"
            topics.create_topic(broker, topic, 1)
            for _ in range(n):
                produce.produce(broker, topic, 0, ProduceRequest(records))

        def idempotent() -> None:
            topic = f"idem-{uuid.uuid4().hex[:6]}"
            topics.create_topic(broker, topic, 1)
            p = transactions.init_producer_id(broker, None)
            for i in range(n):
                produce.produce(broker, topic, 0, ProduceRequest(records, p.producer_id, 0, i * size))

        def transactional(batches_per_txn: int) -> None:
            topic = f"txn-{uuid.uuid4().hex[:6]}"
            topics.create_topic(broker, topic, 1)
            tid = f"bench-{uuid.uuid4().hex[:6]}"
            p = transactions.init_producer_id(broker, tid)
            pid, epoch, seq = p.producer_id, p.producer_epoch, 0
            for i in range(n):
                produce.produce(broker, topic, 0, ProduceRequest(records, pid, epoch, seq, tid))
                seq += size
                if (i + 1) % batches_per_txn == 0:
                    out = transactions.end_txn(broker, tid, pid, epoch, "commit")
                    pid, epoch, seq = out.producer_id, out.producer_epoch, 0
            if n % batches_per_txn:
                transactions.end_txn(broker, tid, pid, epoch, "commit")

        baseline = rate(rows, raw_inserts)
        print(f"{n} batches x {size} records of ~110 bytes, one partition, best of 3")
        print(f"{'raw PostgreSQL inserts (baseline)':45s} {baseline:10.0f} rows/s   1.00")
        for name, fn in [
            ("plain produce", plain),
            ("idempotent produce", idempotent),
            ("transactional, 10 batches per transaction", lambda: transactional(10)),
            ("transactional, 1 batch per transaction", lambda: transactional(1)),
        ]:
            r = rate(rows, fn)
            print(f"{name:45s} {r:10.0f} rows/s   {r / baseline:4.2f}")
        broker.db.dispose()


if __name__ == "__main__":
    main()
