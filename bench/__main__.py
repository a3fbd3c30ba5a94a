"""Run every benchmark: ``python -m bench [--quick]``.

1. bench.http — txlog over HTTP against raw PostgreSQL baselines and PgQueuer, in one run
   (writes bench/results/latest.json and latest.png).
2. bench.kafka — txlog over Kafka's wire protocol, driven by confluent-kafka, against the same raw
   baselines in one run (writes bench/results/kafka.json and kafka.png).
3. bench.spark_read — Spark's committed read against a plain JDBC read (needs Java and the
   PostgreSQL JDBC driver; skipped with a note when they or pyspark are missing). With --quick it
   reads a smaller log once.
4. bench.outbox — the in-database outbox: an application's commit to read_committed visibility,
   p50/p99 (writes bench/results/outbox.json).
5. bench.share — share groups (KIP-932's queues) over HTTP and over Kafka's wire protocol against
   PgQueuer's dequeue + ack and pgmq's read + delete (writes bench/results/share.json and share.png).
6. bench.replicas — read_committed consumers on two read replica gateways (hot standbys, KIP-392)
   against the primary alone, in one run (writes bench/results/replicas.json).
7. bench.partitions — the same records over 1,000 partitions and over 8 over Kafka's wire protocol,
   produce → read_committed latency, and disk per record beside Kafka's (writes
   bench/results/partitions.json and partitions.png).

``--only share`` (or any of http,kafka,spark,outbox,share,replicas,partitions, comma-separated) runs those alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

BENCHMARKS = ("http", "kafka", "share", "spark", "outbox", "replicas", "partitions")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--quick", action="store_true", help="fewer and shorter rounds: a few minutes in all")
    ap.add_argument("--skip-spark", action="store_true")
    ap.add_argument("--only", default=",".join(BENCHMARKS), help=f"the benchmarks to run (of {','.join(BENCHMARKS)})")
    args = ap.parse_args()
    only = {b.strip() for b in args.only.split(",") if b.strip()}
    if only - set(BENCHMARKS):
        ap.error(f"unknown benchmarks {sorted(only - set(BENCHMARKS))}; choose from {','.join(BENCHMARKS)}")
    started = time.perf_counter()
    summaries: list[str] = []

    if "http" in only:
        from bench import http

        print("== bench.http", flush=True)
        summaries.append(http.run(["--quick"] if args.quick else []))

    if "kafka" in only:
        from bench import kafka

        print("\n== bench.kafka", flush=True)
        summaries.append(kafka.run(["--quick"] if args.quick else []))

    if "share" in only:
        from bench import share

        print("\n== bench.share", flush=True)
        summaries.append(share.run(["--quick"] if args.quick else []))

    if "spark" in only and not args.skip_spark:
        print("\n== bench.spark_read", flush=True)
        if importlib.util.find_spec("pyspark") is None:
            print("skipped: pyspark is not installed (make install)", file=sys.stderr)
        else:
            from bench import spark_read

            sys.argv = ["bench.spark_read"]
            if args.quick:
                sys.argv += ["--records", "200000", "--repeat", "1", "--slices", "2"]
            spark_read.main()

    if "outbox" in only:
        from bench import outbox

        print("\n== bench.outbox", flush=True)
        outbox.main(["--quick"] if args.quick else [])
    if "replicas" in only:
        from bench import replicas

        print("\n== bench.replicas", flush=True)
        summaries.append(replicas.run(["--quick"] if args.quick else []))
    if "partitions" in only:
        from bench import partitions

        print("\n== bench.partitions", flush=True)
        summaries.append(partitions.run(["--quick"] if args.quick else []))
    print(f"\nall benchmarks: {time.perf_counter() - started:.0f} s")
    print("summary: " + " ".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
