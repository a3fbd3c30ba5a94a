"""Many partitions over Kafka's wire protocol: the same records over 1,000 partitions and over 8,
produced and consumed by confluent-kafka, in one run (bench.kafka's method: a ``txlog kafka``
gateway on a throwaway embedded PostgreSQL with fsync on, client processes, rounds of interleaved
windows, medians of the ratios within each round).

- *spread produce*: idempotent producers (linger 5 ms, 1 KiB values, librdkafka's own batch
  limits, ``bench.kafka_lanes.KAFKA_SPREAD_PRODUCER``) writing their records in turn to every
  partition of a topic of 1,000 partitions, or of 8 — "1": one producer over all of them, "8":
  eight, each over all of them. Up to 10,000 records are unacknowledged per producer, so a Produce
  request carries a few records per partition over 1,000 partitions and hundreds over 8.
- *spread consume*: read_committed consumers (assign, no group) over a log of the same 100,000
  records in transactions of 20 and a marker, one in ten aborted, over 1,000 partitions or 8 —
  "1": one consumer of all of them, "8": eight, each of every eighth partition.
- *end to end*: produce → delivered to a read_committed consumer, p50/p99, over 8 partitions at
  half the peak rate of the same producers (measured unpaced in the rounds before), each
  record's value carrying the wall-clock time it was produced; the producer sends at once
  (linger 0), so the figure is the gateway's and the database's, not a client's wait for a batch.
  A note splits it: produce → acknowledged (the delivery report), beside the rate each paced
  producer held.
- *disk per record*: after the windows, ``VACUUM`` and ``pg_total_relation_size`` of the log
  table (its indexes and TOAST) ÷ the bytes of its records' keys, values and headers, beside the
  size of the same records as Kafka's record batches v2 (uncompressed, batches of 20 records,
  a marker a batch of its own; ``app.wire.kafka.records.encode``), which is what a Kafka broker's
  log segments hold (its offset and time indexes add about 20 bytes per 4 KiB more).

    python -m bench.partitions [--quick] [--rounds N] [--window S] [--only produce,consume,latency]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from app.domain.log import StoredRecord
from app.storage.db import libpq_url
from app.storage.log import RECORD_COLUMNS
from app.wire.kafka.records.encode import batch_runs, encode_runs
from bench import datasets, procs, report
from bench.clients import ClientPool
from bench.common import bench_database, reset
from bench.harness import (
    Harness,
    latency_cells,
    postgres_facts,
    publish,
    ratio_cell,
    round_arguments,
    round_settings,
    run_config,
    summaries,
)
from bench.http import RESULTS
from bench.kafka import Gateway
from bench.kafka_lanes import KAFKA_LATENCY_PRODUCER, KAFKA_SPREAD_PRODUCER, SPREAD_OUTSTANDING
from bench.lanes import Lane

MANY, FEW = 1000, 8
TOTAL_TRANSACTIONS = 5000  # of the consume log, over either topic: 100,000 records
TXN_SIZE = 20
KAFKA_BATCH = 20  # records per batch of Kafka's on-disk size
GROUPS = {
    "produce": ["spread_produce/8p/1", "spread_produce/1000p/1", "spread_produce/8p/8", "spread_produce/1000p/8"],
    "consume": ["spread_consume/8p/1", "spread_consume/1000p/1", "spread_consume/8p/8", "spread_consume/1000p/8"],
    "latency": ["latency/1", "latency/8"],
}
# The end-to-end lanes unpaced, in the rounds before the paced ones: the peak they run at half of.
LATENCY_PEAK = ["latency_peak/1", "latency_peak/8"]


def produce_topic(parts: int) -> str:
    return f"p-produce-{parts}"


def consume_topic(parts: int) -> str:
    return f"p-consume-{parts}"


LATENCY_TOPIC = "p-latency"


class Bench(Harness):
    def __init__(self, config, url: str, gateway: Gateway, pool: ClientPool) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, pool, libpq_url(url), lambda: [gateway])
        self.url = libpq_url(url)
        self.gateway = gateway
        self.ends: dict[int, dict[int, int]] = {}  # partitions -> partition -> one past its last visible record
        self.rates: dict[int, float] = {}  # lanes -> records/s of the latency lanes, in all
        for parts in (FEW, MANY):
            for n in (1, 8):
                self.add(f"spread_produce/{parts}p/{n}", self._produce_lanes(parts, n))
                self.add(f"spread_consume/{parts}p/{n}", self._consume_lanes(parts, n))
        for n in (1, 8):
            self.add(f"latency/{n}", self._latency_lanes(n, paced=True))
            self.add(f"latency_peak/{n}", self._latency_lanes(n, paced=False))

    def prepare(self, groups: list[str]) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        started = time.perf_counter()
        admin = AdminClient({"bootstrap.servers": self.gateway.target})
        topics = [NewTopic(produce_topic(p), p, 1) for p in (FEW, MANY)]
        topics += [NewTopic(consume_topic(p), p, 1) for p in (FEW, MANY)] + [NewTopic(LATENCY_TOPIC, FEW, 1)]
        for future in admin.create_topics(topics).values():
            future.result(timeout=60)
        with psycopg.connect(self.url) as conn:
            for parts in (FEW, MANY) if "consume" in groups else ():
                shape = datasets.LogShape(TOTAL_TRANSACTIONS // parts, TXN_SIZE, 1)
                for p in range(parts):
                    datasets.fill_log(conn, consume_topic(parts), p, shape, datasets.allocate_producer_ids(conn, 1))
                conn.commit()
                rows = conn.execute(
                    'SELECT partition, max("offset") FROM txlog.committed_records WHERE topic = %s GROUP BY partition',
                    (consume_topic(parts),),
                ).fetchall()
                self.ends[parts] = {p: last + 1 for p, last in rows}
                assert len(self.ends[parts]) == parts
        datasets.vacuum(self.url)
        print(
            f"set-up: topics of {FEW} and {MANY} partitions"
            + (
                f"; consume logs of {TOTAL_TRANSACTIONS * TXN_SIZE:,} records over each, in transactions of {TXN_SIZE}"
                if self.ends
                else ""
            )
            + f", built in {time.perf_counter() - started:.1f} s",
            flush=True,
        )

    def _produce_lanes(self, parts: int, n: int):  # type: ignore[no-untyped-def]
        return lambda: [
            Lane("kafka_spread_produce", self.gateway.target, produce_topic(parts), partitions=tuple(range(parts)))
            for _ in range(n)
        ]

    def _consume_lanes(self, parts: int, n: int):  # type: ignore[no-untyped-def]
        def lanes() -> list[Lane]:
            out = []
            for i in range(n):
                mine = tuple(range(i, parts, n))
                ends = tuple(self.ends[parts][p] for p in mine)
                out.append(
                    Lane(
                        "kafka_spread_fetch",
                        self.gateway.target,
                        consume_topic(parts),
                        mode="read_committed",
                        partitions=mine,
                        ends=ends,
                    )
                )
            return out

        return lanes

    def _latency_lanes(self, n: int, paced: bool):  # type: ignore[no-untyped-def]
        return lambda: [
            Lane(
                "kafka_latency",
                self.gateway.target,
                LATENCY_TOPIC,
                partitions=tuple(range(i, FEW, n)),
                rate=self.rates[n] / n if paced else 0.0,
            )
            for i in range(n)
        ]

    def rounds(self, groups: list[str]) -> None:
        order = [GROUPS[g] for g in groups if g != "latency"]
        if "latency" in groups:
            order.append(LATENCY_PEAK)
        prime = [key for group in order for key in group[:2]]
        if order:
            self.run_rounds(order, prime, shown=4)
        if "latency" in groups:
            for n in (1, 8):
                self.rates[n] = (report.median([w.rate for w in self.workloads[f"latency_peak/{n}"].windows]) or 0.0) / 2
            print(
                f"end to end at half the peak rate: {', '.join(f'{n} producer(s) {r:,.0f} records/s' for n, r in self.rates.items())}"
            )
            self.run_rounds([GROUPS["latency"]], [], shown=2)


def disk_per_record(url: str) -> dict[str, float]:
    """The log table's size with its indexes and TOAST after VACUUM, per byte of its records (keys,
    values, headers), beside Kafka's record batches v2 for the same records."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE txlog.records")
        table = conn.execute("SELECT pg_total_relation_size('txlog.records'), pg_relation_size('txlog.records')").fetchone()
        assert table is not None
        total, heap = table
        payload, count = conn.execute(
            """SELECT sum(coalesce(octet_length(key), 0) + coalesce(octet_length(value), 0)
                          + coalesce((SELECT sum(octet_length(k)) FROM unnest(header_keys) k), 0)
                          + coalesce((SELECT sum(octet_length(v)) FROM unnest(header_values) v), 0)), count(*)
               FROM txlog.records"""
        ).fetchone()  # type: ignore[misc]
        payload = int(payload)
        kafka = 0
        partitions = conn.execute("SELECT DISTINCT topic, partition FROM txlog.records ORDER BY 1, 2").fetchall()
        for topic, partition in partitions:
            rows = conn.execute(
                f'SELECT {RECORD_COLUMNS}, false FROM txlog.records r WHERE topic = %s AND partition = %s ORDER BY "offset"',
                (topic, partition),
            ).fetchall()
            records = [StoredRecord(*row) for row in rows]
            runs = [run[i : i + KAFKA_BATCH] for run in batch_runs(records) for i in range(0, len(run), KAFKA_BATCH)]
            kafka += len(encode_runs(runs))
    return {
        "records": float(count),
        "payload_bytes": float(payload),
        "table_bytes": float(total),
        "heap_bytes": float(heap),
        "txlog_per_payload_byte": total / payload,
        "kafka_per_payload_byte": kafka / payload,
        "kafka_bytes": float(kafka),
    }


def figures(bench: Bench) -> list[report.Row]:
    w = bench.workloads
    rows = []
    for key, label, kind, goal in (
        ("wire_spread_produce", "wire: idempotent produce, 1,000 partitions ÷ 8", "spread_produce", 0.7),
        ("wire_spread_consume", "wire: read_committed consume, 1,000 partitions ÷ 8", "spread_consume", 0.6),
    ):
        r = report.Row(key, label, "ratio")
        for n in ("1", "8"):
            num, den = f"{kind}/{MANY}p/{n}", f"{kind}/{FEW}p/{n}"
            if w[num].windows and w[den].windows:
                r.cells[n] = ratio_cell(w, num, den, report.Goal(">=", goal))
        rows.append(r)
    r = report.Row("wire_e2e_ms", "wire: produce → read_committed delivery at half the peak rate, ms", "ms")
    for n in ("1", "8"):
        if w[f"latency/{n}"].windows:
            for q, cell in latency_cells(w, f"latency/{n}", 3.0, 10.0).items():
                r.cells[f"{n}.{q}"] = cell
    rows.append(r)
    return [r for r in rows if r.cells]


def acknowledged_note(bench: Bench) -> str | None:
    """The first part of the end-to-end time, produce → acknowledged (the delivery report), and the
    rate each paced producer held against the one it was given: a producer that falls behind
    queues records in the client, and every later record waits for them."""
    parts = []
    for n in (1, 8):
        ws = bench.workloads[f"latency/{n}"].windows
        acked = [ms for w in ws for ms in w.acked_ms]
        if not ws or not acked:
            continue
        held = report.median([w.rate for w in ws]) or 0.0
        parts.append(
            f"{n} producer(s): produce → acknowledged p50 {report.percentile(acked, 50):.1f} / p99 "
            f"{report.percentile(acked, 99):.1f} ms, {held:,.0f} of {bench.rates[n]:,.0f} records/s held"
        )
    return "end to end at half the peak rate, " + "; ".join(parts) if parts else None


def parse(argv: list[str] | None) -> tuple[object, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__.split("\n\n")[0])
    round_arguments(ap, "3 rounds of 0.8 s windows (a few minutes)", GROUPS)
    ap.add_argument("--output", type=Path, default=RESULTS, help="where partitions.json and partitions.png go")
    args = ap.parse_args(argv)
    from bench.kafka import Config

    cfg = Config(**round_settings(ap, args, GROUPS), gateways=1)
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


def run(argv: list[str] | None = None) -> str:
    cfg, args = parse(argv)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(bench_database())
        reset(url)
        settings, pg_version = postgres_facts(url)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txlog-bench-partitions-")))
        gateway = Gateway(url, logs / "gateway.log", 0)
        stack.callback(gateway.stop)
        gateway.start()
        pool = ClientPool(cfg.clients)  # type: ignore[attr-defined]
        stack.callback(pool.close)
        bench = Bench(cfg, url, gateway, pool)
        print(
            f"txlog kafka (one process), {cfg.clients} client processes, {cfg.rounds} rounds of "  # type: ignore[attr-defined]
            f"{cfg.warmup:g} s warm-up + {cfg.window:g} s windows; PostgreSQL {pg_version} {settings}",  # type: ignore[attr-defined]
            flush=True,
        )
        bench.prepare(args.only)
        bench.rounds(args.only)
        disk = disk_per_record(libpq_url(url))
        rows = figures(bench)
        rows.append(
            report.Row(
                "disk_per_byte",
                f"disk per byte of records after VACUUM (Kafka's batches v2: {disk['kafka_per_payload_byte']:.2f})",
                "ratio",
                {
                    "1": report.Cell(
                        disk["txlog_per_payload_byte"], [disk["txlog_per_payload_byte"]], report.Goal("<=", 1.3), None
                    )
                },
            )
        )
        works = summaries(bench.workloads, lambda key: key.startswith("latency"))
        others = bench.other_load()
        machine = procs.machine(pg_version)
        elapsed = time.perf_counter() - started
    config = run_config(
        cfg,
        args.only,
        settings,
        elapsed,
        others,
        producer=KAFKA_SPREAD_PRODUCER,
        latency_producer=KAFKA_LATENCY_PRODUCER,
        outstanding_per_producer=SPREAD_OUTSTANDING,
        partitions=[FEW, MANY],
        latency_rates=bench.rates,
        kafka_batch_records=KAFKA_BATCH,
    )
    notes = [
        f"disk per record after VACUUM: the log table with its indexes and TOAST {disk['table_bytes'] / 2**20:,.1f} MiB "
        f"for {disk['records']:,.0f} rows, {disk['payload_bytes'] / 2**20:,.1f} MiB of keys, values and headers: "
        f"{disk['txlog_per_payload_byte']:.2f} bytes per byte (goal ≤ 1.3; the heap alone "
        f"{disk['heap_bytes'] / disk['payload_bytes']:.2f}); Kafka's record batches v2 for the same records "
        f"(batches of {KAFKA_BATCH}) {disk['kafka_per_payload_byte']:.2f}"
    ]
    acknowledged = acknowledged_note(bench)
    if acknowledged:
        notes.append(acknowledged)
    return publish(
        args.output,
        "partitions",
        "txlog over Kafka's wire protocol: many partitions",
        rows,
        works,
        machine,
        config,
        others,
        cfg.rounds,  # type: ignore[attr-defined]
        elapsed,
        goals_key="partitions_goals_met",
        extra={"disk": disk},
        notes=notes,
    )


if __name__ == "__main__":
    sys.exit(main())
