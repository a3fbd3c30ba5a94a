"""Spark read throughput: ``read_topic`` (read_committed, filtered in PostgreSQL) against a plain
JDBC read of the same topic's rows of ``txlog.records`` (no filtering), in the same run, with 1, 2
and 4 parallel slices; and the ``txlog`` Python data source for comparison.

The log is generated in bulk (INSERT … SELECT generate_series): transactions of ``--txn-size``
records, each followed by its COMMIT or ABORT marker, one transaction in ten aborted (with its
aborted-transaction index row, as the coordinator writes them). A few more transactions go through
txlog's services at the end — one committed, one aborted, one left open — so every partition has a
last stable offset below its high watermark. Every read is fully materialized (Spark's ``noop``
sink); the best of ``--repeat`` runs counts.

    python -m bench.spark_read [--records 1000000] [--partitions 4] [--repeat 3]

Uses its own embedded PostgreSQL in a temp dir unless TXLOG_DATABASE_URL is given.
"""

from __future__ import annotations

import argparse
import time

import psycopg

from app.config import Settings
from app.domain.records import NewRecord
from app.services import Broker, produce, topics, transactions
from app.services.produce import ProduceRequest
from app.storage.db import Database
from bench.common import bench_database, rate, reset

TOPIC = "bench-orders"

_BULK = """
INSERT INTO txlog.records (topic, partition, "offset", key, value, headers, "timestamp", producer_id,
                           producer_epoch, sequence, is_transactional, control_type, txn_first_offset)
SELECT %(topic)s, %(partition)s, o,
       CASE WHEN o %% (%(size)s + 1) < %(size)s THEN convert_to('customer-' || (o %% 997), 'UTF8') END,
       CASE WHEN o %% (%(size)s + 1) < %(size)s
            THEN convert_to('{"customer": "customer-' || (o %% 997) || '", "amount": ' || (o %% 1000) || '.25}', 'UTF8') END,
       CASE WHEN o %% 50 = 0 AND o %% (%(size)s + 1) < %(size)s THEN '{"source": "bench"}'::jsonb END,
       now(), %(pid)s, (o / (%(size)s + 1))::smallint,
       CASE WHEN o %% (%(size)s + 1) < %(size)s THEN (o %% (%(size)s + 1))::int END,
       true,
       CASE WHEN o %% (%(size)s + 1) = %(size)s
            THEN (CASE WHEN (o / (%(size)s + 1)) %% %(every)s = %(every)s - 1 THEN 0 ELSE 1 END)::smallint END,
       (o / (%(size)s + 1)) * (%(size)s + 1)
FROM generate_series(0, %(offsets)s - 1) AS o
"""

_ABORTED_INDEX = """
INSERT INTO txlog.aborted_txns (topic, partition, producer_id, producer_epoch, first_offset, last_offset)
SELECT %(topic)s, %(partition)s, %(pid)s, t::smallint, t * (%(size)s + 1), t * (%(size)s + 1) + %(size)s
FROM generate_series(0, %(txns)s - 1) AS t
WHERE t %% %(every)s = %(every)s - 1
"""


def generate(url: str, records: int, partitions: int, txn_size: int, aborted_every: int) -> None:
    broker = Broker(Database(url, pool_size=2), Settings(database_url=url))
    topics.create_topic(broker, TOPIC, partitions)
    txns = records // partitions // txn_size
    with psycopg.connect(url) as conn:
        for p in range(partitions):
            pid = conn.execute("SELECT nextval('txlog.producer_id_seq')").fetchone()[0]  # type: ignore[index]
            params = {
                "topic": TOPIC,
                "partition": p,
                "size": txn_size,
                "pid": pid,
                "every": aborted_every,
                "offsets": txns * (txn_size + 1),
                "txns": txns,
            }
            conn.execute(_BULK, params)
            conn.execute(_ABORTED_INDEX, params)
            conn.execute(
                "UPDATE txlog.partitions SET next_offset = %s WHERE topic = %s AND partition = %s",
                (txns * (txn_size + 1), TOPIC, p),
            )
        conn.commit()
    for outcome in ("commit", "abort", "open"):
        tid = f"bench-{outcome}"
        producer = transactions.init_producer_id(broker, tid)
        pid, epoch = producer.producer_id, producer.producer_epoch
        for p in range(partitions):
            late = NewRecord(b"late", f'{{"customer": "late", "amount": 1, "outcome": "{outcome}"}}'.encode())
            produce.produce(broker, TOPIC, p, ProduceRequest([late], pid, epoch, 0, tid))
        if outcome != "open":
            transactions.end_txn(broker, tid, pid, epoch, outcome)  # type: ignore[arg-type]
    broker.db.dispose()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE txlog.records")
        conn.execute("VACUUM ANALYZE txlog.aborted_txns")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--txn-size", type=int, default=100)
    ap.add_argument("--aborted-every", type=int, default=10, help="one transaction in N aborts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--slices", default="1,2,4")
    args = ap.parse_args()

    from spark.reader import JDBC_DRIVER_CLASS, JDBC_FETCH_SIZE, jdbc_url, read_topic, snapshot
    from spark.session import spark_session

    with bench_database() as url:
        reset(url)
        started = time.perf_counter()
        generate(url, args.records, args.partitions, args.txn_size, args.aborted_every)
        print(
            f"generated {args.records:,} records ({100 // args.aborted_every}% in aborted transactions) "
            f"in {time.perf_counter() - started:.1f} s"
        )
        spark = spark_session("txlog-bench", "local[2]")
        try:
            committed = read_topic(spark, url, TOPIC).count()
            with psycopg.connect(url) as conn:
                raw, hwm = conn.execute(
                    'SELECT count(*), max("offset") + 1 FROM txlog.records WHERE topic = %s', (TOPIC,)
                ).fetchone()  # type: ignore[misc]
            snap = snapshot(url, TOPIC)
            print(
                f"{TOPIC}: {raw:,} rows in txlog.records (data, aborted and control records), "
                f"{committed:,} visible to read_committed below the last stable offsets {snap.end_offsets}"
            )

            def plain(n: int):  # type: ignore[no-untyped-def]
                return spark.read.jdbc(
                    url=jdbc_url(url),
                    table=(
                        '(SELECT topic, partition, "offset", key, value, headers::text AS headers, "timestamp", producer_id '
                        f"FROM txlog.records WHERE topic = '{TOPIC}') AS t"
                    ),
                    column="offset",
                    lowerBound=0,
                    upperBound=hwm,
                    numPartitions=n,
                    properties={"driver": JDBC_DRIVER_CLASS, "fetchsize": str(JDBC_FETCH_SIZE)},
                )

            def drain(df) -> None:  # type: ignore[no-untyped-def]
                df.write.format("noop").mode("overwrite").save()

            drain(read_topic(spark, url, TOPIC))  # warm up the JVM and PostgreSQL's cache
            drain(plain(2))
            print(f"{'slices':>6} {'read_topic rows/s':>18} {'plain JDBC rows/s':>18} {'ratio':>6}")
            for n in [int(x) for x in args.slices.split(",")]:
                ours = rate(committed, lambda: drain(snap.read(spark, n)), args.repeat)
                base = rate(raw, lambda: drain(plain(n)), args.repeat)
                print(f"{n:>6} {ours:>18,.0f} {base:>18,.0f} {ours / base:>6.2f}")
            source = spark.read.format("txlog").option("url", url).option("topic", TOPIC).option("numPartitions", "2").load()
            ds = rate(committed, lambda: drain(source), 1)
            print(f"txlog Python data source, 2 slices: {ds:,.0f} rows/s")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
