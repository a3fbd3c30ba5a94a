"""Load generators, run in client processes of their own (multiprocessing, spawn) so that the
process timing the benchmark never shares a GIL with the load.

A *lane* is one producer or reader (``bench.lanes``): one thread, one keep-alive connection, one
partition; the HTTP API's lanes are ``bench.http_lanes``, the Kafka wire's ``bench.kafka_lanes``,
PostgreSQL's own and its queues' ``bench.postgres_lanes``. A client process runs the lanes it is
given in threads for one window: it sets them up (connections, InitProducerId) before the window
starts, runs them through a warm-up and the measured window, and answers what they completed inside
the window and its own CPU time during it (getrusage).
"""

from __future__ import annotations

import resource
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

from bench.http_lanes import FetchRunner, ProduceRunner, ShareAcquireRunner
from bench.kafka_lanes import (
    KafkaFetchRunner,
    KafkaLatencyRunner,
    KafkaProduceRunner,
    KafkaShareExplicitRunner,
    KafkaShareRunner,
    KafkaSpreadFetchRunner,
    KafkaSpreadProduceRunner,
)
from bench.lanes import Lane, LaneResult, Runner
from bench.postgres_lanes import PgmqRunner, PgqRunner, RawAppendRunner, RawFetchRunner


@dataclass
class ClientResult:
    lanes: list[LaneResult]
    cpu_s: float  # the client process's CPU time inside the window


_RUNNERS: dict[str, Callable[[Lane], Runner]] = {
    "produce": ProduceRunner,
    "fetch": FetchRunner,
    "raw_append": RawAppendRunner,
    "raw_fetch": RawFetchRunner,
    "pgq_enqueue": PgqRunner,
    "pgq_dequeue": PgqRunner,
    "pgmq_read": PgmqRunner,
    "share_acquire": ShareAcquireRunner,
    "kafka_share": KafkaShareRunner,
    "kafka_share_explicit": KafkaShareExplicitRunner,
    "kafka_produce": KafkaProduceRunner,
    "kafka_fetch": KafkaFetchRunner,
    "kafka_spread_produce": KafkaSpreadProduceRunner,
    "kafka_spread_fetch": KafkaSpreadFetchRunner,
    "kafka_latency": KafkaLatencyRunner,
}


# --- the client process ---------------------------------------------------------------------------


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _drive(runner: Runner, start: float, warm: float, end: float, out: LaneResult) -> None:
    try:
        _sleep_until(start)
        while time.monotonic() < end:
            n = runner.step()
            done = time.monotonic()
            if warm <= done <= end:
                out.rows += n
    except Exception:
        out.error = traceback.format_exc()
    finally:
        try:
            runner.close()
        except Exception:
            out.error = out.error or traceback.format_exc()
    out.latencies_ms = [ms for at, ms in runner.latencies if warm <= at <= end]
    out.acked_ms = [ms for at, ms in getattr(runner, "acks", ()) if warm <= at <= end]
    out.offset = runner.offset
    out.empty = runner.empty


def client_main(conn: Connection) -> None:
    """A client process: ``(lanes, warmup, window)`` → sets up and answers ``ready`` (or an error)
    → ``start`` (a time.monotonic() instant, the same clock in every process; ``None`` calls the
    window off) → runs → answers a ClientResult. ``None`` instead of lanes ends the process."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        lanes, warmup, window = msg
        runners: list[Runner] = []
        try:
            for lane in lanes:
                runners.append(_RUNNERS[lane.kind](lane))
        except Exception:
            for r in runners:
                r.close()
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ready", None))
        start = conn.recv()
        if start is None:  # another client's set-up failed: the window is called off
            for r in runners:
                r.close()
            continue
        warm, end = start + warmup, start + warmup + window
        results = [LaneResult() for _ in runners]
        threads = [
            threading.Thread(target=_drive, args=(r, start, warm, end, out), daemon=True) for r, out in zip(runners, results)
        ]
        for t in threads:
            t.start()
        _sleep_until(warm)
        cpu0 = _cpu_seconds()
        _sleep_until(end)
        cpu1 = _cpu_seconds()
        for t in threads:
            t.join()
        conn.send(("done", ClientResult(results, cpu1 - cpu0)))


class ClientPool:
    """Client processes started once (spawn) and given lanes window after window."""

    def __init__(self, processes: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._pipes: list[Connection] = []
        self._procs = []
        for i in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=client_main, args=(child,), name=f"bench-client-{i}", daemon=True)
            proc.start()
            child.close()
            self._pipes.append(parent)
            self._procs.append(proc)

    @property
    def size(self) -> int:
        return len(self._procs)

    def run(
        self, assignment: list[list[Lane]], warmup: float, window: float, sample: Callable[[], Any]
    ) -> tuple[list[tuple[list[Lane], ClientResult]], Any, Any]:
        """Run a window: process i drives ``assignment[i]``. Answers each busy process's lanes with
        its result, and the readings ``sample`` took here at the start and at the end of the
        measured window (server and database CPU)."""
        busy = [(pipe, lanes) for pipe, lanes in zip(self._pipes, assignment) if lanes]
        for pipe, lanes in busy:
            pipe.send((lanes, warmup, window))
        answers = [(pipe, pipe.recv()) for pipe, _ in busy]
        failures = [detail for _, (status, detail) in answers if status != "ready"]
        start = time.monotonic() + 0.05
        for pipe, (status, _) in answers:
            if status == "ready":
                pipe.send(None if failures else start)
        if failures:
            raise RuntimeError("client set-up failed:\n" + failures[0])
        _sleep_until(start + warmup)
        first = sample()
        _sleep_until(start + warmup + window)
        last = sample()
        results = [(lanes, pipe.recv()[1]) for pipe, lanes in busy]
        errors = [lane.error for _, r in results for lane in r.lanes if lane.error]
        if errors:
            raise RuntimeError("client error:\n" + errors[0])
        return results, first, last

    def close(self) -> None:
        for pipe in self._pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
