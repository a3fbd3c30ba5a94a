"""txlog over Kafka's wire protocol, driven by Kafka's own client, against the least PostgreSQL itself
needs for the same work, in one run.

The method is bench.http's (read its docstring): a real server on a throwaway embedded PostgreSQL
with fsync on (or ``TXLOG_DATABASE_URL``), the load from separate client processes, every figure
the median over rounds of a ratio to a baseline measured in the same round, windows interleaved,
the CPU of the clients, the server, PostgreSQL and the whole machine beside each figure.

- The server is one ``txlog kafka`` process (the gateway: one asyncio loop, the services in its
  thread pool), where the HTTP figures have ``txlog serve --workers 2``.
- The clients are confluent-kafka (librdkafka) in client processes (bench/clients.py). Records
  have 16-byte keys and 1 KiB values; librdkafka cuts batches at 100 records
  (``batch.num.messages``), uncompressed, as the HTTP produce bodies are.
- "8" is 8 clients, each its own producer (or consumer) on its own partition of an 8-partition
  topic, as the raw baseline's 8 connections are; "1" is one client on partition 0.

Workloads:
- *idempotent produce*: acks=all, enable.idempotence=true, linger.ms=5.
- *transactional produce*: the same with a transactional.id, ``commit_transaction`` every 10
  batches (which waits for the batches' acknowledgements, then sends EndTxn). librdkafka speaks
  Kafka's first transaction protocol here: AddPartitionsToTxn, EndTxn keeping the epoch.
- *read_committed consume*: ``assign`` (no group) over bench.http's fetch log (transactions of
  100 records and a marker, one in ten aborted; partition 0 five times as long), seeking back to
  the start ``WRAP_MARGIN`` offsets before its last visible record. Counted: records the client
  hands to the application. Aborted records cross the wire and the client drops them; markers
  are never handed over.

Baselines (bench.http's, the same code): the *raw append* (psycopg, binary ``bytea[]`` parameters,
a counter row lock and ``INSERT … SELECT FROM unnest``, one transaction per batch of 100) and the
*raw page fetch* (1000 rows by primary key, binary results).

With ``--gateways 2`` a second phase follows: a second ``txlog kafka`` (node id 1) joins on the
same database, and the 8-lane windows (``produce8``, ``fetch8``) run again, each producer
bootstrapping at gateway ``partition % 2``. Metadata lists the live gateways and spreads
partition leadership over them, so producers and consumers follow their partitions' leaders; the
raw append and the raw page fetch are measured again in that phase's rounds.

``--profile`` runs one more window (idempotent produce, 8 producers; at least 3 s, not counted)
with py-spy (in .venv) sampling whichever gateway thread holds the GIL, and the CPU time of each
gateway thread read from /proc around it: it says how busy the event loop and the GIL are and
where a batch's GIL time goes (bench/results/kafka-profile.txt keeps the samples).

    python -m bench.kafka [--quick] [--rounds N] [--window S] [--gateways 1|2] [--profile]
                          [--only produce1,produce8,fetch1,fetch8]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psycopg

from app.storage.db import libpq_url
from bench import datasets, procs, profiles, report
from bench.clients import ClientPool
from bench.common import bench_database, reset
from bench.harness import (
    Harness,
    ServerProcess,
    Window,
    postgres_facts,
    publish,
    ratio_cell,
    round_arguments,
    round_settings,
    run_config,
    summaries,
)
from bench.http import FETCH_LOG, PARTITIONS, RESULTS
from bench.kafka_lanes import KAFKA_CONSUMER, KAFKA_PRODUCER
from bench.lanes import BATCH, PAGE, Lane, LaneResult
from bench.postgres_lanes import create_raw_tables

TOPICS = {"idempotent": "k-idem", "txn10": "k-txn10", "fetch": "k-fetch"}
COMMIT_EVERY = 10
# A consumer seeks back to the log start this many offsets before the end of what it can read:
# librdkafka fetches a few pages ahead (KAFKA_CONSUMER), and a fetch at the end would wait
# (fetch.wait.max.ms) for records that never come, stalling the lane for half a second per lap.
WRAP_MARGIN = 8 * PAGE
# Partition 0 of the fetch topic, which the one-consumer lane reads, is five times as long: a seek
# empties the consumer's prefetch, so each lap costs it a fetch or two.
FIRST_FETCH_LOG = datasets.LogShape(FETCH_LOG.transactions * 5, FETCH_LOG.txn_size, FETCH_LOG.producers)


def fetch_shape(partition: int) -> datasets.LogShape:
    return FIRST_FETCH_LOG if partition == 0 else FETCH_LOG


GROUPS = {
    "produce1": ["raw_append/1", "idempotent/1", "txn10/1"],
    "produce8": ["raw_append/8", "idempotent/8", "txn10/8"],
    "fetch1": ["raw_fetch/1", "read_committed/1"],
    "fetch8": ["raw_fetch/8", "read_committed/8"],
}
# The second phase, with two gateways: the 8-lane groups again.
GROUPS_TWO = {"produce8": ["raw_append/8x2", "idempotent/8x2", "txn10/8x2"], "fetch8": ["raw_fetch/8x2", "read_committed/8x2"]}


@dataclass(frozen=True)
class Config:
    rounds: int
    window: float
    warmup: float
    clients: int
    gateways: int
    quick: bool


class Gateway(ServerProcess):
    """``txlog kafka`` on a free port under a node id."""

    name = "txlog kafka"

    def __init__(self, url: str, log: Path, node_id: int) -> None:
        super().__init__(url, log)
        self.node_id = node_id

    def args(self) -> list[str]:
        return ["kafka", "--listen", self.target, "--node-id", str(self.node_id), "--log-level", "warning"]

    def ready(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


def brokers_listed(bootstrap: str) -> int:
    """How many brokers the gateway at ``bootstrap`` names in Metadata."""
    from confluent_kafka.admin import AdminClient

    return len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)


class Bench(Harness):
    def __init__(self, config: Config, url: str, gateways: list[Gateway], pool: ClientPool) -> None:
        self.gateways = gateways
        self.live = 1  # gateways up: the first phase runs with one
        super().__init__(config, pool, libpq_url(url), lambda: self.gateways[: self.live])
        self.config: Config = config
        self.url = libpq_url(url)
        self.ends: dict[int, int] = {}  # partition of the fetch topic -> one past its last visible record
        self.cursors: dict[tuple[str, int], int] = {}
        self._define()

    # -- set-up ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        started = time.perf_counter()
        admin = AdminClient({"bootstrap.servers": self.gateways[0].target})
        for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in TOPICS.values()]).values():
            future.result(timeout=30)
        with psycopg.connect(self.url) as conn:
            for p in range(PARTITIONS):
                datasets.fill_log(conn, TOPICS["fetch"], p, fetch_shape(p), datasets.allocate_producer_ids(conn, 1))
            create_raw_tables(conn, PARTITIONS)
            conn.commit()
            for p, visible, last in conn.execute(
                'SELECT partition, count(*), max("offset") FROM txlog.committed_records WHERE topic = %s GROUP BY partition',
                (TOPICS["fetch"],),
            ):
                shape = fetch_shape(p)
                assert visible == shape.transactions * shape.txn_size * 9 // 10, (p, visible)
                self.ends[p] = last + 1
        assert sorted(self.ends) == list(range(PARTITIONS)), self.ends
        datasets.vacuum(self.url)
        print(
            f"set-up: topics {', '.join(TOPICS.values())} of {PARTITIONS} partitions; a fetch log of "
            f"{FIRST_FETCH_LOG.offsets:,} offsets in partition 0 and {FETCH_LOG.offsets:,} in the others (10% of its "
            f"transactions aborted), built in {time.perf_counter() - started:.1f} s",
            flush=True,
        )

    # -- workloads -------------------------------------------------------------------------------
    def _define(self) -> None:
        for n, suffix, spread in ((1, "", 1), (PARTITIONS, "", 1), (PARTITIONS, "x2", 2)):
            self.add(f"raw_append/{n}{suffix}", lambda n=n: [Lane("raw_append", self.url, partition=i) for i in range(n)])
            for key, mode, every in (("idempotent", "idempotent", 0), ("txn10", "transactional", COMMIT_EVERY)):
                self.add(f"{key}/{n}{suffix}", self._produce_lanes(f"{key}-{n}{suffix}", TOPICS[key], mode, every, n, spread))
        for n, suffix in ((1, ""), (PARTITIONS, ""), (PARTITIONS, "x2")):
            for kind, lane_kind in (("raw_fetch", "raw_fetch"), ("read_committed", "kafka_fetch")):
                key = f"{kind}/{n}{suffix}"
                self.add(key, self._fetch_lanes(key, lane_kind, n), after=self._keep_cursors(key))

    def _bootstrap(self, partition: int, spread: int) -> str:
        return self.gateways[partition % spread].target

    def _produce_lanes(self, name: str, topic: str, mode: str, every: int, n: int, spread: int) -> Callable[[], list[Lane]]:
        return lambda: [
            Lane("kafka_produce", self._bootstrap(i, spread), topic, i, mode, every, transactional_id=f"bench-{name}-{i}")
            for i in range(n)
        ]

    def _fetch_lanes(self, key: str, kind: str, n: int) -> Callable[[], list[Lane]]:
        def lanes() -> list[Lane]:
            if kind == "raw_fetch":  # wraps at the end of the log (a short page)
                return [Lane(kind, self.url, TOPICS["fetch"], i, offset=self.cursors.get((key, i), 0)) for i in range(n)]
            return [
                Lane(
                    kind,
                    self.gateways[0].target,
                    TOPICS["fetch"],
                    i,
                    "read_committed",
                    offset=self.cursors.get((key, i), 0),
                    end=self.ends[i] - WRAP_MARGIN,
                )
                for i in range(n)
            ]

        return lanes

    def _keep_cursors(self, key: str) -> Callable[[list[tuple[Lane, LaneResult]]], None]:
        def keep(done: list[tuple[Lane, LaneResult]]) -> None:
            for lane, result in done:
                self.cursors[(key, lane.partition)] = result.offset

        return keep

    # -- running ---------------------------------------------------------------------------------
    def rounds(self, groups: list[str]) -> None:
        # Prime the gateway (its pool, caches, prepared statements) before anything counts.
        prime = ["idempotent/8", "txn10/8"] + (["read_committed/8"] if "fetch8" in groups else [])
        self.run_rounds([GROUPS[g] for g in groups], prime)

    def second_gateway(self) -> int:
        """Start the second gateway; answers how many brokers Metadata lists once it has joined
        (1 when gateways do not form a cluster: each lane then stays on the gateway it bootstraps at)."""
        second = self.gateways[1]
        second.start()
        self.live = 2
        deadline = time.monotonic() + 20
        while True:
            listed = brokers_listed(self.gateways[0].target)
            if listed >= 2 or time.monotonic() > deadline:
                return listed
            time.sleep(0.5)

    def rounds_two(self, groups: list[str]) -> None:
        """The phase-two windows of ``groups`` (those with 8 lanes), with both gateways up."""
        order = [GROUPS_TWO[g] for g in groups if g in GROUPS_TWO]
        if order:
            self.run_rounds(order, [key for group in order for key in group if not key.startswith("raw_")])

    # -- profile ---------------------------------------------------------------------------------
    def profile(self, key: str, raw: Path) -> Profile | None:
        """One more ``key`` window (not counted, at least 3 s) with py-spy sampling the first
        gateway's thread that holds the GIL, and each of its threads' CPU time read around it."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        pid = self.gateways[0].pgid
        window = max(self.config.window, 3.0)
        loaded = self.config.warmup + window
        # Long enough for the lanes' set-up too; without load no thread holds the GIL for long.
        cmd = [
            spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(PROFILE_RATE),
            "--duration",
            str(round(loaded + 4)),
            "--gil",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(raw),
        ]
        spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # attached
        edges: list[dict[int, tuple[float, float]]] = []
        sample = self._sample

        def sample_threads() -> tuple[float, float, float | None, tuple[float, float, float]]:
            edges.append(procs.thread_cpu(pid))  # at the start and at the end of the measured window
            return sample()

        self._sample = sample_threads  # type: ignore[method-assign]
        try:
            result = self.run_window(self.workloads[key], window=window)
        finally:
            del self._sample
        before, after = edges
        _, err = spy_proc.communicate(timeout=60)
        if spy_proc.returncode != 0 or not raw.exists():
            print(f"py-spy failed ({spy_proc.returncode}): {err.decode(errors='replace')[-500:]}", file=sys.stderr)
            return None
        used = {tid: (u - before.get(tid, (0.0, 0.0))[0], st - before.get(tid, (0.0, 0.0))[1]) for tid, (u, st) in after.items()}
        return Profile(key, result, loaded, pid, used, raw.read_text())


# --- the profile, read ------------------------------------------------------------------------------

PROFILE_RATE = 500  # py-spy samples per second

# Where a sample of the GIL-holding thread went, as (label, a piece of a frame's text); frames read
# "function (path:line)". The first of _PARTS found anywhere on the stack names it (the steps of a
# produce, inner ones first: the service's calls into psycopg count as psycopg); else the
# first frame from the leaf up that holds one of _PLACES (thread pool and event loop machinery,
# which sits at the root of every stack).
_PARTS: list[tuple[str, str]] = [
    ("psycopg: parameters to binary, pipeline, results", "psycopg/"),
    ("SQLAlchemy: pool checkout and return, transaction", "sqlalchemy/"),
    ("record size limits, checked per record", "(app/domain/limits.py"),
    ("record batch decode (CRC-32C, varints, records)", "decode_batches (app/wire/kafka/records/decode.py"),
    ("batch to the service's produce request", "produce_request (api/kafka/handlers/produce.py"),
    ("produce service and queries, own code", "(app/services/"),
    ("request decode (kafka-python structs)", "decode_request (app/wire/kafka/requests.py"),
    (
        "response encode (Produce and Fetch written directly, others by kafka-python)",
        "encode_response (app/wire/kafka/structs.py",
    ),
    ("request header", "read_header (app/wire/kafka/requests.py"),
]
_PLACES: list[tuple[str, str]] = [
    ("socket reads and writes (asyncio streams)", "asyncio/streams.py"),
    ("gateway dispatch and handlers, own code", "(api/kafka/"),
    ("gateway dispatch and handlers, own code", "(app/wire/kafka/"),
    ("thread pool hand-off (futures, locks)", "concurrent/futures/"),
    ("thread pool hand-off (futures, locks)", "threading.py"),
    ("event loop (uvloop, asyncio tasks and futures)", "asyncio/"),
]


def bucket(frames: list[str]) -> str:
    for label, piece in _PARTS:
        if any(piece in f for f in frames):
            return label
    return next((label for f in reversed(frames) for label, piece in _PLACES if piece in f), "other")


@dataclass
class Profile:
    key: str
    window: Window
    loaded_s: float  # seconds of load py-spy saw: warm-up and window
    pid: int  # the gateway's main thread, which runs its event loop
    threads: dict[int, tuple[float, float]]  # user and system CPU seconds of each thread in the window
    raw: str  # py-spy's collapsed stacks

    def read(self) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
        """GIL samples in all, by bucket, and the functions most often on the stack (inclusive)
        and at its top (self)."""
        total, inclusive, own = profiles.function_counts(self.raw)
        buckets: Counter[str] = Counter()
        for frames, n in profiles.stacks(self.raw):
            buckets[bucket(frames)] += n
        return total, buckets.most_common(), inclusive.most_common(30), own.most_common(20)

    def text(self) -> str:
        w = self.window
        batches = w.rows / BATCH
        per_batch = lambda seconds: seconds / batches * 1000 if batches else 0.0  # noqa: E731
        loop = self.threads.get(self.pid, (0.0, 0.0))
        others = [sum(x) for tid, x in self.threads.items() if tid != self.pid]
        user = sum(u for u, _ in self.threads.values())
        system = sum(st for _, st in self.threads.values())
        total, buckets, inclusive, own = self.read()
        # The samples cover the warm-up too: GIL time per batch over the batches of both.
        gil_s = total / PROFILE_RATE
        gil_batches = w.rate * self.loaded_s / BATCH
        gil_ms = gil_s / gil_batches * 1000 if gil_batches else 0.0
        lines = [
            f"gateway profile, one {self.key} window of {w.seconds:g} s: {w.rate:,.0f} records/s, the gateway "
            f"{w.server_cpu / w.seconds:.2f} cores = {per_batch(w.server_cpu):.2f} ms of CPU per {BATCH} records (a produced "
            f"batch; user {per_batch(user):.2f}, system {per_batch(system):.2f}); its event-loop thread "
            f"{sum(loop) / w.seconds:.2f} cores, its {len(others)} other threads (services) {sum(others) / w.seconds:.2f} cores",
            f"a gateway thread held the GIL {gil_s / self.loaded_s:.0%} of the time, {gil_ms:.2f} ms per {BATCH} records "
            f"({total:,} py-spy --gil samples at {PROFILE_RATE}/s over warm-up and window; a holder the kernel has "
            "preempted still holds it, so on a busy machine this exceeds its CPU); the rest of the CPU ran without it "
            "(system calls, libpq, uvloop's I/O)",
            "",
            f"where that GIL time goes (share of samples → ms per {BATCH} records):",
        ]
        for label, n in buckets:
            lines.append(f"  {n / total:6.1%}  {n / total * gil_ms:6.3f} ms  {label}")
        lines += ["", "functions on the GIL holder's stack (inclusive share):"]
        lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive]
        lines += ["", "functions at the top of its stack (self share):"]
        lines += [f"  {n / total:6.1%}  {f}" for f, n in own]
        return "\n".join(lines)


# --- figures --------------------------------------------------------------------------------------


def figures(bench: Bench, two: bool) -> list[report.Row]:
    w = bench.workloads

    def row(key: str, label: str, cells: dict[str, tuple[str, str]], goal: report.Goal) -> report.Row:
        r = report.Row(key, label, "ratio")
        for column, (num, den) in cells.items():
            if w[num].windows and w[den].windows:
                r.cells[column] = ratio_cell(w, num, den, goal)
        return r

    both = lambda num, den: {n: (num.format(n=n), den.format(n=n)) for n in ("1", "8")}  # noqa: E731
    rows = [
        row(
            "wire_idem_raw",
            "wire: idempotent produce ÷ raw append",
            both("idempotent/{n}", "raw_append/{n}"),
            report.Goal(">=", 0.6),
        ),
        row(
            "wire_txn10_raw",
            "wire: transactional, commit every 10 batches ÷ raw append",
            both("txn10/{n}", "raw_append/{n}"),
            report.Goal(">=", 0.6),
        ),
        row(
            "wire_txn10_idem",
            "wire: transactional, commit every 10 batches ÷ idempotent",
            both("txn10/{n}", "idempotent/{n}"),
            report.Goal(">=", 0.9),
        ),
        row(
            "wire_rc_raw",
            "wire: read_committed consume ÷ raw page fetch",
            both("read_committed/{n}", "raw_fetch/{n}"),
            report.Goal(">=", 0.5),
        ),
    ]
    if two:
        rows += [
            row(
                "wire2_idem_raw",
                "wire, 2 gateways: idempotent produce ÷ raw append",
                {"8": ("idempotent/8x2", "raw_append/8x2")},
                report.Goal(">=", 0.6),
            ),
            row(
                "wire2_txn10_raw",
                "wire, 2 gateways: transactional, every 10 batches ÷ raw append",
                {"8": ("txn10/8x2", "raw_append/8x2")},
                report.Goal(">=", 0.6),
            ),
            row(
                "wire2_rc_raw",
                "wire, 2 gateways: read_committed consume ÷ raw page fetch",
                {"8": ("read_committed/8x2", "raw_fetch/8x2")},
                report.Goal(">=", 0.5),
            ),
        ]
    return [r for r in rows if r.cells]


# --- main -----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka", description=__doc__.split("\n\n")[0])
    round_arguments(ap, "3 rounds of 0.8 s windows, one gateway (about a minute)", GROUPS)
    ap.add_argument(
        "--gateways", type=int, choices=(1, 2), help="2: also the 8-lane windows over two gateways (2; 1 with --quick)"
    )
    ap.add_argument("--profile", action="store_true", help="py-spy the gateway through one more idempotent/8 window")
    ap.add_argument("--profile-workload", default="idempotent/8", help="the window --profile samples")
    ap.add_argument("--output", type=Path, default=RESULTS, help="where kafka.json and kafka.png go")
    args = ap.parse_args(argv)
    cfg = Config(**round_settings(ap, args, GROUPS), gateways=args.gateways or (1 if args.quick else 2))
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0


def run(argv: list[str] | None = None) -> str:
    """Set up, run every round, print and write the results; answers the summary line."""
    cfg, args = parse(argv)
    started = time.perf_counter()
    listed = None
    profiled = None
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(bench_database())
        reset(url)
        settings, pg_version = postgres_facts(url)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txlog-bench-kafka-")))
        gateways = [Gateway(url, logs / f"gateway-{i}.log", i) for i in range(cfg.gateways)]
        for g in gateways:
            stack.callback(g.stop)
        gateways[0].start()
        pool = ClientPool(cfg.clients)
        stack.callback(pool.close)
        bench = Bench(cfg, url, gateways, pool)
        print(
            f"txlog kafka (one process), confluent-kafka {profiles.client_version()}, {cfg.clients} client processes, "
            f"{cfg.rounds} rounds of {cfg.warmup:g} s warm-up + {cfg.window:g} s windows; PostgreSQL {pg_version} {settings}",
            flush=True,
        )
        bench.prepare()
        bench.rounds(args.only)
        if args.profile:
            raw = args.output / "kafka-profile.raw"
            args.output.mkdir(parents=True, exist_ok=True)
            prof = bench.profile(args.profile_workload, raw)
            raw.unlink(missing_ok=True)
            if prof is not None:
                profiled = prof.text()
                (args.output / "kafka-profile.txt").write_text(
                    profiled + "\n\ncollapsed stacks (py-spy --gil, raw):\n" + prof.raw
                )
        if cfg.gateways == 2:
            listed = bench.second_gateway()
            print(f"a second gateway (node 1) is up; Metadata lists {listed} broker{'s' if listed != 1 else ''}", flush=True)
            bench.rounds_two(args.only)
        rows = figures(bench, cfg.gateways == 2)
        works = summaries(bench.workloads, lambda key: key.startswith("txn10"))
        others = bench.other_load()
        machine = procs.machine(pg_version)
        elapsed = time.perf_counter() - started

    config = run_config(
        cfg,
        args.only,
        settings,
        elapsed,
        others,
        page_records=PAGE,
        commit_every_batches=COMMIT_EVERY,
        gateway_processes=cfg.gateways,
        brokers_listed_with_two=listed,
        producer=KAFKA_PRODUCER,
        consumer=KAFKA_CONSUMER,
        client=f"confluent-kafka {profiles.client_version()}",
    )
    notes = []
    for key in ("txn10/1", "txn10/8", "txn10/8x2"):
        lat = [ms for x in bench.workloads[key].windows for ms in x.latencies_ms]
        if lat:
            notes.append(
                f"commit_transaction every {COMMIT_EVERY} batches, {key}: p50 {report.percentile(lat, 50):.1f} ms, "
                f"p99 {report.percentile(lat, 99):.1f} ms ({len(lat)} commits)"
            )
    if profiled:
        notes += [
            "",
            profiled.split("\n\nfunctions on")[0],
            f"(the functions and every sample: {args.output / 'kafka-profile.txt'})",
        ]
    return publish(
        args.output,
        "kafka",
        "txlog over Kafka's wire protocol vs baselines",
        rows,
        works,
        machine,
        config,
        others,
        cfg.rounds,
        elapsed,
        goals_key="wire_goals_met",
        extra={"profile": profiled.splitlines()} if profiled else None,
        notes=notes,
    )


if __name__ == "__main__":
    sys.exit(main())
