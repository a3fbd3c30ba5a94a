"""txlog over HTTP against the least PostgreSQL itself needs for the same work, in one run.

Everything runs on one machine: a real ``txlog serve --workers 2`` (a subprocess) on a throwaway
embedded PostgreSQL with fsync on (or ``TXLOG_DATABASE_URL``), and the load from separate client
processes (bench/clients.py). Batches are 100 records of 16-byte keys and 1 KiB values, sent as
JSON with encoding utf8; fetches ask for pages of 1000 records.

Every figure is a ratio to a baseline measured in the same run. A round runs one window per
workload, each baseline's window right before the windows compared with it; a figure is the
median over rounds of the ratio within each round, so drift of the machine (a checkpoint, another
tenant) falls on both sides. Throughput is rows completed per second in a fixed window after a
warm-up.

Baselines, and why:
- *raw append*: psycopg with binary parameters, one transaction per batch that locks a counter row
  (``SELECT … FOR UPDATE``), advances it and inserts the batch with ``INSERT … SELECT FROM
  unnest(…) WITH ORDINALITY`` into a table like txlog.records — what any durable log with dense
  offsets per partition must do at least. 8 producers are 8 connections, one partition each.
  txlog adds HTTP and JSON, the producer-state check, the high watermark and log position, the
  check for a long-poll listener (and for transactions the coordinator).
- *idempotent produce* for transactions: a transaction's price is what it adds to a producer that
  already has idempotence (the transaction row and its events, the markers, EndTxn's round trip).
- *raw page fetch*: psycopg with binary results reading 1000 rows of txlog.records by primary key,
  no filtering — what a reader pays at least. txlog adds HTTP and JSON, the last stable offset,
  leaving out markers and aborted records (10% of the transactions here).
- *scale*: the same workload on a small log / short history, in the same run.
- *PgQueuer*: a PostgreSQL job queue (PyPI ``pgqueuer``) called in-process on the same database,
  its schema installed by its installer, durable tables: ``enqueue`` of a batch of 100 against
  txlog's idempotent produce, ``dequeue`` of 100 + their ack (``log_jobs``) against txlog's
  read_committed fetch. The queue is filled and vacuumed before its window. The comparison says
  what a user gives up or gains by putting a log over HTTP where a queue library would go.

The history of 10^5 transactions lives in a second database of the same PostgreSQL, served by a
second ``txlog serve``, against the main database's short one (the coordinator's tables are shared
by all of a database's transactional ids, so a short and a long history cannot share one). The
log-length rows compare two partitions of one topic in that second database, its 10^6-record
partition 0 and a 10^4-record partition 1, through the same server: two servers and two databases
differ in more than the log (the main one carries every other workload, and its background work
and caches with it), which moved those rows by 10-15% either way between runs. Records of another
topic sort after both in the log's primary key, enough to fill leaf pages of their own, so that
neither partition is appended at the index's rightmost leaf: PostgreSQL inserts there without
descending the tree whenever the new key sorts after the page's first one, which had made every
batch on the short log touch two fewer index pages per record than on the long one (431 against
236 buffer reads for a batch of 100). The fetch row's readers walk the same number of records,
the last 10^4 of each log, over and over: walking the whole long log instead reads 1.3 GB in
circles through PostgreSQL's 128 MB of shared buffers, every page from the kernel's cache, which
measures the buffer cache against a working set a hundred times larger, not the log's length
(0.86 so, with PostgreSQL's CPU per row 20% higher and the server's the same). Both servers are
up throughout; only one is under load at a time.

Beside every figure: the CPU seconds per 1000 rows of the client processes (getrusage), of the
two servers' processes and of PostgreSQL (both from /proc), and how busy the whole machine was,
so a saturated machine or a load generator that became the bottleneck shows.

    python -m bench.http [--quick] [--rounds N] [--window S] [--only produce1,produce8,fetch1,fetch8,scale]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import orjson
import psycopg

from app.storage import migrate
from app.storage.db import libpq_url
from bench import datasets, procs, report
from bench.clients import ClientPool
from bench.common import bench_database, reset
from bench.harness import (
    Harness,
    ServerProcess,
    Window,
    latency_cells,
    postgres_facts,
    publish,
    ratio_cell,
    round_arguments,
    round_settings,
    run_config,
)
from bench.harness import summaries as workload_summaries
from bench.http_lanes import Http
from bench.lanes import BATCH, PAGE, Lane, LaneResult
from bench.postgres_lanes import PGQ_DEQUEUE, PGQ_ENQUEUE, PGQ_SCHEMA, create_raw_tables, pgq_queries

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PARTITIONS = 8
SHORT_LOG = 1  # the scale topic's partition of the short log, beside the long one (0)
RIGHTMOST = "zz-rightmost"  # a topic whose name sorts after "scale"
RIGHTMOST_RECORDS = 5_000  # its records: about 25 of the primary key's leaf pages
FETCH_LOG = datasets.LogShape(transactions=200, txn_size=100, producers=1)  # per partition of the fetch topic

# A round: each group's windows in this order, every baseline right before what it is compared with.
GROUPS = {
    "produce1": ["raw_append/1", "plain/1", "idempotent/1", "pgq_enqueue/1", "txn10/1", "txn1/1", "txn1c/1"],
    "produce8": ["raw_append/8", "plain/8", "idempotent/8", "pgq_enqueue/8", "txn10/8", "txn1/8", "txn1c/8"],
    "fetch1": ["raw_fetch/1", "read_committed/1", "read_uncommitted/1", "pgq_dequeue/1"],
    "fetch8": ["raw_fetch/8", "read_committed/8", "read_uncommitted/8", "pgq_dequeue/8"],
    "scale": [
        "scale_produce_small",
        "scale_produce_big",
        "scale_fetch_small",
        "scale_fetch_big",
        "scale_txn_small",
        "scale_txn_big",
    ],
}


@dataclass(frozen=True)
class Config:
    rounds: int
    window: float
    warmup: float
    clients: int
    big_transactions: int  # of 9 records + marker: 10^5 make the 10^6-record log
    small_transactions: int
    quick: bool

    @property
    def big(self) -> datasets.LogShape:
        return datasets.LogShape(self.big_transactions, 9, 1000)

    @property
    def small(self) -> datasets.LogShape:
        return datasets.LogShape(self.small_transactions, 9, 10)


# --- servers --------------------------------------------------------------------------------------


class Server(ServerProcess):
    """``txlog serve --workers N``: the uvicorn supervisor and its workers."""

    name = "txlog serve"

    def __init__(self, url: str, workers: int, log: Path) -> None:
        super().__init__(url, log)
        self.workers = workers

    def args(self) -> list[str]:
        return ["serve", "--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning"]

    def ready(self) -> bool:
        probe = Http(self.target)
        try:
            probe.call("GET", "/readyz")
            return True
        except (OSError, RuntimeError):
            return False
        finally:
            probe.close()


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(libpq_url(url))
    return urlunsplit(parts._replace(path="/" + name))


@contextlib.contextmanager
def sibling_database(url: str, name: str) -> Iterator[str]:
    """A second, migrated database on the same PostgreSQL, dropped afterwards."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    other = _with_database(url, name)
    try:
        migrate.upgrade(other)
        yield other
    finally:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def install_pgqueuer(url: str) -> None:
    """PgQueuer's schema, anew, by its installer."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        q = pgq_queries(conn)
        if await q.schema_is_installed():
            await q.uninstall()
        await q.install()
    finally:
        await conn.close()


class Bench(Harness):
    def __init__(self, config: Config, main_url: str, big_url: str, main: Server, big: Server, pool: ClientPool) -> None:
        super().__init__(config, pool, libpq_url(main_url), lambda: [main, big])
        self.config: Config = config
        self.main_url, self.big_url = libpq_url(main_url), libpq_url(big_url)
        self.main, self.big = main, big
        self.cursors: dict[tuple[str, int], int] = {}  # where each fetch lane's walk stopped
        self.dequeue_rate: dict[str, float] = {}
        self._define()

    # -- set-up ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        started = time.perf_counter()
        main, big = Http(self.main.target), Http(self.big.target)
        for name in ("b-plain", "b-idem", "b-txn10", "b-txn1", "b-txn1c", "b-fetch"):
            main.call("POST", "/v1/topics", b'{"name":"%s","partitions":%d}' % (name.encode(), PARTITIONS))
        main.call("POST", "/v1/topics", b'{"name":"scale","partitions":1}')
        big.call("POST", "/v1/topics", b'{"name":"scale","partitions":2}')  # 1: the short log beside the long one
        # Records past both scale partitions in the log's primary key, on leaf pages of their own:
        # neither partition's appends go to the index's rightmost leaf, which PostgreSQL inserts
        # into without descending the tree (as any partition but the last of a database appends).
        big.call("POST", "/v1/topics", b'{"name":"%s","partitions":1}' % RIGHTMOST.encode())
        past = b'{"records":[%s]}' % b",".join([b'{"value":"past the scale topic"}'] * 1000)
        for _ in range(RIGHTMOST_RECORDS // 1000):
            big.call("POST", f"/v1/topics/{RIGHTMOST}/partitions/0/records", past)
        main.close()
        big.close()
        with psycopg.connect(self.main_url) as conn:
            for p in range(PARTITIONS):
                datasets.fill_log(conn, "b-fetch", p, FETCH_LOG, datasets.allocate_producer_ids(conn, 1))
            small = self.config.small
            base = datasets.allocate_producer_ids(conn, small.producers)
            datasets.fill_log(conn, "scale", 0, small, base)
            datasets.fill_history(conn, "hist-", "scale", 0, small, base)
            create_raw_tables(conn, PARTITIONS)
            conn.commit()
            # One transaction in ten aborted: exactly what txlog's definition of visible leaves.
            for topic, shape in (("b-fetch", FETCH_LOG), ("scale", small)):
                (visible,) = conn.execute(
                    "SELECT count(*) FROM txlog.committed_records WHERE topic = %s AND partition = 0", (topic,)
                ).fetchone()  # type: ignore[misc]
                assert visible == shape.transactions * shape.txn_size * 9 // 10, (topic, visible)
        with psycopg.connect(self.big_url) as conn:
            big_shape = self.config.big
            base = datasets.allocate_producer_ids(conn, big_shape.producers)
            datasets.fill_log(conn, "scale", 0, big_shape, base)
            datasets.fill_history(conn, "hist-", "scale", 0, big_shape, base)
            datasets.fill_log(conn, "scale", SHORT_LOG, small, datasets.allocate_producer_ids(conn, small.producers))
        asyncio.run(install_pgqueuer(self.main_url))
        self._settle()
        # What was built is what txlog serves: the watermarks, and a history it can read.
        for server, shapes in ((self.main, [self.config.small]), (self.big, [self.config.big, self.config.small])):
            client = Http(server.target)  # a new connection: the server has closed the idle ones
            doc = orjson.loads(client.call("GET", "/v1/topics/scale"))
            for part, shape in zip(doc["partitions"], shapes, strict=True):
                assert part["high_watermark"] == part["last_stable_offset"] == shape.offsets, part
            txn = orjson.loads(client.call("GET", "/v1/transactions/hist-0"))
            assert txn["state"] in ("CompleteCommit", "CompleteAbort"), txn
            client.close()
        print(
            f"set-up: logs of {FETCH_LOG.offsets:,} offsets x {PARTITIONS} partitions (fetch), "
            f"{self.config.small.offsets:,} and {self.config.big.offsets:,} offsets (scale), histories of "
            f"{self.config.small.transactions:,} and {self.config.big.transactions:,} transactions, built in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )

    # -- workloads -------------------------------------------------------------------------------
    def _define(self) -> None:
        m, b = self.main, self.big
        small_end, big_end = self.config.small.offsets, self.config.big.offsets
        for n in (1, PARTITIONS):
            self._add(f"raw_append/{n}", self._lanes("raw_append", self.main_url, n))
            for key, topic, mode, every in (
                ("plain", "b-plain", "plain", 0),
                ("idempotent", "b-idem", "idempotent", 0),
                ("txn10", "b-txn10", "transactional", 10),
                ("txn1", "b-txn1", "transactional", 1),
                ("txn1c", "b-txn1c", "committed", 1),
            ):
                self._add(f"{key}/{n}", self._produce_lanes(f"{key}-{n}", m, topic, mode, every, n))
            self._add(f"pgq_enqueue/{n}", self._lanes("pgq_enqueue", self.main_url, n), after=self._drop_enqueued)
            self._add(f"raw_fetch/{n}", self._fetch_lanes(f"raw_fetch/{n}", "raw_fetch", self.main_url, "b-fetch", "", n))
            for iso in ("read_committed", "read_uncommitted"):
                self._add(f"{iso}/{n}", self._fetch_lanes(f"{iso}/{n}", "fetch", m.target, "b-fetch", iso, n))
            self._add(
                f"pgq_dequeue/{n}",
                self._lanes("pgq_dequeue", self.main_url, n),
                before=functools.partial(self._fill_queue, f"pgq_dequeue/{n}", n),
            )
        # The log's length: one server, one database, partition 0 (long) against SHORT_LOG. Each pair
        # starts after both databases are vacuumed and checkpointed, so that the maintenance the
        # windows before call for (autovacuum after their inserts, a checkpoint) runs before the
        # pair rather than in one of its windows. Without it, in some rounds every process on the
        # machine, the client included, spent up to 40% more CPU per row in one window of a pair.
        settle = self._settle
        # Both readers walk the last small_end records of their log, over and over: the same working
        # set, so that what differs is the log's length alone (see the module's doc).
        for size, partition, end in (("small", SHORT_LOG, small_end), ("big", 0, big_end)):
            self._add(
                f"scale_produce_{size}",
                self._produce_lanes(f"scale-idem-{size}", b, "scale", "idempotent", 0, 1, partition),
                before=settle if size == "small" else None,
            )
            self._add(
                f"scale_fetch_{size}",
                self._fetch_lanes(
                    f"scale_fetch_{size}", "fetch", b.target, "scale", "read_committed", 1, end, partition, start=end - small_end
                ),
                before=settle if size == "small" else None,
            )
        # The history's length: a database each.
        for size, server in (("small", m), ("big", b)):
            self._add(
                f"scale_txn_{size}",
                self._produce_lanes(f"scale-txn-{size}", server, "scale", "transactional", 1, 1),
                before=settle if size == "small" else None,
            )

    def _settle(self) -> None:
        """Vacuum and checkpoint both databases (before a pair of scale windows)."""
        datasets.vacuum(self.main_url)
        datasets.vacuum(self.big_url)

    def _add(
        self,
        key: str,
        lanes: Callable[[], list[Lane]],
        before: Callable[[], None] | None = None,
        after: Callable[[list[tuple[Lane, LaneResult]]], None] | None = None,
    ) -> None:
        self.add(key, lanes, before, after or self._keep_cursors(key))

    @staticmethod
    def _lanes(kind: str, target: str, n: int) -> Callable[[], list[Lane]]:
        """``n`` lanes of ``kind``, lane i on partition i (where a partition applies)."""
        return lambda: [Lane(kind, target, partition=i) for i in range(n)]

    @staticmethod
    def _produce_lanes(
        name: str, server: Server, topic: str, mode: str, every: int, n: int, first: int = 0
    ) -> Callable[[], list[Lane]]:
        """``n`` lanes on partitions ``first`` … ``first + n - 1``."""
        return lambda: [
            Lane("produce", server.target, topic, i, mode, every, transactional_id=f"bench-{name}-{i}")
            for i in range(first, first + n)
        ]

    def _fetch_lanes(
        self, key: str, kind: str, target: str, topic: str, mode: str, n: int, end: int = 0, first: int = 0, start: int = 0
    ) -> Callable[[], list[Lane]]:
        return lambda: [
            Lane(kind, target, topic, i, mode, offset=self.cursors.get((key, i), start), end=end, start=start)
            for i in range(first, first + n)
        ]

    def _keep_cursors(self, key: str) -> Callable[[list[tuple[Lane, LaneResult]]], None]:
        def keep(done: list[tuple[Lane, LaneResult]]) -> None:
            for lane, result in done:
                if lane.kind in ("fetch", "raw_fetch"):
                    self.cursors[(key, lane.partition)] = result.offset

        return keep

    def _drop_enqueued(self, done: list[tuple[Lane, LaneResult]]) -> None:
        """Empty the enqueue workload's jobs (and vacuum now, not during a later window)."""
        with psycopg.connect(self.main_url, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {PGQ_SCHEMA}.pgqueuer WHERE entrypoint = %s", (PGQ_ENQUEUE,))
            conn.execute(f"VACUUM {PGQ_SCHEMA}.pgqueuer")

    def _fill_queue(self, key: str, lanes: int) -> None:
        """Enough queued jobs for the window at the rate seen so far (and half again), vacuumed."""
        rate = self.dequeue_rate.get(key, 10_000.0 if lanes == 1 else 20_000.0)
        datasets.fill_pgqueuer(
            self.main_url, PGQ_DEQUEUE, datasets.window_target(rate, self.config.warmup + self.config.window, lanes, BATCH)
        )

    # -- running ---------------------------------------------------------------------------------
    def rounds(self, groups: list[str]) -> None:
        assert sorted(k for g in GROUPS.values() for k in g) == sorted(self.workloads), "every workload in a group"
        # Prime both servers (connection pools, caches, prepared statements) before anything counts.
        prime = ["idempotent/8", "txn1/8", "read_committed/8", "scale_produce_big", "scale_fetch_big", "scale_txn_big"]
        self.run_rounds([GROUPS[g] for g in groups], prime, on_window=self._seen)

    def _seen(self, key: str, result: Window) -> None:
        if key.startswith("pgq_dequeue"):
            self.dequeue_rate[key] = max(result.rate, 1000.0)


# --- figures --------------------------------------------------------------------------------------


def figures(bench: Bench) -> list[report.Row]:
    cfg = bench.config

    def ratio(key: str, label: str, num: str, den: str, goal: report.Goal) -> report.Row:
        row = report.Row(key, label, "ratio")
        for n in ("1", "8"):
            row.cells[n] = ratio_cell(bench.workloads, num.format(n=n), den.format(n=n), goal)
        return row

    rows = [
        ratio("idem_raw", "idempotent produce ÷ raw append", "idempotent/{n}", "raw_append/{n}", report.Goal(">=", 0.5)),
        ratio("plain_raw", "plain produce ÷ raw append", "plain/{n}", "raw_append/{n}", report.Goal(">=", 0.5)),
        ratio(
            "txn10_idem",
            "transactional, commit every 10 batches ÷ idempotent",
            "txn10/{n}",
            "idempotent/{n}",
            report.Goal(">=", 0.9),
        ),
        ratio(
            "txn1_idem", "transactional, commit every batch ÷ idempotent", "txn1/{n}", "idempotent/{n}", report.Goal(">=", 0.8)
        ),
        ratio(
            "txn1c_idem",
            'transactional, each batch committing its transaction ("commit": true) ÷ idempotent',
            "txn1c/{n}",
            "idempotent/{n}",
            report.Goal(">=", 0.8),
        ),
    ]
    endtxn = report.Row("endtxn_ms", "EndTxn p50 / p99 ms (commit every batch)", "ms")
    for n, (g50, g99) in (("1", (3.0, 10.0)), ("8", (15.0, 50.0))):
        for q, cell in latency_cells(bench.workloads, f"txn1/{n}", g50, g99).items():
            endtxn.cells[f"{n}.{q}"] = cell
    rows.append(endtxn)
    rows += [
        ratio("rc_raw", "read_committed fetch ÷ raw page fetch", "read_committed/{n}", "raw_fetch/{n}", report.Goal(">=", 0.5)),
        ratio(
            "ru_raw", "read_uncommitted fetch ÷ raw page fetch", "read_uncommitted/{n}", "raw_fetch/{n}", report.Goal(">=", 0.6)
        ),
    ]
    within = report.Goal("~", 0.10)
    big, small = cfg.big, cfg.small
    for key, label, workload in (
        ("scale_produce", f"scale: idempotent produce, {big.offsets:,}- ÷ {small.offsets:,}-record log", "scale_produce"),
        ("scale_fetch", f"scale: read_committed fetch, {big.offsets:,}- ÷ {small.offsets:,}-record log", "scale_fetch"),
        ("scale_txn", f"scale: commit every batch after {big.transactions:,} ÷ {small.transactions:,} txns", "scale_txn"),
    ):
        row = report.Row(key, label, "ratio")
        row.cells["1"] = ratio_cell(bench.workloads, f"{workload}_big", f"{workload}_small", within)
        rows.append(row)
    rows += [
        ratio(
            "pgq_enqueue",
            "PgQueuer enqueue ÷ txlog idempotent produce",
            "pgq_enqueue/{n}",
            "idempotent/{n}",
            report.Goal("<=", 1.0),
        ),
        ratio(
            "pgq_dequeue",
            "PgQueuer dequeue+ack ÷ txlog read_committed fetch",
            "pgq_dequeue/{n}",
            "read_committed/{n}",
            report.Goal("<=", 0.3),
        ),
    ]
    return rows


def summaries(bench: Bench) -> list[report.WorkloadSummary]:
    return workload_summaries(bench.workloads, lambda key: key.startswith(("txn1", "scale_txn")))


# --- main -----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m bench.http", description=__doc__.split("\n\n")[0])
    round_arguments(ap, "3 rounds of 0.8 s windows (about 2 minutes with set-up)", GROUPS)
    ap.add_argument(
        "--big-transactions",
        type=int,
        default=100_000,
        help="transactions of the big log, 10 offsets each, over 1000 transactional ids (a multiple of 1000)",
    )
    ap.add_argument(
        "--small-transactions",
        type=int,
        default=1_000,
        help="the same for the small log, over 10 transactional ids (a multiple of 10)",
    )
    ap.add_argument("--output", type=Path, default=RESULTS, help="where latest.json and latest.png go")
    args = ap.parse_args(argv)
    cfg = Config(
        **round_settings(ap, args, GROUPS), big_transactions=args.big_transactions, small_transactions=args.small_transactions
    )
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


def run(argv: list[str] | None = None) -> str:
    """Set up, run every round, print and write the results; answers the summary line."""
    cfg, args = parse(argv)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(bench_database())
        reset(url)
        settings, pg_version = postgres_facts(url)
        big_url = stack.enter_context(sibling_database(url, "txlog_bench_big"))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txlog-bench-logs-")))
        main_server, big_server = Server(url, 2, logs / "main.log"), Server(big_url, 2, logs / "big.log")
        for server in (main_server, big_server):
            stack.callback(server.stop)
            server.start()
        pool = ClientPool(cfg.clients)
        stack.callback(pool.close)
        bench = Bench(cfg, url, big_url, main_server, big_server, pool)
        print(
            f"txlog serve --workers 2 x2 (main and big database), {cfg.clients} client processes, {cfg.rounds} rounds of "
            f"{cfg.warmup:g} s warm-up + {cfg.window:g} s windows; PostgreSQL {pg_version} {settings}",
            flush=True,
        )
        bench.prepare()
        bench.rounds(args.only)
        rows = figures(bench)
        works = summaries(bench)
        others = bench.other_load()
        machine = procs.machine(pg_version)
        elapsed = time.perf_counter() - started

    config = run_config(cfg, args.only, settings, elapsed, others, page_records=PAGE, server_workers=2)
    what = "txlog over HTTP vs baselines"
    return publish(args.output, "latest", what, rows, works, machine, config, others, cfg.rounds, elapsed)


if __name__ == "__main__":
    sys.exit(main())
