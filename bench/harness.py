"""What the benchmarks of a running txlog share (bench.http, bench.kafka).

- ``ServerProcess``: a txlog command in a session of its own, so that its process group is every
  process it starts, whose CPU time ``procs.group_cpu`` reads.
- ``Harness``: workloads of lanes run by the client pool one window at a time, with the CPU of
  the clients, the servers, PostgreSQL and the whole machine read around the measured window;
  rounds of interleaved windows.
- ``ratio_cell`` and ``summaries``: a figure as the median over rounds of the ratio within each
  round, and each workload's throughput and CPU per 1000 rows.
- ``postgres_facts``, ``run_config`` and ``publish``: how every run begins and ends — the
  PostgreSQL settings it measured under, the configuration its JSON keeps, the report and chart
  written and the tables printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import psycopg

from app.storage.db import libpq_url
from bench import procs, report
from bench.clients import ClientPool
from bench.lanes import BATCH, KEY_BYTES, VALUE_BYTES, Lane, LaneResult

ROOT = Path(__file__).resolve().parent.parent


def round_arguments(ap: argparse.ArgumentParser, quick_help: str, groups: Sequence[str]) -> None:
    """The options every benchmark takes: rounds and windows, client processes, groups of windows."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--rounds", type=int, help="rounds (5; 3 with --quick)")
    ap.add_argument("--window", type=float, help="measured seconds per window (3; 0.8 with --quick)")
    ap.add_argument("--warmup", type=float, help="seconds before each window (0.5; 0.2 with --quick)")
    ap.add_argument("--clients", type=int, default=4, help="client processes (8 producers are spread over them)")
    ap.add_argument("--only", default=",".join(groups), help=f"groups of windows to run (of {','.join(groups)})")


def round_settings(ap: argparse.ArgumentParser, args: argparse.Namespace, groups: Sequence[str]) -> dict[str, Any]:
    """``args.only`` as a list of known groups, and the rounds, windows and clients they set."""
    args.only = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = set(args.only) - set(groups)
    if unknown:
        ap.error(f"unknown groups {sorted(unknown)}; choose from {','.join(groups)}")
    return {
        "rounds": args.rounds or (3 if args.quick else 5),
        "window": args.window or (0.8 if args.quick else 3.0),
        "warmup": args.warmup if args.warmup is not None else (0.2 if args.quick else 0.5),
        "clients": args.clients,
        "quick": args.quick,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m app.cli <args>`` on ``url``'s database, in a session of its own (its process
    group is the command and any workers it starts); ``ready`` says when it serves."""

    name = "txlog"

    def __init__(self, url: str, log: Path) -> None:
        self.url, self.log = url, log
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pgid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def args(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 90) -> None:
        env = {**os.environ, "TXLOG_DATABASE_URL": self.url}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", *self.args()],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


# --- windows --------------------------------------------------------------------------------------


@dataclass
class Window:
    rows: int
    seconds: float
    client_cpu: float
    busiest_client_cpu: float
    server_cpu: float
    postgres_cpu: float | None
    latencies_ms: list[float]
    empty: int
    machine_busy: float  # cores busy on the whole machine, on average
    machine_iowait: float  # cores idle waiting for I/O, on average
    acked_ms: list[float] = field(default_factory=list)  # kafka_latency: produce → acknowledged

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


@dataclass
class Workload:
    key: str
    lanes: Callable[[], list[Lane]]
    before: Callable[[], None] | None = None  # outside the window
    after: Callable[[list[tuple[Lane, LaneResult]]], None] | None = None
    windows: list[Window] = field(default_factory=list)


class Timing(Protocol):
    rounds: int
    window: float
    warmup: float


class Harness:
    """Workloads by key, run window after window by ``pool``; ``servers`` are the processes whose
    CPU counts as the server's (read when a window runs: servers may come and go)."""

    def __init__(self, config: Timing, pool: ClientPool, database_url: str, servers: Callable[[], list[ServerProcess]]) -> None:
        self.config = config
        self.pool = pool
        self.servers = servers
        with psycopg.connect(database_url) as conn:  # a local PostgreSQL: its postmaster, for its CPU time
            self.postmaster = procs.postmaster_of(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        self.workloads: dict[str, Workload] = {}

    def add(
        self,
        key: str,
        lanes: Callable[[], list[Lane]],
        before: Callable[[], None] | None = None,
        after: Callable[[list[tuple[Lane, LaneResult]]], None] | None = None,
    ) -> None:
        self.workloads[key] = Workload(key, lanes, before, after)

    def _sample(self) -> tuple[float, float, float | None, tuple[float, float, float]]:
        return (
            time.monotonic(),
            procs.group_cpu([s.pgid for s in self.servers()]),
            procs.postgres_cpu(self.postmaster),
            procs.machine_cpu(),
        )

    def run_window(self, workload: Workload, warmup: float | None = None, window: float | None = None) -> Window:
        warmup = self.config.warmup if warmup is None else warmup
        window = self.config.window if window is None else window
        if workload.before:
            workload.before()
        lanes = workload.lanes()
        assignment: list[list[Lane]] = [[] for _ in range(self.pool.size)]
        for i, lane in enumerate(lanes):
            assignment[i % self.pool.size].append(lane)
        results, first, last = self.pool.run(assignment, warmup, window, self._sample)
        done = [(lane, res) for ls, r in results for lane, res in zip(ls, r.lanes)]
        cores, total = os.cpu_count() or 1, last[3][2] - first[3][2]
        if workload.after:
            workload.after(done)
        return Window(
            rows=sum(res.rows for _, res in done),
            seconds=window,
            client_cpu=sum(r.cpu_s for _, r in results),
            busiest_client_cpu=max(r.cpu_s for _, r in results),
            server_cpu=last[1] - first[1],
            postgres_cpu=None if first[2] is None or last[2] is None else last[2] - first[2],
            latencies_ms=[ms for _, res in done for ms in res.latencies_ms],
            empty=sum(res.empty for _, res in done),
            machine_busy=cores * (last[3][0] - first[3][0]) / total if total else 0.0,
            machine_iowait=cores * (last[3][1] - first[3][1]) / total if total else 0.0,
            acked_ms=[ms for _, res in done for ms in res.acked_ms],
        )

    def run_rounds(
        self, order: list[list[str]], prime: list[str], shown: int = 3, on_window: Callable[[str, Window], None] | None = None
    ) -> None:
        """``prime`` runs short unmeasured windows first (connection pools, caches, prepared
        statements); then each round runs every group's windows in order. A line per round shows
        the first ``shown`` workloads of each group."""
        for key in prime:
            self.run_window(self.workloads[key], warmup=0.0, window=0.3)
        for r in range(self.config.rounds):
            started = time.perf_counter()
            for group in order:
                for key in group:
                    result = self.run_window(self.workloads[key])
                    self.workloads[key].windows.append(result)
                    if on_window:
                        on_window(key, result)
            line = "  ".join(f"{k}={self.workloads[k].windows[-1].rate:,.0f}" for g in order for k in g[:shown])
            print(f"round {r + 1}/{self.config.rounds} ({time.perf_counter() - started:.0f} s): rows/s {line}", flush=True)

    def other_load(self) -> list[float]:
        """Per window: the cores kept busy by anything but the clients, the servers and PostgreSQL."""
        return [
            x.machine_busy - (x.client_cpu + x.server_cpu + (x.postgres_cpu or 0.0)) / x.seconds
            for w in self.workloads.values()
            for x in w.windows
        ]


# --- figures --------------------------------------------------------------------------------------


def ratio_cell(workloads: dict[str, Workload], num: str, den: str, goal: report.Goal) -> report.Cell:
    a, b = workloads[num].windows, workloads[den].windows
    rounds = [x.rate / y.rate for x, y in zip(a, b) if y.rows]
    cpu = [w.client_cpu / w.rows * 1000 for w in a if w.rows]
    return report.Cell(report.median(rounds), rounds, goal, report.median(cpu))


def latency_cells(workloads: dict[str, Workload], key: str, p50_goal: float, p99_goal: float) -> dict[str, report.Cell]:
    lat = [ms for w in workloads[key].windows for ms in w.latencies_ms]
    per_round = [w.latencies_ms for w in workloads[key].windows]
    return {
        "p50": report.Cell(
            report.percentile(lat, 50), [report.percentile(x, 50) or 0.0 for x in per_round], report.Goal("<=", p50_goal), None
        ),
        "p99": report.Cell(
            report.percentile(lat, 99), [report.percentile(x, 99) or 0.0 for x in per_round], report.Goal("<=", p99_goal), None
        ),
    }


def summaries(
    workloads: dict[str, Workload], with_latencies: Callable[[str], bool] = lambda key: False
) -> list[report.WorkloadSummary]:
    """Each workload's medians over its windows; ``with_latencies`` names the workloads whose
    latencies (EndTxn, a transaction's commit) are kept."""
    out = []
    for w in workloads.values():
        ws = [x for x in w.windows if x.rows]
        if not ws:
            continue

        def per_krow(f: Callable[[Window], float | None]) -> float | None:
            vals = [f(x) for x in ws]
            return None if any(v is None for v in vals) else report.median([v / x.rows * 1000 for v, x in zip(vals, ws)])  # type: ignore[operator]

        out.append(
            report.WorkloadSummary(
                key=w.key,
                windows=len(ws),
                rows_per_s=report.median([x.rate for x in ws]) or 0.0,
                client_cpu_per_krow=per_krow(lambda x: x.client_cpu) or 0.0,
                server_cpu_per_krow=per_krow(lambda x: x.server_cpu) or 0.0,
                postgres_cpu_per_krow=per_krow(lambda x: x.postgres_cpu),
                busiest_client_core=max(x.busiest_client_cpu / x.seconds for x in ws),
                busy_cores=report.median([(x.client_cpu + x.server_cpu + (x.postgres_cpu or 0.0)) / x.seconds for x in ws])
                or 0.0,
                machine_busy_cores=report.median([x.machine_busy for x in ws]) or 0.0,
                machine_iowait_cores=report.median([x.machine_iowait for x in ws]) or 0.0,
                rows_per_s_rounds=[x.rate for x in w.windows],
                endtxn_ms=[ms for x in ws for ms in x.latencies_ms] if with_latencies(w.key) else [],
                empty_dequeues=sum(x.empty for x in w.windows),
            )
        )
    return out


def describe_other_load(others: list[float]) -> str:
    typical = report.median(others) or 0.0
    shared = " — the machine was shared: expect noisier figures" if typical > 0.3 else ""
    return f"other processes and the kernel kept {typical:.2f} cores busy during the windows (at most {max(others):.2f}){shared}"


# --- a run's beginning and end ------------------------------------------------------------------------


def postgres_facts(url: str) -> tuple[dict[str, str], str]:
    """The settings the figures depend on (fsync, synchronous_commit, shared_buffers) and the server's
    version; warns when writes are not durable."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        settings = {k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "shared_buffers")}  # type: ignore[index]
        pg_version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    if settings["fsync"] != "on" or settings["synchronous_commit"] != "on":
        print(f"warning: PostgreSQL runs with {settings}: figures are not for durable writes", file=sys.stderr)
    return settings, pg_version


def run_config(
    cfg: Any, groups: list[str], settings: dict[str, str], elapsed: float, others: list[float], **own: Any
) -> dict[str, Any]:
    """The configuration a run's JSON keeps: the run's options (``cfg``, a dataclass) and groups, the
    records' shape, the benchmark's ``own`` facts, then PostgreSQL's settings, the time taken and the
    load of other processes."""
    return {
        **cfg.__dict__,
        "groups": groups,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "batch_records": BATCH,
        "value_bytes": VALUE_BYTES,
        "key_bytes": KEY_BYTES,
        **own,
        "postgres": settings,
        "elapsed_s": round(elapsed, 1),
        "other_load_cores_median": report.median(others),
        "other_load_cores_max": max(others, default=None),
        "external_database": bool(os.environ.get("TXLOG_DATABASE_URL")),
    }


def publish(
    output: Path,
    name: str,
    what: str,
    rows: list[report.Row],
    works: list[report.WorkloadSummary],
    machine: dict[str, object],
    config: dict[str, Any],
    others: list[float],
    rounds: int,
    elapsed: float,
    *,
    goals_key: str = "goals_met",
    who: str = "producer",
    extra: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Writes ``output``/``name``.json (with ``extra`` beside the rest) and ``name``.png, its title
    ``what`` and the machine; prints the workloads, the other load, ``notes``, the figures and the
    summary line, which it answers (``goals_key`` names its count of goals met)."""
    summary = report.summary_line(rows, goals_key=goals_key)
    title = (
        f"{what} — {machine['cores']} cores, PostgreSQL {machine['postgresql']}, "
        f"commit {str(machine['txlog_commit'])[:10]}{'+' if machine['txlog_worktree_modified'] else ''}"
    )
    output.mkdir(parents=True, exist_ok=True)
    doc = report.to_json(rows, works, machine, config, summary)
    doc.update(extra or {})
    report.write_json(output / f"{name}.json", doc)
    report.chart(output / f"{name}.png", rows, title, who=who)
    print()
    print(report.workload_table(works))
    if others:
        print(describe_other_load(others))
    for line in notes:
        print(line)
    print()
    print(report.table(rows, who=who))
    print(f"\n{rounds} rounds, {elapsed:.0f} s; wrote {output / f'{name}.json'} and {output / f'{name}.png'}")
    print("summary: " + summary, flush=True)
    return summary
