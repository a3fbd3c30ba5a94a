"""Share groups (KIP-932's queues on the log) against PostgreSQL job queues, in one run.

The method is bench.http's (read its docstring): real servers on a throwaway embedded PostgreSQL
with fsync on (or ``TXLOG_DATABASE_URL``), the load from separate client processes, every figure
the median over rounds of a ratio to a baseline measured in the same round, windows interleaved,
the CPU of the clients, the servers, PostgreSQL and the whole machine beside each figure.

The work compared: take a batch of up to 100 records (or jobs, or messages) out of a queue, each
held for this consumer alone, and mark them done. Values are bench.http's 1 KiB printable values
(txlog's records have their 16-byte keys too); "1" is one consumer, "8" eight, each a thread of a
client process with a connection of its own, all draining one queue.

- *share consume+ack over HTTP*: a member of a share group consuming as a share consumer does,
  one request per batch: each acquisition (``POST /v1/share-groups/{group}/acquire``, max_records
  100, a topic of 8 partitions taken from a random one on) carries the acceptance of the batch
  before it (a range per run acquired), as Kafka's ShareFetch carries acknowledgements — a
  partition both accepted and read is one database transaction — through
  ``txlog serve --workers 2``. Counted: records accepted.
- *share consume+ack over the wire*: confluent-kafka's ``ShareConsumer`` (a preview API of
  confluent-kafka 2.16) in implicit acknowledgement mode (librdkafka's default),
  ``max.poll.records`` 100: each ``poll`` accepts the records of the one before, the acceptances
  riding on the next ShareFetch, through one ``txlog kafka`` gateway. Its consumers join the group
  before the window. A second row, *explicit acks*: each record acknowledged ACCEPT, then
  ``commit_sync`` (ShareAcknowledge, answered before the next poll) — two round trips per batch.
- *PgQueuer dequeue+ack*: bench.http's PgQueuer lane (PyPI ``pgqueuer``, in-process, its schema
  by its installer): ``dequeue`` of 100, then their ack (``log_jobs``, successful).
- *pgmq read+delete*: pgmq's SQL API over psycopg (binary results): ``pgmq.read`` of 100 with a
  visibility timeout of 30 s (a share group's record lock), then ``pgmq.delete`` of their ids. pgmq
  is a PostgreSQL extension; its SQL-only install runs on any PostgreSQL, and the PyPI package
  ``pgmq`` (the Python client, 1.1.4 on; the bench extra) ships that SQL with its installer
  (``pgmq.install.install_pgmq_from_sql``), which sets it up here anew each run. Its messages are
  jsonb: each is the 1 KiB value as a JSON string.

Each queue is topped up before its window (outside it) with enough work for the window at the
rate its windows ran so far, and half again, then vacuumed: PgQueuer's and pgmq's by SQL, txlog's
topics by appending plain records to each partition (each workload has a topic and share group of
its own, so consumed records stay consumed). A share group reads its topic from the earliest
offset (share.auto.offset.reset) and its records are locked for 30 s (the default).

``--profile share_http/8`` (or any workload) runs one more window of it (at least 3 s, not counted)
with py-spy sampling the server that serves it (``txlog serve`` and its workers, or the gateway),
GIL holders only, and prints the functions most often on their stacks and at their tops
(bench/results/share-profile.txt keeps every sample).

    python -m bench.share [--quick] [--rounds N] [--window S] [--only share1,share8] [--profile KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
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
from bench.http import PARTITIONS, RESULTS, Server, install_pgqueuer
from bench.http_lanes import Http
from bench.kafka import Gateway
from bench.kafka_lanes import KAFKA_SHARE_CONSUMER
from bench.lanes import BATCH, Lane
from bench.postgres_lanes import PGMQ_QUEUE, PGMQ_VISIBILITY_S, PGQ_DEQUEUE

# A round: each group's baselines right before the windows compared with them.
GROUPS = {
    "share1": ["pgq_dequeue/1", "pgmq_read/1", "share_http/1", "share_wire/1", "share_wire_explicit/1"],
    "share8": ["pgq_dequeue/8", "pgmq_read/8", "share_http/8", "share_wire/8", "share_wire_explicit/8"],
}
# What a queue holds before its first window: a generous guess at the rate (a queue run dry
# measures nothing), raised by any window that ran faster.
FIRST_RATE = {1: 40_000.0, PARTITIONS: 60_000.0}


def topic_of(key: str) -> str:
    """The topic (and share group) of a share workload: ``share_http/8`` → ``share-http-8``."""
    return key.replace("_", "-").replace("/", "-")


@dataclass(frozen=True)
class Config:
    rounds: int
    window: float
    warmup: float
    clients: int
    quick: bool


def install_pgmq(url: str) -> str:
    """pgmq's SQL-only install, from the SQL the ``pgmq`` package ships, anew; its queue made.
    Answers pgmq's version."""
    from pgmq.install import install_pgmq_from_sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
    with psycopg.connect(url) as conn:  # the installer runs its script in a transaction of its own
        version = install_pgmq_from_sql(conn=conn)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create(%s)", (PGMQ_QUEUE,))
    return version


class Bench(Harness):
    def __init__(self, config: Config, url: str, serve: Server, gateway: Gateway, pool: ClientPool) -> None:
        super().__init__(config, pool, libpq_url(url), lambda: [serve, gateway])
        self.config: Config = config
        self.url = libpq_url(url)
        self.serve, self.gateway = serve, gateway
        self.rates: dict[str, float] = {}
        self.pgmq_version = ""
        self._define()

    # -- set-up ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        started = time.perf_counter()
        client = Http(self.serve.target)
        for key in (k for group in GROUPS.values() for k in group if k.startswith("share_")):
            name = topic_of(key)
            client.call("POST", "/v1/topics", b'{"name":"%s","partitions":%d}' % (name.encode(), PARTITIONS))
            body = orjson.dumps({"configs": {"share.auto.offset.reset": "earliest"}})
            client.call("PATCH", f"/v1/share-groups/{name}/configs", body)
        client.close()
        asyncio.run(install_pgqueuer(self.url))
        self.pgmq_version = install_pgmq(self.url)
        datasets.vacuum(self.url)
        print(
            f"set-up: PgQueuer, pgmq {self.pgmq_version} (SQL-only install from the pgmq package), and "
            f"{sum(k.startswith('share_') for g in GROUPS.values() for k in g)} topics of {PARTITIONS} partitions with a share group each, in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )

    # -- workloads -------------------------------------------------------------------------------
    def _define(self) -> None:
        for n in (1, PARTITIONS):
            self.add(
                f"pgq_dequeue/{n}",
                lambda n=n: [Lane("pgq_dequeue", self.url, partition=i) for i in range(n)],
                before=functools.partial(self._fill, f"pgq_dequeue/{n}", n),
            )
            self.add(
                f"pgmq_read/{n}",
                lambda n=n: [Lane("pgmq_read", self.url, partition=i) for i in range(n)],
                before=functools.partial(self._fill, f"pgmq_read/{n}", n),
            )
            for key, kind, target in (
                (f"share_http/{n}", "share_acquire", lambda: self.serve.target),
                (f"share_wire/{n}", "kafka_share", lambda: self.gateway.target),
                (f"share_wire_explicit/{n}", "kafka_share_explicit", lambda: self.gateway.target),
            ):
                name = topic_of(key)
                self.add(
                    key,
                    lambda n=n, kind=kind, target=target, name=name: [
                        Lane(kind, target(), name, i, group=name) for i in range(n)
                    ],
                    before=functools.partial(self._fill, key, n),
                )

    def _fill(self, key: str, lanes: int) -> None:
        rate = self.rates.get(key, FIRST_RATE[lanes])
        target = datasets.window_target(rate, self.config.warmup + self.config.window, lanes, BATCH)
        if key.startswith("pgq_"):
            datasets.fill_pgqueuer(self.url, PGQ_DEQUEUE, target)
        elif key.startswith("pgmq_"):
            datasets.fill_pgmq(self.url, target)
        else:
            # The wire consumers take their first records before the window, and may fetch ahead.
            datasets.fill_share(self.url, topic_of(key), topic_of(key), PARTITIONS, target + 2 * BATCH * lanes)

    # -- running ---------------------------------------------------------------------------------
    def rounds(self, groups: list[str]) -> None:
        assert sorted(k for g in GROUPS.values() for k in g) == sorted(self.workloads), "every workload in a group"
        prime = [k for g in groups for k in GROUPS[g]]
        self.run_rounds([GROUPS[g] for g in groups], prime, shown=4, on_window=self._seen)

    def profile(self, key: str, raw: Path) -> str | None:
        """One more ``key`` window (at least 3 s, not counted) with py-spy sampling, GIL holders
        only, the server of ``key`` and its subprocesses; answers the profile as text."""
        server = self.gateway if key.startswith("share_wire") else self.serve
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        window = max(self.config.window, 3.0)
        cmd = [spy, "record", "--pid", str(server.pgid), "--subprocesses", "--gil", "--nonblocking", "--rate", "250"]
        cmd += ["--duration", str(round(self.config.warmup + window + 6)), "--format", "raw", "--output", str(raw)]
        spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # attached to every process
        result = self.run_window(self.workloads[key], window=window)
        _, err = spy_proc.communicate(timeout=120)
        if spy_proc.returncode != 0 or not raw.exists():
            print(f"py-spy failed ({spy_proc.returncode}): {err.decode(errors='replace')[-500:]}", file=sys.stderr)
            return None
        return profile_text(key, result, raw.read_text())

    def _seen(self, key: str, result: Window) -> None:
        self.rates[key] = max(result.rate, self.rates.get(key, 0.0))


def profile_text(key: str, window: Window, collapsed: str) -> str:
    """py-spy's collapsed stacks as the share of samples each function is on (inclusive) and at the
    top of (self), over every process sampled."""
    total, inclusive, own = profiles.function_counts(collapsed)
    per_batch = window.server_cpu / (window.rows / BATCH) * 1000 if window.rows else 0.0
    lines = [
        f"server profile, one {key} window of {window.seconds:g} s: {window.rate:,.0f} records/s, the server "
        f"{window.server_cpu / window.seconds:.2f} cores = {per_batch:.2f} ms of CPU per {BATCH} records, PostgreSQL "
        f"{(window.postgres_cpu or 0.0) / window.seconds:.2f} cores; {total:,} py-spy --gil samples (warm-up included)",
        "",
        "functions on a GIL holder's stack (inclusive share):",
    ]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in inclusive.most_common(40)]
    lines += ["", "functions at the top of its stack (self share):"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(25)]
    return "\n".join(lines)


# --- figures --------------------------------------------------------------------------------------


def figures(bench: Bench) -> list[report.Row]:
    w = bench.workloads

    def row(key: str, label: str, num: str, den: str, goal: report.Goal) -> report.Row:
        r = report.Row(key, label, "ratio")
        for n in ("1", "8"):
            a, b = num.format(n=n), den.format(n=n)
            if w[a].windows and w[b].windows:
                r.cells[n] = ratio_cell(w, a, b, goal)
        return r

    keep_pace = report.Goal(">=", 1.0)
    rows = [
        row("share_http_pgq", "share consume+ack (HTTP) ÷ PgQueuer dequeue+ack", "share_http/{n}", "pgq_dequeue/{n}", keep_pace),
        row("share_http_pgmq", "share consume+ack (HTTP) ÷ pgmq read+delete", "share_http/{n}", "pgmq_read/{n}", keep_pace),
        row("share_wire_pgq", "wire: share consume+ack ÷ PgQueuer dequeue+ack", "share_wire/{n}", "pgq_dequeue/{n}", keep_pace),
        row("share_wire_pgmq", "wire: share consume+ack ÷ pgmq read+delete", "share_wire/{n}", "pgmq_read/{n}", keep_pace),
        row(
            "share_wire_explicit_pgmq",
            "wire, explicit acks (ShareAcknowledge) ÷ pgmq read+delete",
            "share_wire_explicit/{n}",
            "pgmq_read/{n}",
            keep_pace,
        ),
    ]
    return [r for r in rows if r.cells]


# --- main -----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m bench.share", description=__doc__.split("\n\n")[0])
    round_arguments(ap, "3 rounds of 0.8 s windows (about two minutes with set-up)", GROUPS)
    ap.add_argument("--output", type=Path, default=RESULTS, help="where share.json and share.png go")
    ap.add_argument("--profile", metavar="KEY", help="py-spy the server through one more window of KEY (e.g. share_http/8)")
    args = ap.parse_args(argv)
    return Config(**round_settings(ap, args, GROUPS)), args


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
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txlog-bench-share-")))
        serve, gateway = Server(url, 2, logs / "serve.log"), Gateway(url, logs / "gateway.log", 0)
        servers: list[ServerProcess] = [serve, gateway]
        for server in servers:
            stack.callback(server.stop)
            server.start()
        pool = ClientPool(cfg.clients)
        stack.callback(pool.close)
        bench = Bench(cfg, url, serve, gateway, pool)
        print(
            f"txlog serve --workers 2 and txlog kafka, confluent-kafka {profiles.client_version()}, {cfg.clients} client "
            f"processes, {cfg.rounds} rounds of {cfg.warmup:g} s warm-up + {cfg.window:g} s windows; PostgreSQL "
            f"{pg_version} {settings}",
            flush=True,
        )
        bench.prepare()
        bench.rounds(args.only)
        profiled = None
        if args.profile:
            args.output.mkdir(parents=True, exist_ok=True)
            raw = args.output / "share-profile.raw"
            profiled = bench.profile(args.profile, raw)
            if profiled:
                (args.output / "share-profile.txt").write_text(
                    profiled + "\n\ncollapsed stacks (py-spy --gil, raw):\n" + raw.read_text()
                )
            raw.unlink(missing_ok=True)
        rows = figures(bench)
        works = summaries(bench.workloads)
        others = bench.other_load()
        machine = procs.machine(pg_version)
        elapsed = time.perf_counter() - started

    config = run_config(
        cfg,
        args.only,
        settings,
        elapsed,
        others,
        partitions=PARTITIONS,
        server_workers=2,
        share_consumer=KAFKA_SHARE_CONSUMER,
        pgmq=bench.pgmq_version,
        pgmq_visibility_s=PGMQ_VISIBILITY_S,
        client=f"confluent-kafka {profiles.client_version()}",
    )
    return publish(
        args.output,
        "share",
        "txlog share groups vs PostgreSQL queues",
        rows,
        works,
        machine,
        config,
        others,
        cfg.rounds,
        elapsed,
        goals_key="share_goals_met",
        who="consumer",
        notes=["", profiled] if profiled else (),
    )


if __name__ == "__main__":
    sys.exit(main())
