"""The outbox's added latency: from an application's COMMIT (of a transaction that called
``txlog.send``) to the moment a read_committed consumer sees the record, p50 and p99.

    python -m bench.outbox [--quick] [--apps 1,4] [--rate 100] [--seconds 10] [--workers 1] [--poll-ms 50]

A real ``txlog serve`` (its drainer polling every ``--poll-ms``) on an embedded PostgreSQL (or
``TXLOG_DATABASE_URL``); application threads each commit ``--rate`` transactions a second, every
one inserting an order row and sending one record; a consumer long-polls the partition over HTTP
(read_committed) and notes when each record arrives. Both sides read one monotonic clock. Also
measured: the application's own COMMIT time with and without the ``txlog.send`` in it. Writes
bench/results/outbox.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg

from app.storage.db import libpq_url
from bench.common import bench_database
from bench.http import Server

TOPIC = "outbox-bench"
RESULTS = Path(__file__).resolve().parent / "results" / "outbox.json"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_apps(db_url: str, server_url: str, apps: int, rate: float, seconds: float, with_send: bool) -> dict:
    committed: dict[str, float] = {}
    commit_ms: list[float] = []
    seen: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()
    run_id = f"{apps}-{int(with_send)}-{time.monotonic_ns()}"

    def consumer() -> None:
        with httpx.Client(base_url=server_url, timeout=30) as http:
            offset = http.get(f"/v1/topics/{TOPIC}").json()["partitions"][0]["high_watermark"]
            while not (stop.is_set() and len(seen) >= len(committed)):
                r = http.get(
                    f"/v1/topics/{TOPIC}/partitions/0/records",
                    params={"offset": offset, "isolation_level": "read_committed", "wait_ms": 500, "max_records": 1000},
                ).json()
                now = time.perf_counter()
                for rec in r["records"]:
                    if rec["key"].startswith(run_id):
                        seen.setdefault(rec["key"], now)
                offset = r["next_offset"]

    def application(app: int) -> None:
        interval = 1 / rate
        with psycopg.connect(db_url) as conn:
            i = 0
            next_at = time.perf_counter()
            while not stop.is_set():
                key = f"{run_id}-{app}-{i}"
                conn.execute("INSERT INTO bench_orders (id, body) VALUES (%s, 'x')", (key,))
                if with_send:
                    conn.execute("SELECT txlog.send(%s, %s, %s, NULL, 0)", (TOPIC, key.encode(), b'{"order": "created"}'))
                before = time.perf_counter()
                conn.commit()
                after = time.perf_counter()
                with lock:
                    committed[key] = after
                    commit_ms.append((after - before) * 1000)
                i += 1
                next_at += interval
                time.sleep(max(0.0, next_at - time.perf_counter()))

    reader = threading.Thread(target=consumer, daemon=True) if with_send else None
    if reader:
        reader.start()
        time.sleep(0.5)
    threads = [threading.Thread(target=application, args=(a,), daemon=True) for a in range(apps)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if reader:
        reader.join(timeout=30)
    out = {
        "apps": apps,
        "rate_per_app": rate,
        "transactions": len(committed),
        "with_send": with_send,
        "commit_p50_ms": percentile(commit_ms, 0.5),
        "commit_p99_ms": percentile(commit_ms, 0.99),
    }
    if with_send:
        latencies = [(seen[k] - t) * 1000 for k, t in committed.items() if k in seen]
        out.update(
            visible=len(latencies),
            missing=len(committed) - len(latencies),
            visible_p50_ms=percentile(latencies, 0.5),
            visible_p99_ms=percentile(latencies, 0.99),
            visible_mean_ms=statistics.fmean(latencies),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.outbox", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3-second runs")
    ap.add_argument("--apps", default="1,4", help="concurrent applications, comma-separated runs")
    ap.add_argument("--rate", type=float, default=100.0, help="transactions per second per application")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--poll-ms", type=int, default=None, help="TXLOG_OUTBOX_POLL_INTERVAL_MS (default: the server's)")
    args = ap.parse_args(argv)
    seconds = 3.0 if args.quick else args.seconds
    if args.poll_ms is not None:
        os.environ["TXLOG_OUTBOX_POLL_INTERVAL_MS"] = str(args.poll_ms)
    rows = []
    with bench_database() as url, tempfile.TemporaryDirectory(prefix="txlog-outbox-bench-") as tmp:
        db_url = libpq_url(url)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_orders (id text PRIMARY KEY, body text)")
        server = Server(url, args.workers, Path(tmp) / "server.log")
        server.start()
        try:
            server_url = f"http://{server.target}"
            httpx.post(server_url + "/v1/topics", json={"name": TOPIC, "partitions": 1}, timeout=30)
            for apps in (int(a) for a in args.apps.split(",")):
                for with_send in (False, True):
                    r = run_apps(db_url, server_url, apps, args.rate, seconds, with_send)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
        finally:
            server.stop()
    poll = int(os.environ.get("TXLOG_OUTBOX_POLL_INTERVAL_MS", "50"))
    print(f"\noutbox, drainer polling every {poll} ms, {args.workers} worker(s):")
    print(
        f"{'apps':>5} {'tx/s':>6} {'commit p50/p99 (no send)':>26} {'commit p50/p99 (send)':>23} {'commit→visible p50/p99':>24}"
    )
    for plain, sent in zip(rows[0::2], rows[1::2]):
        print(
            f"{sent['apps']:>5} {sent['transactions'] / seconds:>6.0f} "
            f"{plain['commit_p50_ms']:>12.2f} / {plain['commit_p99_ms']:<8.2f} ms "
            f"{sent['commit_p50_ms']:>9.2f} / {sent['commit_p99_ms']:<8.2f} ms "
            f"{sent['visible_p50_ms']:>10.1f} / {sent['visible_p99_ms']:<7.1f} ms"
            + (f"  ({sent['missing']} not seen)" if sent["missing"] else "")
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"poll_interval_ms": poll, "workers": args.workers, "seconds": seconds, "runs": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
